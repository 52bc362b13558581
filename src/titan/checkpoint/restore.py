"""Choosing and loading a checkpoint: verify first, decide once for all ranks, fall back.

Candidates are the committed directories, newest first (rank 0's listing, broadcast so all
ranks walk the same list). For each, every rank checksums its share of the files and the
verdicts are all-gathered: the candidate is used only if every rank found it good and
every rank loaded it. Otherwise rank 0 records ``ckpt.corrupt`` and moves it aside, and
all ranks go on to the previous one together. An in-memory snapshot is used instead when
every rank holds a valid one of the same step, newer than the chosen disk checkpoint.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from titan.checkpoint import commit as _commit
from titan.checkpoint import manifest as _mf

if TYPE_CHECKING:
    from titan.checkpoint.checkpointer import Checkpointer

__all__ = ["restore", "agreed_snapshot_step", "load_snapshot"]

log = logging.getLogger(__name__)


def _seed_of(ck: "Checkpointer", app_state: Mapping[str, Any], manifest: Mapping[str, Any]) -> int | None:
    if ck.seed is not None:
        return ck.seed
    seed = (manifest.get("info") or {}).get("seed")
    if isinstance(seed, int):
        return seed
    for obj in app_state.values():  # e.g. the workload's ResumableSampler carries the run's seed
        s = getattr(obj, "seed", None)
        if isinstance(s, int) and not isinstance(s, bool):
            return s
    return None


def _load_disk(ck: "Checkpointer", path: Path, manifest: Mapping[str, Any], app_state: Mapping[str, Any]) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp

    from titan.checkpoint.state import apply, collect, reseed_rng
    from titan.checkpoint.storage import SafeLoadPlanner, SafeReader

    resharded = int(manifest["world_size"]) != ck.world
    template = collect(app_state, ck.rank, with_rng=not resharded)
    dcp.load(template, storage_reader=SafeReader(path), planner=SafeLoadPlanner(), process_group=ck._ctl,
             no_dist=ck._dist() is None)
    apply(app_state, template)
    info: dict[str, Any] = {"resharded": resharded, "from_world_size": int(manifest["world_size"])}
    if resharded:
        seed = _seed_of(ck, app_state, manifest)
        if seed is None:
            log.warning("world size changed and no seed is known: RNG left as the script seeded it")
        else:
            # Per-rank streams cannot be carried across world sizes: derive them from
            # (seed, new rank, step) — exact in data, not bitwise (docs/checkpoint.md).
            reseed_rng(seed, ck.rank, int(manifest["step"]))
            info["rng"] = "reseeded"
    return info


def restore(ck: "Checkpointer", app_state: Mapping[str, Any]) -> int:
    """See ``Checkpointer.restore``."""
    from torch.distributed.checkpoint.api import CheckpointException

    from titan.checkpoint.checkpointer import CheckpointLoadError

    if ck.rank == 0:
        for p in _commit.clean_partials(ck.root):
            log.info("removed unfinished save %s", p.name)
    listing = [(s, str(p)) for s, p in reversed(_mf.list_committed(ck.root))] if ck.rank == 0 else None
    listing = ck._all_gather(listing)[0]
    snap_step = agreed_snapshot_step(ck) if ck._snap is not None else 0
    touched = False
    for step, spath in listing or []:
        path = Path(spath)
        if snap_step > step:
            break
        t0 = time.monotonic()
        res = _mf.verify(path, checksums=ck.cfg.verify_on_load, share=(ck.rank, ck.world))
        verdicts = ck._all_gather(res.problems)
        problems = [f"rank {r}: {p}" for r, ps in enumerate(verdicts) for p in ps]
        verify_s = time.monotonic() - t0
        info: dict[str, Any] = {}
        if not problems:
            t1 = time.monotonic()
            err = None
            touched = True
            try:
                info = _load_disk(ck, path, res.manifest or {}, app_state)
            except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
                err = f"load failed: {type(e).__name__}: {_first_line(e)}"
            errs = ck._all_gather(err)
            problems = [f"rank {r}: {e}" for r, e in enumerate(errs) if e]
            if not problems:
                ck.ctx.events.emit("ckpt.loaded", f"resumed from {path.name}", step=step, data={
                    "step": step, "path": str(path), "source": "disk", "verify_s": verify_s,
                    "load_s": time.monotonic() - t1, "bytes": (res.manifest or {}).get("bytes", 0),
                    "verified_bytes": res.bytes_read, **info})
                return step
        _corrupt(ck, path, problems)
    if snap_step > 0:
        load_snapshot(ck, snap_step, app_state, source="restart")
        return snap_step
    if touched:
        raise CheckpointLoadError("every checkpoint failed to load after one partly overwrote the model; "
                                  "refusing to train from a mixed state")
    ck.ctx.events.emit("ckpt.none", "no checkpoint to resume from; starting at step 0", data={"root": str(ck.root)})
    return 0


def _first_line(e: BaseException) -> str:
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        e = next(iter(failures.values()))
    return (str(e).splitlines() or [""])[0][:300]


def _corrupt(ck: "Checkpointer", path: Path, problems: list[str]) -> None:
    moved = None
    if ck.rank == 0:
        try:
            moved = str(_commit.quarantine(path))
        except OSError as e:
            log.warning("could not move %s aside: %s", path, e)
        ck.ctx.events.emit("ckpt.corrupt", f"{path.name} unusable: {problems[0]}", level="error", data={
            "path": str(path), "reasons": problems[:20], "moved_to": moved})
    ck._barrier()  # nobody looks at the next candidate before this one is moved aside


def agreed_snapshot_step(ck: "Checkpointer") -> int:
    """The newest snapshot step valid on every rank (0 if none). Collective."""
    mine = ck._snap.valid_steps() if ck._snap is not None else []
    common = None
    for steps in ck._all_gather(sorted(mine)):
        common = set(steps) if common is None else common & set(steps)
    return max(common) if common else 0


def load_snapshot(ck: "Checkpointer", step: int, app_state: Mapping[str, Any], *, source: str) -> None:
    """Load this rank's snapshot of ``step`` into ``app_state`` (all ranks call it together)."""
    from titan.checkpoint.state import apply

    t0 = time.monotonic()
    sd = ck._snap.load(step)
    apply(app_state, sd)
    ck._barrier()
    ck.ctx.events.emit("ckpt.loaded", f"resumed from in-memory snapshot of step {step}", step=step, data={
        "step": step, "path": str(ck._snap.dir), "source": f"snapshot:{source}", "load_s": time.monotonic() - t0})
