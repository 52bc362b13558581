"""A full disk under the run directory: keep room to finish the run's record, and say so.

``titan run`` writes ``run.json`` and ``launcher.finished`` last; on a full disk those
writes fail and the run directory would say "running" forever. :class:`Reserve` holds a
small preallocated file (``.titan-reserve``, 1 MiB) in the run directory for the whole
launch and frees it just before the final writes, so they fit even when workers filled the
disk. :func:`disk_state` reads the free space once (``statvfs``) for the final line.

A disk that was full for a while and then freed (a failed save removes its partial files,
retention deletes an old checkpoint) is full no longer at the end; :class:`DiskWatch` samples
the free space every ``interval_s`` for the whole launch and keeps the lowest value and when
it first fell below :data:`FULL_BELOW_BYTES`, so the final line says the disk went full.

Cost: one ``posix_fallocate`` at the start, one ``unlink`` and one ``statvfs`` at the end;
one ``statvfs`` (microseconds) every half second on a launcher thread.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["Reserve", "DiskWatch", "disk_state", "is_disk_full", "FULL_BELOW_BYTES"]

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


class DiskWatch:
    """The lowest free space of ``path``'s file system while the watch runs (a context manager).

    :meth:`merge` adds what it saw to a :func:`disk_state` result: ``full`` becomes true when
    the disk went full at any time (``full_at_end`` keeps the last reading), with
    ``lowest_free_bytes`` and ``full_since`` (epoch seconds of the first full reading).
    """

    def __init__(self, path: Path, interval_s: float = 0.5) -> None:
        self.path = Path(path)
        self.interval_s = float(interval_s)
        self.lowest: int | None = None
        self.full_since: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        """One reading (also called by the thread); an unreadable path is skipped."""
        try:
            st = os.statvfs(self.path)
        except OSError:
            return
        free = st.f_bavail * st.f_frsize
        if self.lowest is None or free < self.lowest:
            self.lowest = free
        if free < FULL_BELOW_BYTES and self.full_since is None:
            self.full_since = time.time()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> "DiskWatch":
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="titan-diskwatch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def merge(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` (from :func:`disk_state`) with what the watch saw during the run."""
        out = dict(state)
        out["full_at_end"] = bool(state.get("full"))
        if self.lowest is not None:
            out["lowest_free_bytes"] = self.lowest
        if self.full_since is not None:
            out["full"] = True
            out["full_since"] = round(self.full_since, 3)
        return out


def is_disk_full(exc: BaseException) -> bool:
    """True for ENOSPC / EDQUOT (a quota is a full disk to the writer)."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)
