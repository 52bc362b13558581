"""The commit protocol's last steps, retention, quarantine and failure classification.

Run by the coordinator (rank 0) only, after every rank's files, the ``.metadata`` and the
manifest are durable inside ``step-N.partial/``: rename to ``step-N/``, fsync the root,
replace ``latest`` (temp name, fsync, ``os.replace``), fsync the root again. A crash
anywhere leaves either the old ``latest`` (the new directory is then a partial or an
unreferenced but complete checkpoint) or the new one — never a torn one.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from pathlib import Path

from titan.checkpoint import inject
from titan.checkpoint.manifest import LATEST, MANIFEST, fsync_dir, list_committed, step_dir_name

__all__ = ["ReplicationFailed", "partial_dir", "commit", "write_latest", "prune", "remove_committed", "quarantine", "clean_partials",
           "classify_failure", "DELETING_PREFIX"]

log = logging.getLogger(__name__)


class ReplicationFailed(RuntimeError):
    """A node-local save could not be made safe: a buddy copy (or a node's local commit)
    was not acknowledged on every rank (``titan.checkpoint.nodelocal``)."""


def partial_dir(root: Path, step: int) -> Path:
    return root / f"{step_dir_name(step)}.partial"


def write_latest(root: Path, name: str, *, fsync: bool = True) -> None:
    """Atomically point ``latest`` at ``name``."""
    inject.point("latest")
    tmp = root / f".{LATEST}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, (name + "\n").encode())
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, root / LATEST)
    if fsync:
        fsync_dir(root)
    inject.point("latest_written")


def commit(root: Path, step: int, *, fsync: bool = True) -> Path:
    """Rename ``step-N.partial`` to ``step-N`` and update ``latest``; returns the final path.

    Raises ``OSError`` (the partial directory is left for ``clean_partials``) or
    ``RuntimeError`` if the partial directory has no manifest.
    """
    src = partial_dir(root, step)
    if not (src / MANIFEST).is_file():
        raise RuntimeError(f"{src.name} has no manifest; refusing to commit it")
    dst = root / step_dir_name(step)
    if dst.exists():  # an earlier save of the same step (e.g. a replayed step); keep one
        remove_committed(dst, fsync=fsync)
    inject.point("rename")
    os.rename(src, dst)
    if fsync:
        fsync_dir(root)
    inject.point("renamed")
    write_latest(root, dst.name, fsync=fsync)
    return dst


def prune(root: Path, keep_last: int, keep_every: int) -> list[Path]:
    """Delete committed checkpoints beyond the newest ``keep_last`` except multiples of
    ``keep_every``; never the one ``latest`` names. Returns what was deleted."""
    from titan.checkpoint.manifest import read_latest

    committed = list_committed(root)
    latest = read_latest(root)
    keep = {p for _, p in committed[-keep_last:]}
    removed = []
    for step, p in committed:
        if p in keep or p.name == latest or (keep_every and step % keep_every == 0):
            continue
        remove_committed(p)
        removed.append(p)
    return removed


#: Prefix of a checkpoint being deleted: out of the committed namespace (``step-N``) first.
DELETING_PREFIX = ".deleting-"


def remove_committed(path: Path, *, fsync: bool = True) -> None:
    """Delete a committed checkpoint so that a kill at any point leaves nothing that looks
    committed with a file missing: rename it out of the ``step-N`` namespace (one atomic
    ``rename``, fsynced), then delete the renamed tree. A leftover ``.deleting-*`` is
    removed by :func:`clean_partials` at the next restore. Raises ``OSError`` from the rename.
    """
    doomed = path.with_name(f"{DELETING_PREFIX}{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    inject.point("delete")
    os.rename(path, doomed)
    if fsync:
        fsync_dir(path.parent)
    inject.point("delete_renamed")
    shutil.rmtree(doomed, ignore_errors=True)


def quarantine(path: Path, *, prefix: str = "") -> Path:
    """Move a bad checkpoint aside (``<prefix><name>.corrupt-<unix time>``) so it is never tried
    again (a ``prefix`` keeps it out of a framework's own ``checkpoint-*`` listing)."""
    dst = path.with_name(f"{prefix}{path.name}.corrupt-{int(time.time())}")
    n = 0
    while dst.exists():
        n += 1
        dst = path.with_name(f"{prefix}{path.name}.corrupt-{int(time.time())}-{n}")
    os.rename(path, dst)
    fsync_dir(path.parent)
    return dst


def clean_partials(root: Path) -> list[Path]:
    """Remove ``*.partial`` directories (saves that never committed) and ``.deleting-*`` ones
    (deletions a kill interrupted). Call with no save running."""
    removed = []
    try:
        entries = list(root.iterdir())
    except FileNotFoundError:
        return []
    for p in entries:
        if (p.name.endswith(".partial") or p.name.startswith(DELETING_PREFIX)) and p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def classify_failure(exc: BaseException, root: Path, need_bytes: int = 0) -> tuple[str, dict[str, object]]:
    """Name the cause of a failed save: ``disk_full``, ``io_error``, ``timeout`` or ``error``.

    DCP wraps a full disk into ``CheckpointException`` around a misleading
    ``RuntimeError: [enforce fail at inline_container.cc] unexpected pos``, so the free
    space is read with ``statvfs`` instead of trusting the message.
    """
    if isinstance(exc, ReplicationFailed):
        return "replication", {"error": str(exc)[:500]}
    inner = exc
    failures = getattr(exc, "failures", None)  # CheckpointException: {rank: exception}
    if isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))
        if isinstance(inner, tuple):  # (exception, traceback) in some versions
            inner = inner[0]
    first = (str(inner).splitlines() or [""])[0]
    info: dict[str, object] = {"error": f"{type(inner).__name__}: {first}"[:500]}
    try:
        st = os.statvfs(root)
        free = st.f_bavail * st.f_frsize
        info["free_bytes"] = free
        info["total_bytes"] = st.f_blocks * st.f_frsize
    except OSError:
        free = None
    text = _flatten(exc)
    if "ENOSPC" in text or "No space left" in text or (free is not None and free < max(need_bytes, 1 << 20)):
        return "disk_full", info
    if isinstance(exc, TimeoutError) or "timed out" in text.lower() or "timeout" in text.lower():
        return "timeout", info
    if isinstance(exc, OSError) or "OSError" in text or "Errno" in text:
        code = getattr(exc, "errno", None)
        if code is not None:
            info["errno"] = errno.errorcode.get(code, code)
        return "io_error", info
    return "error", info


def _flatten(exc: BaseException) -> str:
    parts = [repr(exc)]
    failures = getattr(exc, "failures", None)  # CheckpointException: {rank: exception}
    if isinstance(failures, dict):
        parts += [repr(e) for e in failures.values()]
    cause = exc.__cause__ or exc.__context__
    if cause is not None and cause is not exc:
        parts.append(repr(cause))
    return " | ".join(parts)
