"""Who did the detector blame? The culprit named by each detection event, checked against
the injected fault (rank, node, phase, checkpoint path, link).

:func:`attribute` returns ``(right, culprit)``: ``right`` is True when the event names the
injected rank/node/link (None when the fault has no single target), ``culprit`` is what it
named, as one line for the verdict table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from titan.chaos.plan import FaultSpec
from titan.events import Event

__all__ = ["attribute", "sdc_ranks", "link_culprit"]


def sdc_ranks(d: dict[str, Any]) -> set[int]:
    """Culprit ranks in an ``sdc.*`` event's data (``culprits`` keyed by rank, ``rank(s)``)."""
    out: set[int] = set()
    c = d.get("culprits")
    if isinstance(c, dict):
        out |= {int(k) for k in c if str(k).lstrip("-").isdigit()}
    elif isinstance(c, list):
        out |= {int(x["rank"] if isinstance(x, dict) else x) for x in c
                if isinstance(x, (int, dict)) and (not isinstance(x, dict) or "rank" in x)}
    for k in ("rank", "culprit_rank"):
        if isinstance(d.get(k), int):
            out.add(d[k])
    if isinstance(d.get("ranks"), list):
        out |= {int(x) for x in d["ranks"] if isinstance(x, int)}
    return out


def link_culprit(data: dict[str, Any]) -> bool:
    """True when a hang verdict shows every rank, on two or more nodes, waiting in the same
    collective: all issued the same ones and none completed the last (in flight in ``comm``),
    so no rank is behind — the link between the nodes is the culprit."""
    views = data.get("views") or []
    nodes = {v.get("node") for v in views}
    issued = {tuple(v.get("issued") or []) for v in views}
    in_flight = all(any(i > c for i, c in zip(v.get("issued") or [], v.get("completed") or [])) for v in views)
    return len(nodes) >= 2 and len(issued) == 1 and in_flight and data.get("reason") != "collective-seq"


def _sdc_tensor_named(f: FaultSpec, inj: Event, d: dict[str, Any]) -> bool:
    """Does an sdc event name the flipped tensor (``diverged`` or the culprits' tensor lists)?"""
    name = str(inj.data.get("tensor") or f.get("tensor") or "")
    base = name.split(".", 1)[1] if name.startswith(("param.", "optim.", "grad.")) else name
    base = base.rsplit(".exp_avg", 1)[0]
    named: list[str] = [str(x) for x in (d.get("diverged") or [])]
    c = d.get("culprits")
    if isinstance(c, dict):
        for v in c.values():
            named += [str(x) for x in (v if isinstance(v, list) else [v])]
    return bool(base) and any(base in n for n in named)


def attribute(f: FaultSpec, inj: Event, det: Event, rank: int | None, *, run_dir: str | None = None,
              blame: Event | None = None) -> tuple[bool | None, str]:
    """``(right, culprit)`` for detection event ``det`` of fault ``f`` (``blame``: a later
    event that names the culprit, e.g. ``sdc.repaired`` after an ``sdc.mismatch``)."""
    d = det.data
    if det.kind in ("guard.nonfinite", "guard.spike"):
        ranks = d.get("ranks") or []
        return (rank in ranks if rank is not None else None), f"ranks {ranks} (guard)"
    if det.kind in ("hang.detected", "hang.observed"):
        c = d.get("culprit") or {}
        if f.kind == "net":
            if not link_culprit(d):
                return False, f"rank {c.get('rank')}, phase {c.get('phase')}"
            v0 = (d.get("views") or [{}])[0]
            return True, (f"link between nodes, phase comm (every rank issued {max(v0.get('issued') or [0])} "
                          f"collectives, none completed the last; beacon phase {c.get('phase')})")
        want_phase = inj.data.get("phase")
        ok = c.get("rank") == rank and (want_phase is None or c.get("phase") == want_phase)
        return ok, f"rank {c.get('rank')} node {c.get('node')} phase {c.get('phase')} step {c.get('step')}"
    if det.kind == "straggler.detected":
        return d.get("rank") == rank, f"rank {d.get('rank')} ({d.get('slowdown', 0):.2f}x)"
    if det.kind == "worker.failed":
        r = d.get("global_rank", det.rank)
        return r == rank, f"rank {r} {d.get('signal') or 'exit ' + str(d.get('exit_code'))}"
    if det.kind == "launcher.node_lost":
        want = f.node or "node1"
        return d.get("node") == want, (f"node {d.get('node')} ({d.get('how')}; committed "
                                       f"{d.get('committed')}; seen by {det.node})")
    if det.kind == "worker.fault":
        return det.rank == rank, f"rank {det.rank} {d.get('class')} in {det.phase}"
    if det.kind.startswith("sdc."):
        ev = blame or det
        rs = sdc_ranks(ev.data)
        tensor_ok = _sdc_tensor_named(f, inj, ev.data) or _sdc_tensor_named(f, inj, d)
        if rs:
            return (rank in rs if rank is not None else None), f"ranks {sorted(rs)} ({ev.kind})"
        # Two replicas and a flip between rounds: both left the clean trajectory, no rank can be
        # named honestly (docs/sdc.md); the tensor is the culprit the evidence supports.
        names = [str(x) for x in (d.get("diverged") or [])][:2]
        return tensor_ok, f"tensor {', '.join(names) or '?'} (rank unknown: 2 replicas)"
    if det.kind == "ckpt.slow":
        node, path = d.get("node") or det.node, str(d.get("path") or "")
        inside = run_dir is None or Path(path).resolve().is_relative_to(Path(run_dir).resolve() / "checkpoints")
        want = inj.node if inj.node not in (None, "driver") else "node0"
        return node == want and inside, (f"node {node} path {_short(path, run_dir)} (save {d.get('total_s', 0):.2f} s, "
                                         f"baseline {d.get('baseline_s', 0):.2f} s)")
    if det.kind in ("ckpt.failed", "ckpt.corrupt", "ckpt.preempted"):
        path = str(d.get("path") or d.get("checkpoint") or d.get("file") or "")
        return True, f"node {det.node} {d.get('kind') or det.kind}" + (f" {_short(path, run_dir)}" if path else "")
    if det.kind == "agent.alert":
        rule = str(d.get("rule"))
        if rule.startswith("net_link"):
            link = d.get("link") or []
            ok = isinstance(link, list) and len(set(link)) == 2
            return ok, f"link {'<->'.join(map(str, link))} ({d.get('evidence', '')})"
        if rule == "net_probe_loss":  # the static rule: its metric names the peer
            peer = _label(str(d.get("metric") or ""), "peer")
            link = sorted([str(det.node), peer]) if peer else []
            return bool(peer) and peer != det.node, (f"link {'<->'.join(link)} (probe loss "
                                                     f"{d.get('observed', d.get('value'))} of the last probes)")
        if rule == "host_pressure":
            want = inj.node if inj.node not in (None, "driver") else "node0"
            return det.node == want, f"node {det.node}: {d.get('evidence', '')}"
        return True, f"node {det.node} {rule}"
    return True, det.kind


def _label(key: str, name: str) -> str | None:
    from titan.monitor.base import parse_key

    try:
        return parse_key(key)[1].get(name)
    except ValueError:
        return None


def _short(path: str, run_dir: str | None) -> str:
    if run_dir and path.startswith(run_dir.rstrip("/") + "/"):
        return path[len(run_dir.rstrip("/")) + 1:]
    return path
