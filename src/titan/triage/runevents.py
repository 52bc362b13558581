"""A Titan run directory's events as triage findings.

Events carry rank, node and a clock-corrected time already (``titan.events.read_run``
subtracts the offsets measured at rendezvous), so no skew allowance is needed between them.
Kinds: ``worker.failed`` (exit), ``guard.*`` (numerical), ``ckpt.failed``/``ckpt.corrupt``
(storage), ``hang.detected`` (hang), ``dist.init_failed`` (launcher), ``inject.*`` (a drill's
injected fault: the ground truth of the drill), ``step`` (progress). The message and data of
any error-level event are also run through the text rules.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from titan.events import read_run
from titan.exitcodes import ExitCode
from titan.events.schema import Event
from titan.triage.model import Finding
from titan.triage.rules import RuleSet
from titan.triage.scan import FileScan, Progress, make_finding

__all__ = ["scan_run_events", "EVENT_RULES"]

#: kind (or kind prefix) -> (role, class, action, priority); kinds and data as in docs/events.md
EVENT_RULES: dict[str, tuple[str, str | None, str | None, int]] = {
    "guard.nonfinite": ("cause", "numerical", "skip_step", 75),
    "guard.escalate": ("cause", "numerical", "restart_from_checkpoint", 80),
    "guard.strike": ("precursor", "numerical", None, 30),
    "guard.spike": ("precursor", "numerical", None, 30),
    "guard.skip": ("precursor", "numerical", None, 20),
    "guard.replay": ("precursor", "numerical", None, 20),
    "ckpt.failed": ("cause", "storage", None, 70),
    "ckpt.corrupt": ("cause", "storage", "restart_from_checkpoint", 70),
    "hang.detected": ("cause", "hang", "restart_from_checkpoint", 60),
    "hang.observed": ("cause", "hang", "restart_from_checkpoint", 55),
    "dist.init_failed": ("cause", "launcher", "retry", 60),
    "dist.init_gave_up": ("cause", "launcher", "retry", 60),
    "dist.timeout": ("timeout", "comm_error", None, 30),
    "dist.error": ("symptom", "comm_error", None, 20),
    "worker.failed": ("exit", None, None, 30),
    "worker.stopped": ("symptom", None, None, 10),
    "worker.fault": ("symptom", None, None, 15),  # refined by data.class below
    "straggler.detected": ("precursor", None, None, 35),
    "agent.alert": ("precursor", None, None, 20),
    "node.strike": ("precursor", None, None, 10),
    "inject.kill": ("cause", "launcher", "restart_from_checkpoint", 96),
    "inject.nan": ("cause", "numerical", "skip_step", 96),
    "inject.hang": ("cause", "hang", "restart_from_checkpoint", 96),
    "inject.stall": ("cause", "hang", "restart_from_checkpoint", 96),
    "inject.oom": ("cause", "oom", "fix_code_or_config", 96),
    "inject.enospc": ("cause", "storage", "fix_code_or_config", 96),
    "inject.disk": ("cause", "storage", None, 96),
    "inject.net": ("cause", "network", None, 96),
    "inject.partition": ("cause", "network", None, 96),
    "inject.link": ("cause", "network", None, 96),
    "inject.grad": ("cause", "numerical", "skip_step", 96),
    "inject.loss": ("cause", "numerical", "skip_step", 96),
    "inject.activation": ("cause", "numerical", "skip_step", 96),
    "inject.slow": ("precursor", None, None, 40),
    "guard.rollback": ("precursor", "numerical", None, 30),
}
#: ``worker.fault`` data.class (titan.worker.errors) -> (role, class, priority)
FAULT_CLASSES: dict[str, tuple[str, str | None, int]] = {
    "comm_timeout": ("timeout", "comm_error", 30), "peer_closed": ("symptom", "comm_error", 20),
    "comm_backend": ("cause", "comm_error", 50), "comm_network": ("cause", "network", 60),
    "store": ("cause", "launcher", 55), "cuda_sticky": ("cause", "gpu_hardware", 50),
    "cuda": ("cause", "user_code", 40), "oom": ("cause", "oom", 80), "other": ("cause", "user_code", 10),
}
#: titan.exitcodes.ExitCode.WORKER_COMM_FAULT: a worker's exit after a communication fault it saw
_COMM_FAULT_EXIT = int(ExitCode.WORKER_COMM_FAULT)
#: kinds whose data carries a raw log line worth matching whatever the level
_LINE_KINDS = ("agent.xid", "agent.kernel")


def _rule_for(kind: str) -> tuple[str, str | None, str | None, int] | None:
    if kind in EVENT_RULES:
        return EVENT_RULES[kind]
    for k, v in EVENT_RULES.items():
        if kind.startswith(k):
            return v
    return None


def _text(ev: Event) -> str:
    data = json.dumps(dict(ev.data), default=str, sort_keys=True)[:400] if ev.data else ""
    return f"{ev.kind} {ev.msg} {data}".strip()


def scan_run_events(run_dir: Path, order: int, rules: RuleSet, root: Path) -> tuple[FileScan, list[str]]:
    """Findings and progress from every event file of ``run_dir``; returns (scan, problems)."""
    rr = read_run(run_dir)
    res = FileScan(file=str(run_dir))
    problems = [f"{_rel(p.source, root)}:{p.line}: {p.reason}" for p in rr.problems]
    for ev in rr.events:
        t = ev.t - rr.clock_offsets.get(ev.node, 0.0)
        src = _rel(ev.source or "", root)
        line = ev.line or 0
        if ev.rank is not None:
            res.ranks.add(ev.rank)
            res.rank_node.setdefault(ev.rank, ev.node)
            if ev.pid is not None:
                res.pid_rank[ev.pid] = ev.rank
        if ev.kind == "step":
            d = ev.data
            res.progress.append(Progress(t=t, rank=ev.rank, step=int(ev.step or d.get("step", 0) or 0),
                                         loss=_f(d.get("loss")), step_time=_f(d.get("step_time_s")), tput=None,
                                         file=src, line=line))
            if not _finite(d.get("loss")) and d.get("loss") is not None:
                res.findings.append(_ev_finding(ev, t, src, line, order, ("cause", "numerical", "skip_step", 75),
                                                "step_nonfinite_loss"))
            continue
        spec = _rule_for(ev.kind)
        if ev.kind == "worker.fault" and isinstance(ev.data.get("class"), str):
            role, cls, prio = FAULT_CLASSES.get(ev.data["class"], ("cause", "user_code", 10))
            spec = (role, cls, None, prio)
        if ev.kind in _LINE_KINDS and isinstance(ev.data.get("line"), str):
            lf = make_finding(rules, ev.data["line"], file=src, line=line, t=t, inherited=False, file_rank=ev.rank,
                              file_host=ev.node, order=order)
            if lf is not None:
                res.findings.append(lf)
            continue
        if spec is not None:
            f = _ev_finding(ev, t, src, line, order, spec, ev.kind)
            if ev.kind == "worker.failed":
                code = ev.data.get("exit_code")
                f.fields["exitcode"] = code
                sig = ev.data.get("signal")
                if sig:
                    f.fields["signal"] = str(sig)
                lr = ev.data.get("global_rank", ev.data.get("rank"))
                if isinstance(lr, int):
                    f.rank = lr
                if code == _COMM_FAULT_EXIT:  # a Titan worker that saw its peers fail exits 10: a consequence
                    f.fields["consequence"] = True
                if isinstance(ev.data.get("pid"), int) and f.rank is not None:
                    res.pid_rank[ev.data["pid"]] = f.rank
            res.findings.append(f)
        if ev.level in ("error", "critical") or ev.kind in ("ckpt.failed", "dist.init_failed", "worker.failed"):
            lf = make_finding(rules, _text(ev), file=src, line=line, t=t, inherited=False, file_rank=ev.rank,
                              file_host=ev.node, order=order)
            if lf is not None and not (spec is not None and lf.role != "cause"):
                lf.fields.pop("_nolocate", None)  # an event's rank is the process that failed
                res.findings.append(lf)
    res.lines = len(rr.events)
    res.timed = True
    return res, problems


def _ev_finding(ev: Event, t: float, src: str, line: int, order: int, spec: tuple[str, str | None, str | None, int],
                rule: str) -> Finding:
    role, cls, action, prio = spec
    d: dict[str, Any] = dict(ev.data)
    culprit = d.get("culprit") if isinstance(d.get("culprit"), dict) else {}
    named = _named_ranks(d)
    rank: Any = culprit.get("rank")
    for key in ("target_rank", "stuck_rank", "global_rank", "rank"):
        if not isinstance(rank, int):
            rank = d.get(key)
    node = culprit.get("node") or d.get("target_node") or d.get("node")
    if named is not None:  # the event names its culprits (guard: ranks/culprits): never the rank that wrote it
        rank = named[0] if len(named) == 1 else None
        recs = [c for c in d.get("culprits") or [] if isinstance(c, dict) and c.get("rank") == rank]
        node = recs[0].get("node") if recs and isinstance(recs[0].get("node"), str) else (
            node if isinstance(node, str) else None)
        if rank is None:
            node = None
    else:
        rank = rank if isinstance(rank, int) else ev.rank
        node = node if isinstance(node, str) else ev.node
    gpu = d.get("gpu")
    scope = "process" if rule == "inject.kill" and isinstance(rank, int) else None
    return Finding(rule=f"event:{rule}", role=role, cls=cls, file=src, line=line, text=_text(ev), t=t, rank=rank,
                   node=node, gpu=str(gpu) if gpu is not None else None,
                   pid=None if named is not None else ev.pid,  # the writer's pid would name the writer
                   action=action, priority=prio,
                   scope=scope,
                   order=(order, line), fields={"step": ev.step} if ev.step is not None else {})


def _named_ranks(d: dict[str, Any]) -> list[int] | None:
    """The ranks an event names as culprits (``culprit_ranks``, guard ``culprits``/``ranks``), or None."""
    for key in ("culprit_ranks", "culprits", "ranks"):
        v = d.get(key)
        if isinstance(v, list) and v:
            out = [x.get("rank") if isinstance(x, dict) else x for x in v]
            out = [x for x in out if isinstance(x, int) and not isinstance(x, bool)]
            if out:
                return sorted(set(out))
        if isinstance(v, list) and not v and key != "culprit_ranks":
            continue
    return None


def _f(x: Any) -> float | None:
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _finite(x: Any) -> bool:
    v = _f(x)
    return v is not None and v == v and abs(v) != float("inf")


def _rel(p: str, root: Path) -> str:
    try:
        return str(Path(p).relative_to(root))
    except ValueError:
        return p
