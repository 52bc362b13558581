"""Confined paths: a name read from a record is resolved inside its root, or refused.

Manifests, ``latest`` pointers, DCP metadata, run directories and ledgers are files that
someone else may have written. A name read from one of them must stay inside the folder it
describes: relative, no ``..``, no symlink that leads out, and a *regular file* (a FIFO,
``/dev/zero`` or a directory is refused without being opened for reading, so nothing
hangs and nothing outside is measured). Standard library only.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path, PurePosixPath

from titan.errors import TitanError
from titan.inputs import NotRegularFile, file_kind, open_regular_fd

__all__ = ["PathEscape", "confined", "check_regular", "open_regular", "is_plain_name"]


class PathEscape(TitanError):
    """A path read from a record points outside its root or at something not a regular file."""


def is_plain_name(name: str) -> bool:
    """True for one path component: no separator, not ``.``/``..``, no NUL, not empty."""
    return bool(name) and name not in (".", "..") and "/" not in name and "\\" not in name and "\0" not in name


def confined(root: str | os.PathLike[str], rel: str, *, what: str = "path") -> Path:
    """``root/rel`` after checking ``rel`` stays inside ``root``; raises ``PathEscape``.

    Refused: absolute paths, ``..`` components, NUL bytes, and names whose resolved target
    (symlinks followed) is outside ``root``. A name that does not exist yet is allowed (the
    caller reports it missing). Cost: one ``realpath`` (a few ``lstat`` calls).
    """
    if not isinstance(rel, str) or not rel or "\0" in rel:
        raise PathEscape(f"{what} {rel!r} is not a file name")
    pure = PurePosixPath(rel.replace("\\", "/"))
    if pure.is_absolute() or rel.startswith(("/", "\\")) or (len(rel) > 1 and rel[1] == ":"):
        raise PathEscape(f"{what} {rel!r} is an absolute path; records may only name files inside their folder")
    if any(part == ".." for part in pure.parts):
        raise PathEscape(f"{what} {rel!r} climbs out of its folder ('..')")
    base = Path(os.path.realpath(root))
    target = Path(os.path.realpath(base / pure))
    if target != base and base not in target.parents:
        raise PathEscape(f"{what} {rel!r} leads outside {base} (to {target}) through a symlink")
    return base / pure


def check_regular(path: str | os.PathLike[str], *, what: str = "file") -> os.stat_result:
    """``stat`` of ``path`` (symlinks followed); ``PathEscape`` unless it is a regular file.

    ``FileNotFoundError`` passes through, so callers can report "missing" as before.
    """
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise PathEscape(f"{what} {os.fspath(path)!r} is not a regular file ({file_kind(st.st_mode)})")
    return st


def open_regular(path: str | os.PathLike[str], *, what: str = "file") -> int:
    """Open ``path`` read-only and return the descriptor, refusing anything but a regular file.

    ``titan.inputs.open_regular_fd`` does the opening (``O_NONBLOCK``: a FIFO cannot block the
    open; the *opened* object is checked, no race between check and use). The caller closes
    the descriptor. Raises ``PathEscape`` or ``OSError``.
    """
    try:
        return open_regular_fd(path)[0]
    except NotRegularFile as e:
        raise PathEscape(f"{what} {os.fspath(path)!r} is not a regular file ({e.kind})") from None
