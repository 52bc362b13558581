"""Titan's checkpoint guarantees applied to a framework's own checkpoints.

The Trainer writes ``checkpoint-N/`` directories and Lightning writes single ``.ckpt``
files, in their own formats, with their own resume. Titan adds what they lack:

* **a commit marker with checksums**: once every rank's files of a save are on disk, a
  manifest (``titan.checkpoint.manifest`` format: size + CRC-32 of every file) is written
  atomically — ``manifest.json`` inside a Trainer checkpoint, ``<file>.titan.json`` beside
  a Lightning file. A checkpoint is *committed* exactly when its manifest exists;
* **verified resume from the newest good one**: candidates newest first; one whose files
  do not match its manifest (truncated, overwritten, bit rot) or that has no manifest (the
  save was interrupted) is reported (``ckpt.corrupt``), moved aside out of the framework's
  listing (``corrupt.<name>.corrupt-<t>``) and the previous one is tried — so a bad newest
  checkpoint costs one fallback, never a crash loop (transformers#35782);
* **adoption of a user's existing checkpoints**: the first time Titan looks at a folder it
  records the checkpoints already there (``.titan-adopted.json``); those have no manifest
  and are accepted as they are (unverified, said in ``ckpt.loaded``) — so a run that began
  without Titan resumes into a Titan-guarded one. Any later checkpoint without a manifest
  is an interrupted save.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

from titan.checkpoint import manifest as _mf
from titan.checkpoint.commit import quarantine

__all__ = ["Candidate", "ADOPTED", "QUARANTINE_PREFIX", "adopted", "choose", "commit_files", "sidecar_name"]

log = logging.getLogger(__name__)

ADOPTED = ".titan-adopted.json"
QUARANTINE_PREFIX = "corrupt."
SIDECAR = ".titan.json"


def sidecar_name(file: Path | str) -> str:
    """The manifest beside a one-file checkpoint."""
    return f"{Path(file).name}{SIDECAR}"


@dataclasses.dataclass
class Candidate:
    """One framework checkpoint: where it is, its step, and where its manifest lives."""

    path: Path  # the checkpoint (directory or file)
    step: int
    base: Path  # the directory the manifest's file names are relative to
    manifest: str  # the manifest's name inside ``base``

    @property
    def has_manifest(self) -> bool:
        return (self.base / self.manifest).is_file()


def adopted(root: Path, names: list[str], *, rank: int) -> set[str]:
    """The checkpoints that were in ``root`` before Titan first looked (recorded once, by
    rank 0, in ``.titan-adopted.json``). ``names``: what is there now without a manifest."""
    marker = root / ADOPTED
    try:
        return set(json.loads(marker.read_text())["legacy"])
    except FileNotFoundError:
        pass
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("%s unreadable (%s): no checkpoint without a manifest is accepted", marker, e)
        return set()
    if rank == 0 and root.is_dir():
        from titan.events import atomic_write_json

        atomic_write_json(marker, {"legacy": sorted(names), "adopted_at": time.time()})
    return set(names)


def choose(ctx: Any, root: Path, candidates: list[Candidate], *, source: str,
           rank: int = 0) -> tuple[Candidate | None, dict[str, Any]]:
    """The newest candidate that verifies (or was adopted), after moving bad ones aside.

    Runs on each rank over the same files; only rank 0 moves anything and writes
    ``ckpt.corrupt``. Returns the candidate (or ``None``) and facts for ``ckpt.loaded``
    (``verified``, ``verify_s``, ``skipped``). Cost: one checksum read of each candidate
    tried. Never raises for a bad checkpoint."""
    legacy = adopted(root, [c.path.name for c in candidates if not c.has_manifest], rank=rank)
    skipped: list[str] = []
    for c in sorted(candidates, key=lambda c: c.step, reverse=True):
        t0 = time.monotonic()
        if not c.has_manifest:
            if c.path.name in legacy:
                return c, {"verified": False, "adopted": True, "verify_s": 0.0, "skipped": skipped}
            problems = ["no manifest: the save was interrupted before it committed"]
        else:
            res = _mf.verify(c.base, manifest=c.manifest)
            if res.ok:
                return c, {"verified": True, "verify_s": time.monotonic() - t0, "bytes": res.bytes_read,
                           "skipped": skipped}
            problems = res.problems
        skipped.append(c.path.name)
        _set_aside(ctx, c, problems, source=source, rank=rank)
    return None, {"skipped": skipped}


def _set_aside(ctx: Any, c: Candidate, problems: list[str], *, source: str, rank: int) -> None:
    if rank != 0:
        return
    moved = None
    try:
        one_file = c.path.is_file()
        moved = str(quarantine(c.path, prefix=QUARANTINE_PREFIX))
        side = c.base / c.manifest
        if one_file and side.is_file():  # a one-file checkpoint's sidecar goes with it
            os.rename(side, Path(moved).with_name(Path(moved).name + SIDECAR))
    except OSError as e:
        log.warning("could not move %s aside: %s", c.path, e)
    log.warning("checkpoint %s unusable: %s", c.path.name, problems[0])
    ctx.events.emit("ckpt.corrupt", f"{c.path.name} unusable: {problems[0]}", level="error", data={
        "path": str(c.path), "reasons": problems[:20], "moved_to": moved, "source": source})


def commit_files(base: Path, files: list[str], *, manifest: str, step: int, world_size: int,
                 info: dict[str, Any], before_write: Callable[[], None] | None = None) -> dict[str, Any]:
    """Checksum ``files`` (relative to ``base``) and write their manifest atomically — the
    commit of a framework checkpoint. Call once every rank's files are on disk. Returns the
    manifest. Cost: one read of every file, two fsyncs."""
    m = _mf.build_file_manifest(base, files, step=step, world_size=world_size, info=info)
    if before_write is not None:
        before_write()
    _mf.write_manifest(base, m, name=manifest)
    return m


def files_under(d: Path, *, skip: tuple[str, ...] = ()) -> list[str]:
    """Every regular file under ``d`` (relative names, sorted), but temp files and ``skip``."""
    out = []
    for p in sorted(d.rglob("*")):
        if p.is_file() and not p.is_symlink():
            rel = p.relative_to(d).as_posix()
            if rel in skip or p.name.startswith(".") and p.name.endswith(".tmp"):
                continue
            out.append(rel)
    return out
