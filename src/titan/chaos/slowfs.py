"""A FUSE passthrough whose ``fsync`` sleeps: a real slow disk for checkpoint drills.

``python -m titan.chaos.slowfs BACKING MOUNT CONTROL`` mirrors ``BACKING`` on ``MOUNT``;
every ``fsync``/``fsyncdir`` first sleeps the seconds written in the file ``CONTROL`` (read
each time, so a drill turns the delay on and off while the job runs). Needs ``/dev/fuse``,
Debian ``fuse3`` and PyPI ``mfusepy``; unmount with ``fusermount3 -u MOUNT``.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from typing import Any

import mfusepy as fuse

__all__ = ["SlowFsync", "main"]


class SlowFsync(fuse.Operations):  # type: ignore[misc]
    """Passthrough of ``root``; fsync delayed by the number in ``control``."""

    def __init__(self, root: str, control: str) -> None:
        self.root, self.control = root, control

    def _p(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    def _delay(self) -> None:
        try:
            s = float(open(self.control).read().strip() or 0)
        except (OSError, ValueError):
            s = 0.0
        if s > 0:
            time.sleep(s)

    def _call(self, fn: Any, *a: Any) -> Any:
        try:
            return fn(*a)
        except OSError as e:
            raise fuse.FuseOSError(e.errno or errno.EIO) from None

    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        st = self._call(os.lstat, self._p(path))
        return {k: getattr(st, k) for k in ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink",
                                            "st_size", "st_uid", "st_blocks")}

    def readdir(self, path: str, fh: Any) -> list[str]:
        return [".", "..", *self._call(os.listdir, self._p(path))]

    def mkdir(self, path: str, mode: int) -> None:
        self._call(os.mkdir, self._p(path), mode)

    def rmdir(self, path: str) -> None:
        self._call(os.rmdir, self._p(path))

    def unlink(self, path: str) -> None:
        self._call(os.unlink, self._p(path))

    def rename(self, old: str, new: str) -> None:
        self._call(os.rename, self._p(old), self._p(new))

    def symlink(self, target: str, source: str) -> None:
        self._call(os.symlink, source, self._p(target))

    def readlink(self, path: str) -> str:
        return self._call(os.readlink, self._p(path))

    def link(self, target: str, source: str) -> None:
        self._call(os.link, self._p(source), self._p(target))

    def chmod(self, path: str, mode: int) -> None:
        self._call(os.chmod, self._p(path), mode)

    def chown(self, path: str, uid: int, gid: int) -> None:
        self._call(os.chown, self._p(path), uid, gid)

    def utimens(self, path: str, times: Any = None) -> None:
        self._call(os.utime, self._p(path), times)

    def truncate(self, path: str, length: int, fh: Any = None) -> None:
        self._call(os.truncate, self._p(path), length)

    def statfs(self, path: str) -> dict[str, Any]:
        st = os.statvfs(self._p(path))
        return {k: getattr(st, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree",
                                            "f_files", "f_flag", "f_frsize", "f_namemax")}

    def open(self, path: str, flags: int) -> int:
        return self._call(os.open, self._p(path), flags)

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        return self._call(os.open, self._p(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return self._call(os.pread, fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        return self._call(os.pwrite, fh, data, offset)

    def flush(self, path: str, fh: int) -> None:
        return None

    def release(self, path: str, fh: int) -> None:
        self._call(os.close, fh)

    def fsync(self, path: str, datasync: int, fh: int) -> None:
        self._delay()
        self._call(os.fsync, fh)

    def fsyncdir(self, path: str, datasync: int, fh: int) -> None:
        self._delay()


def main(argv: list[str] | None = None) -> int:
    root, mount, control = (argv or sys.argv[1:])[:3]
    fuse.FUSE(SlowFsync(os.path.abspath(root), os.path.abspath(control)), mount, foreground=True,
              nothreads=False, allow_other=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
