"""A full disk under the run directory: keep room to finish the run's record, and say so.

``titan run`` writes ``run.json`` and ``launcher.finished`` last; on a full disk those
writes fail and the run directory would say "running" forever. :class:`Reserve` holds a
small preallocated file (``.titan-reserve``, 1 MiB) in the run directory for the whole
launch and frees it just before the final writes, so they fit even when workers filled the
disk. :func:`disk_state` reads the free space once (``statvfs``) for the final line.

Cost: one ``posix_fallocate`` at the start, one ``unlink`` and one ``statvfs`` at the end.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from pathlib import Path
from typing import Any

__all__ = ["Reserve", "disk_state", "is_disk_full", "FULL_BELOW_BYTES"]

log = logging.getLogger(__name__)

RESERVE_NAME = ".titan-reserve"
RESERVE_BYTES = 1 << 20
#: Below this much free space the file system counts as full.
FULL_BELOW_BYTES = 1 << 20


class Reserve:
    """Preallocated space in ``run_dir``; :meth:`release` frees it (idempotent, never raises)."""

    def __init__(self, run_dir: Path, size: int = RESERVE_BYTES) -> None:
        self.path = Path(run_dir) / RESERVE_NAME
        self.held = False
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.posix_fallocate(fd, 0, size)
                self.held = True
            finally:
                os.close(fd)
        except OSError as e:  # already full, or a file system without fallocate: go on without
            log.debug("no space reserve in %s: %s", run_dir, e)
            with contextlib.suppress(OSError):
                self.path.unlink()

    def release(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()
        self.held = False


def disk_state(path: Path) -> dict[str, Any]:
    """``{"path", "free_bytes", "total_bytes", "full"}`` of the file system holding ``path``."""
    try:
        st = os.statvfs(path)
    except OSError as e:
        return {"path": str(path), "error": e.strerror or str(e), "full": False}
    free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    return {"path": str(path), "free_bytes": free, "total_bytes": total, "full": free < FULL_BELOW_BYTES}


def is_disk_full(exc: BaseException) -> bool:
    """True for ENOSPC / EDQUOT (a quota is a full disk to the writer)."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
