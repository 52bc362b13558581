"""Crash-injection points at every boundary of the save protocol (for tests and drills).

Points, in protocol order: ``shard_write``, ``shard_written``, ``metadata_written``,
``manifest_write``, ``manifest_written``, ``rename``, ``renamed``, ``latest``,
``latest_written``; and of a retention deletion: ``delete``, ``delete_renamed``.
``TITAN_CKPT_CRASH_AT=<point>[@<rank>][#<attempt>]`` makes the process
SIGKILL itself when it reaches that point (only on that rank / torchrun restart count
when given). Tests can
also install a Python hook with ``set_hook``. Cost when unset: one dict lookup.
"""

from __future__ import annotations

import os
import signal
from typing import Callable

from titan.settings.env import TITAN_CKPT_CRASH_AT

__all__ = ["POINTS", "DELETE_POINTS", "point", "set_hook"]

POINTS = ("shard_write", "shard_written", "metadata_written", "manifest_write", "manifest_written",
          "rename", "renamed", "latest", "latest_written")
#: Points of deleting a committed checkpoint (retention, a replaced step).
DELETE_POINTS = ("delete", "delete_renamed")

_hook: Callable[[str], None] | None = None


def set_hook(fn: Callable[[str], None] | None) -> None:
    """Call ``fn(point)`` at every injection point (``None`` removes it)."""
    global _hook
    _hook = fn


def point(name: str, rank: int | None = None) -> None:
    """Reached protocol boundary ``name``; crash here if asked to."""
    if _hook is not None:
        _hook(name)
    spec = os.environ.get(TITAN_CKPT_CRASH_AT)
    if not spec:
        return
    spec, _, on_attempt = spec.partition("#")
    if on_attempt and int(on_attempt) != int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")):
        return
    want, _, on_rank = spec.partition("@")
    if want != name:
        return
    if on_rank and rank is not None and int(on_rank) != rank:
        return
    if on_rank and rank is None and int(on_rank) != int(os.environ.get("RANK", "0")):
        return
    os.kill(os.getpid(), signal.SIGKILL)
