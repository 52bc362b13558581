"""A digest of the training state — how a drill compares any script's end with a clean run's.

``titan drill`` sets ``TITAN_FINAL_STATE``; ``Checkpointer.close()`` then writes, per rank,
``<path>.rank<r>.json``: the last step it saw and a SHA-256 of every tensor of the model and
optimizer entries of the app state (this rank's shards under FSDP). Two runs ended in the
same bits exactly when their digests are equal on every rank. The RNG, the data position and
the guard's statistics are left out on purpose: a recovered run may differ there (strikes,
skip counters) while its model and optimizer are bit for bit the reference's.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

import torch

from titan.events import atomic_write_json

__all__ = ["state_digest", "write_digest", "read_digests", "compare_digests"]


def _leaves(prefix: str, obj: Any) -> list[tuple[str, torch.Tensor]]:
    if hasattr(obj, "to_local"):  # DTensor: this rank's shard
        obj = obj.to_local()
    if isinstance(obj, torch.Tensor):
        return [(prefix, obj)]
    if isinstance(obj, Mapping):
        return [x for k in sorted(obj, key=str) for x in _leaves(f"{prefix}.{k}", obj[k])]
    if isinstance(obj, (list, tuple)):
        return [x for i, v in enumerate(obj) for x in _leaves(f"{prefix}.{i}", v)]
    return []


def state_digest(app_state: Mapping[str, Any], rank: int) -> dict[str, str]:
    """``{tensor name: sha256 of its bytes}`` for the model and optimizer entries of
    ``app_state``. Cost: one device-to-host copy and one hash of the state's bytes."""
    from titan.checkpoint.state import collect

    keep = {k: v for k, v in app_state.items() if isinstance(v, (torch.nn.Module, torch.optim.Optimizer))}
    sd = collect(keep, rank, with_rng=False) if keep else {}
    out = {}
    for name, t in _leaves("", sd):
        b = t.detach().cpu().contiguous()
        out[name.lstrip(".")] = hashlib.sha256(b.view(-1).view(torch.uint8).numpy().tobytes()
                                               + str((b.dtype, tuple(b.shape))).encode()).hexdigest()
    return out


def write_digest(path: str | Path, rank: int, step: int | None, digest: Mapping[str, str]) -> Path:
    """Write ``<path>.rank<rank>.json`` atomically; returns the file."""
    out = Path(f"{path}.rank{rank}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out, {"step": step, "rank": rank, "tensors": dict(digest)})
    return out


def read_digests(path: str | Path) -> dict[int, dict[str, Any]]:
    """rank → the digest written for ``path`` (missing or unreadable files are left out)."""
    p = Path(path)
    out = {}
    for f in sorted(p.parent.glob(f"{p.name}.rank*.json")):
        try:
            obj = json.loads(f.read_text())
            out[int(obj["rank"])] = obj
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def compare_digests(a: Mapping[int, Mapping[str, Any]], b: Mapping[int, Mapping[str, Any]]) -> tuple[bool | None, str]:
    """(equal, what differs): ``None`` when either side is missing."""
    if not a or not b:
        return None, "no final state" + (" of the first run" if not a else " of the second run")
    if set(a) != set(b):
        return False, f"ranks differ: {sorted(a)} vs {sorted(b)}"
    diff = []
    for r in sorted(a):
        if a[r].get("step") != b[r].get("step"):
            return False, f"rank {r} ended at step {a[r].get('step')} vs {b[r].get('step')}"
        ta, tb = a[r].get("tensors") or {}, b[r].get("tensors") or {}
        diff += [f"rank {r}: {k}" for k in sorted(set(ta) | set(tb)) if ta.get(k) != tb.get(k)]
    if diff:
        return False, f"{len(diff)} tensor(s) differ (first: {diff[0]})"
    n = sum(len(a[r].get("tensors") or {}) for r in a)
    return True, f"{n} tensors on {len(a)} rank(s) bit for bit equal"
