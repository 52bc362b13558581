"""Choosing and loading a checkpoint: verify first, decide once for all ranks, fall back.

Candidates are the committed directories, newest first (rank 0's listing, broadcast so all
ranks walk the same list). For each, every rank checksums its share of the files and the
verdicts are all-gathered: the candidate is used only if every rank found it good and
every rank loaded it. Otherwise rank 0 records ``ckpt.corrupt`` and moves it aside, and
all ranks go on to the previous one together. An in-memory snapshot (per-step or SDC-
verified tier) is used instead when every rank holds a valid one of the same step, at
least as new as the disk checkpoint; one that any rank cannot load sends every rank on to
the disk checkpoints (``ckpt.snapshot_rejected``), and ``ckpt.loaded`` says why memory was
not used (``memory``: a rank without its slots — a lost node — or slots of other steps).
On node-local storage (one folder per node) ``titan.checkpoint.nodelocal`` chooses and
assembles the step from every node's committed copies and the buddies' replicas instead; the
in-memory choice and the tail (memory, refusal, step 0) are the same.
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

    lay = getattr(ck, "_layout", None)
    if lay is not None and (lay.node_local or ck._all_max([int(ck.rank == 0 and _written_node_local(ck.root))])[0]):
        # Several nodes' folders — or fewer nodes now (a job that went on at MIN) whose
        # checkpoints were written node-locally: the lost nodes' shards are in replicas.
        return _restore_nodelocal(ck, lay, app_state)
    if ck.rank == 0:
        for p in _commit.clean_partials(ck.root):
            log.info("removed unfinished save %s", p.name)
    listing, durable = _candidates(ck) if ck.rank == 0 else (None, {})
    moved_before = _quarantined(ck.root) if ck.rank == 0 else 0  # unusable ones moved aside by an earlier restore
    held = _tier_steps(ck)  # this rank's valid in-memory snapshots, per tier
    gathered = ck._all_gather((listing, moved_before, held))  # one collective for the whole choice
    listing, moved_before = gathered[0][0], gathered[0][1]
    per_rank = [g[2] for g in gathered]
    mem = _best_memory(per_rank)  # (tier, step) every rank holds, newest; None
    why_not = _why_not_memory(per_rank, mem)
    mem_tried = False
    touched = False
    for step, spath, src in listing or []:
        if mem is not None and not mem_tried and mem[1] >= step:
            mem_tried = True
            if _load_memory(ck, mem, app_state, why_not):
                return mem[1]
            touched, why_not = True, "the agreed snapshot failed to load"
        path = Path(spath)
        t0 = time.monotonic()
        if src == "durable" and not _fetch_durable(ck, step, durable.get(step)):
            continue
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
                _forget_newer(ck, step)
                ck.ctx.events.emit("ckpt.loaded", f"resumed from {path.name}"
                                   + (f" (copied from durable storage {ck.cfg.persist_dir})" if src == "durable" else "")
                                   + (f" (in memory: {why_not})" if why_not else ""),
                                   step=step, data={
                    "step": step, "path": str(path), "source": src, "verify_s": verify_s,
                    "load_s": time.monotonic() - t1, "bytes": (res.manifest or {}).get("bytes", 0),
                    "verified_bytes": res.bytes_read, "memory": why_not, **info})
                return step
        _corrupt(ck, path, problems)
    return _no_disk_checkpoint(ck, app_state, None if mem_tried else mem, why_not, touched,
                               len(listing or []), int(moved_before), {})


def _written_node_local(root: Path) -> bool:
    """Whether a committed checkpoint here was written node-locally (several storage domains)."""
    for _, p in reversed(_mf.list_committed(root)):
        try:
            m = _mf.read_manifest(p)
        except ValueError:
            continue
        if m.get("storage") == "node-local" and len(m.get("domains") or []) > 1:
            return True
    return False


def _candidates(ck: "Checkpointer") -> tuple[list[tuple[int, str, str]], dict[int, dict[str, Any]]]:
    """Rank 0, shared storage: (step, path, ``disk``|``durable``) newest first — at the same
    step this folder's copy before the durable tier's — and the durable manifests."""
    from titan.checkpoint.durable import open_tier

    out = [(s, str(p), "disk") for s, p in _mf.list_committed(ck.root)]
    durable: dict[int, dict[str, Any]] = {}
    tier = open_tier(ck)
    if tier is not None:
        try:
            durable = {s: m for s, m in tier.steps().items() if isinstance(m, dict)}
        except Exception as e:  # noqa: BLE001 - an unreachable store: the local copies still count
            log.warning("durable tier %s not listed: %s", tier.describe(), e)
        out += [(s, str(ck.root / _mf.step_dir_name(s)), "durable") for s in durable]
    return sorted(out, key=lambda c: (c[0], c[2] == "disk"), reverse=True), durable


def _fetch_durable(ck: "Checkpointer", step: int, manifest: dict[str, Any] | None) -> bool:
    """Rank 0 copies ``step`` from the durable tier into the checkpoint folder (collective:
    every rank learns whether it worked). A failure is ``ckpt.corrupt`` naming the tier."""
    from titan.checkpoint.durable import fetch_step, open_tier

    err = None
    if ck.rank == 0:
        tier = open_tier(ck)
        try:
            assert tier is not None and manifest is not None
            fetch_step(tier, step, manifest, ck.root, fsync=ck.cfg.fsync)
        except Exception as e:  # noqa: BLE001 - reported; the next candidate is tried
            err = f"{type(e).__name__}: {e}"[:400]
    errs = ck._all_gather(err)
    if errs[0] is None:
        return True
    if ck.rank == 0:
        where = f"{ck.cfg.persist_dir.rstrip('/')}/{_mf.step_dir_name(step)}"
        ck.ctx.events.emit("ckpt.corrupt", f"{_mf.step_dir_name(step)} in durable storage unusable: {errs[0]}",
                           level="error", data={"path": where, "reasons": [errs[0]], "moved_to": None,
                                                "tier": "durable"})
    return False


def _no_disk_checkpoint(ck: "Checkpointer", app_state: Mapping[str, Any], mem: tuple[str, int] | None,
                        why_not: str | None, touched: bool, tried: int, moved_before: int,
                        extra: dict[str, Any]) -> int:
    """No disk checkpoint loaded (shared or node-local): the agreed in-memory snapshot, else a
    refusal (mixed state / every checkpoint lost), else step 0."""
    from titan.checkpoint.checkpointer import CheckpointLoadError

    if mem is not None:
        if _load_memory(ck, mem, app_state, why_not):
            return mem[1]
        touched = True
    if touched:
        raise CheckpointLoadError("every checkpoint failed to load after one partly overwrote the model; "
                                  "refusing to train from a mixed state")
    if tried or moved_before:
        _all_lost(ck, tried, moved_before)
    _forget_newer(ck, 0)
    ck.ctx.events.emit("ckpt.none", "no checkpoint to resume from; starting at step 0",
                       data={"root": str(ck.root), **extra})
    return 0


def _restore_nodelocal(ck: "Checkpointer", lay: Any, app_state: Mapping[str, Any]) -> int:
    """Node-local storage: ``titan.checkpoint.nodelocal`` chooses and assembles, DCP loads here."""
    from titan.checkpoint.nodelocal import restore_nodelocal

    gathered = ck._all_gather((_quarantined(ck.root) if lay.is_leader else 0, _tier_steps(ck)))
    moved_before = sum(g[0] for g in gathered)
    per_rank = [g[1] for g in gathered]
    mem = _best_memory(per_rank)
    why_not = _why_not_memory(per_rank, mem)

    def corrupt(path: Path | None, problems: list[str]) -> None:
        moved = None
        if path is not None:  # every node moves its own copy aside
            try:
                moved = str(_commit.quarantine(path))
            except OSError as e:
                log.warning("could not move %s aside: %s", path, e)
        if ck.rank == 0:
            ck.ctx.events.emit("ckpt.corrupt", f"{(path or ck.root).name} unusable: {problems[0]}", level="error",
                               data={"path": str(path or ck.root), "reasons": problems[:20], "moved_to": moved,
                                     "storage": "node-local"})
        ck._barrier()

    # A memory snapshot at least as new as a disk step wins (as on shared storage).
    step, touched, tried = restore_nodelocal(ck, lay, app_state, mem[1] if mem else 0,
                                             lambda path, m: _load_disk(ck, path, m, app_state), corrupt, why_not)
    if step:
        _forget_newer(ck, step)
        return step
    return _no_disk_checkpoint(ck, app_state, mem, why_not, touched, tried, int(moved_before),
                               {"storage": "node-local"})


#: Tiers in the order preferred at the same step: SDC-verified, then per-step.
_TIERS = ("verified", "step")


def _tier_steps(ck: "Checkpointer") -> dict[str, list[int]]:
    """This rank's valid snapshot steps per tier (local: one checksum pass per slot). A rank
    whose per-step slots are gone (a replacement node) asks the tier's replica first."""
    out: dict[str, list[int]] = {}
    if ck._snap is not None:
        out["verified"] = ck._snap.valid_steps()
    tier = ck.step_tier()
    if tier is not None:
        steps = tier.valid_steps()
        if not steps and tier.fetch_from_replica() is not None:
            steps = tier.valid_steps()
        out["step"] = steps
    return out


def _agreed(per_rank: list[dict[str, list[int]]], tier: str) -> int:
    common: set[int] | None = None
    for held in per_rank:
        s = set(held.get(tier) or [])
        common = s if common is None else common & s
    return max(common) if common else 0


def _best_memory(per_rank: list[dict[str, list[int]]]) -> tuple[str, int] | None:
    best: tuple[str, int] | None = None
    for tier in _TIERS:
        step = _agreed(per_rank, tier)
        if step > 0 and (best is None or step > best[1]):
            best = (tier, step)
    return best


def _why_not_memory(per_rank: list[dict[str, list[int]]], mem: tuple[str, int] | None) -> str | None:
    """Why the newest in-memory state is not the one restored (None: it is, or there is none)."""
    if not any("step" in held for held in per_rank):
        return None  # the per-step tier is off everywhere: nothing to explain
    newest = max((max(held.get("step") or [0]) for held in per_rank), default=0)
    if mem is not None and mem[1] >= newest:
        return None
    missing = [r for r, held in enumerate(per_rank) if not held.get("step")]
    if missing:
        return (f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} hold{'' if len(missing) > 1 else 's'} "
                "no valid per-step snapshot (node lost, memory freed, or corrupt)")
    return f"the ranks hold no per-step snapshot of the same step ({[held.get('step') for held in per_rank]})"


def _forget_newer(ck: "Checkpointer", step: int) -> None:
    tier = ck.step_tier()
    if tier is not None:
        tier.discard_newer_than(step)


def _load_memory(ck: "Checkpointer", mem: tuple[str, int], app_state: Mapping[str, Any], why_not: str | None) -> bool:
    """Load the agreed in-memory snapshot on every rank; False (and an event) when any rank
    could not, so that all ranks go on to the disk checkpoints together. Collective."""
    tier, step = mem
    try:
        load_snapshot(ck, step, app_state, source="restart", tier=tier, note=why_not)
        return True
    except _SnapshotLoadFailed as e:
        if ck.rank == 0:
            ck.ctx.events.emit("ckpt.snapshot_rejected", f"in-memory snapshot of step {step} ({tier} tier) not "
                               f"usable: {e.problems[0]}; trying the disk checkpoints", level="warning", step=step,
                               data={"step": step, "tier": tier, "reasons": e.problems[:20]})
        return False


class _SnapshotLoadFailed(Exception):
    def __init__(self, problems: list[str]) -> None:
        super().__init__(problems[0])
        self.problems = problems


def _quarantined(root: Path) -> int:
    try:
        return sum(1 for p in root.iterdir() if ".corrupt-" in p.name and p.is_dir())
    except OSError:
        return 0


def _all_lost(ck: "Checkpointer", tried: int, moved_before: int) -> None:
    """Every checkpoint is unusable: never restart from step 0 quietly (docs/checkpoint.md).

    Emits ``ckpt.all_corrupt`` (critical) and raises ``CheckpointsLost`` (exit ``GAVE_UP``)
    unless ``checkpoint.allow_fresh_start``, in which case training starts from step 0.
    """
    from titan.checkpoint.checkpointer import CheckpointsLost

    n = tried + moved_before
    allowed = bool(ck.cfg.allow_fresh_start)
    what = (f"every checkpoint is unusable ({tried} failed verification or loading now"
            + (f", {moved_before} moved aside earlier" if moved_before else "") + ")")
    msg = what + ("; restarting from step 0 (checkpoint.allow_fresh_start)" if allowed else
                  "; not restarting from step 0 (allow it with --set checkpoint.allow_fresh_start=true)")
    if ck.rank == 0:
        ck.ctx.events.emit("ckpt.all_corrupt", msg, level="critical", data={
            "checkpoints": n, "tried": tried, "moved_before": moved_before, "fresh_start": allowed,
            "root": str(ck.root)})
    if not allowed:
        raise CheckpointsLost(msg)


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


def agreed_snapshot_step(ck: "Checkpointer", tier: str = "verified") -> int:
    """The newest snapshot step of ``tier`` valid on every rank (0 if none). Collective."""
    mine = _tier_steps(ck)
    return _agreed(ck._all_gather(mine), tier)


def load_snapshot(ck: "Checkpointer", step: int, app_state: Mapping[str, Any], *, source: str,
                  tier: str = "verified", note: str | None = None) -> None:
    """Load this rank's snapshot of ``step`` from ``tier`` into ``app_state`` (all ranks call
    it together). Raises ``_SnapshotLoadFailed`` on every rank when any rank could not."""
    from titan.checkpoint.stepsnap import SnapshotMismatch

    t0 = time.monotonic()
    err = None
    info: dict[str, Any] = {}
    try:
        if tier == "step":
            store = ck.step_tier()
            info = store.load(step, app_state)
            where = store.dir
        else:
            from titan.checkpoint.state import apply

            apply(app_state, ck._snap.load(step))
            where = ck._snap.dir
    except (OSError, SnapshotMismatch, RuntimeError, ValueError, KeyError) as e:
        err = f"{type(e).__name__}: {_first_line(e)}"
    errs = ck._all_gather(err)
    problems = [f"rank {r}: {e}" for r, e in enumerate(errs) if e]
    if problems:
        raise _SnapshotLoadFailed(problems)
    if tier == "step" and source == "restart":
        _forget_newer(ck, step)
    ck.ctx.events.emit("ckpt.loaded", f"resumed from in-memory snapshot of step {step} ({tier} tier)", step=step, data={
        "step": step, "path": str(where), "source": f"snapshot:{source}", "tier": tier, "load_s": time.monotonic() - t0,
        "memory": note, **info})
