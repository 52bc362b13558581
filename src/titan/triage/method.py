"""The method: from findings to one verdict (see docs/triage.md for the decision table).

1. Date the failure: the earliest death sign (a process exit, a collective timeout, a
   peer-closed/aborted error). 2. Keep what lies within ±window of it; the window reaches
   back further by the largest collective timeout reported, because a watchdog fires only
   that long after the stall began. 3. Among the causes kept, take the earliest; causes
   within the clock-skew tolerance of it compete on priority (specific beats generic).
4. With no cause, reason from timeouts (the rank absent from the collective the others wait
   in: flight-recorder sequence numbers, watchdog SeqNum, or simply no timeout reported),
   then from exits (the first rank to die, and how). 5. Localise, scope, act.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Iterable

from titan.triage.model import DEFAULT_ACTION, DEFAULT_SCOPE, Finding, Verdict
from titan.triage.scan import FileScan, Progress

__all__ = ["decide", "DEFAULT_SKEW_S"]

#: Clock skew tolerated between nodes' raw logs (NTP-synchronised hosts: well under 1 s).
DEFAULT_SKEW_S = 2.0
_SLOW_RULES = ("throughput_drop", "event:straggler.detected")
_SIGNALS = {-9: "SIGKILL", -15: "SIGTERM", -6: "SIGABRT", -11: "SIGSEGV", -7: "SIGBUS", -2: "SIGINT",
            137: "SIGKILL", 143: "SIGTERM", 134: "SIGABRT", 139: "SIGSEGV"}


def _merge(scans: Iterable[FileScan]) -> tuple[list[Finding], list[Progress], set[int], dict[int, int],
                                               dict[int, str], dict[int, str]]:
    findings: list[Finding] = []
    progress: list[Progress] = []
    ranks: set[int] = set()
    pid_rank: dict[int, int] = {}
    rank_node: dict[int, str] = {}
    rank_gpu: dict[int, str] = {}
    for s in scans:
        findings.extend(s.findings)
        progress.extend(s.progress)
        ranks |= s.ranks
        pid_rank.update(s.pid_rank)
        for r, n in s.rank_node.items():
            rank_node.setdefault(r, n)
        for r, g in s.rank_gpu.items():
            rank_gpu.setdefault(r, g)
    return findings, progress, ranks, pid_rank, rank_node, rank_gpu


def _throughput_drops(progress: list[Progress], order: int) -> list[Finding]:
    """A rank whose step time grew ≥3× its own median before the end: a straggler (precursor)."""
    out: list[Finding] = []
    by_rank: dict[int | None, list[Progress]] = defaultdict(list)
    for p in progress:
        if p.step_time is not None and p.step_time > 0:
            by_rank[p.rank].append(p)
    for rank, ps in by_rank.items():
        ps.sort(key=lambda p: (p.step, p.line))
        if len(ps) < 6:
            continue
        base = statistics.median(p.step_time for p in ps[: len(ps) // 2])  # type: ignore[misc]
        for i, p in enumerate(ps[len(ps) // 2:], start=len(ps) // 2):
            rest = ps[i:]
            if all((q.step_time or 0) >= 3 * base for q in rest[:3]) and base > 0:
                out.append(Finding(rule="throughput_drop", role="precursor", cls=None, file=p.file, line=p.line,
                                   text=f"throughput drop on rank {rank}: step {p.step} took {p.step_time:.3g}s vs "
                                        f"median {base:.3g}s", t=p.t, rank=rank, priority=35, order=(order, p.line),
                                   fields={"ratio": (p.step_time or 0) / base}))
                break
    return out


def _fill(findings: list[Finding], pid_rank: dict[int, int], rank_node: dict[int, str],
          rank_gpu: dict[int, str]) -> None:
    single_node = len(set(rank_node.values())) <= 1
    for f in findings:  # torchrun's own exit lines name local rank and pid
        if f.rule == "torchrun_failed" and single_node and f.pid is not None and "local_rank" in f.fields:
            pid_rank.setdefault(f.pid, int(f.fields["local_rank"]))
    for f in findings:
        if f.rank is None and f.pid is not None and f.pid in pid_rank:
            f.rank = pid_rank[f.pid]
        if f.rank is None and f.rule == "torchrun_failed" and single_node and "local_rank" in f.fields:
            f.rank = int(f.fields["local_rank"])
        if f.node is None and f.rank is not None:
            f.node = rank_node.get(f.rank)
        if f.gpu is None and f.rank is not None and f.cls in ("gpu_hardware", "oom"):
            f.gpu = rank_gpu.get(f.rank)


def _key(f: Finding) -> tuple[float, int, int]:
    return (f.t if f.t is not None else float("inf"), f.order[0], f.order[1])


def decide(scans: list[FileScan], *, window_s: float = 30.0, skew_s: float = DEFAULT_SKEW_S) -> Verdict:
    """Turn the scans of all inputs into a verdict. Pure computation; no I/O."""
    findings, progress, ranks, pid_rank, rank_node, rank_gpu = _merge(scans)
    findings += _throughput_drops(progress, order=10**6)
    _fill(findings, pid_rank, rank_node, rank_gpu)
    for f in findings:
        if f.rank is not None:
            ranks.add(f.rank)
    deaths = [f for f in findings if f.t is not None and (f.role in ("exit", "timeout") or
                                                         (f.role == "symptom" and f.priority >= 18))]
    causes_all = [f for f in findings if f.role == "cause"]
    last_progress = max((p.t for p in progress if p.t is not None), default=None)
    if deaths:  # a death with its own timestamp beats one whose time is inherited (a lower bound)
        own = [f.t for f in deaths if f.t is not None and not f.t_inherited]
        t_fail: float | None = min(own) if own else min(f.t for f in deaths if f.t is not None)
    elif last_progress is not None:  # no death recorded: the job's last sign of life dates the failure
        t_fail = last_progress
    else:
        timed = [f.t for f in causes_all if f.t is not None]
        t_fail = max(timed) if timed else None
    max_timeout = max((float(f.fields.get("timeout_ms", 0)) / 1000.0 for f in findings if f.role == "timeout"),
                      default=0.0)
    if t_fail is not None:
        lo = t_fail - window_s - skew_s - max_timeout
        # without a recorded death, whatever came after the last sign of life is kept
        hi = t_fail + window_s + skew_s if deaths or last_progress is None else float("inf")
        kept = [f for f in findings if f.t is None or lo <= f.t <= hi]
    else:
        kept = list(findings)
    kept.sort(key=_key)
    base = dict(failure_time=t_fail, window_s=window_s)

    causes = [f for f in kept if f.role == "cause"]
    if causes:
        return _from_cause(causes, kept, skew_s, rank_node, **base)
    timeouts = [f for f in kept if f.role == "timeout"]
    if timeouts:
        return _from_timeouts(timeouts, kept, ranks, progress, rank_node, **base)
    exits = [f for f in kept if f.role == "exit"]
    if exits:
        v = _from_exits(exits, kept, **base)
        if v is not None:
            return v
    symptoms = [f for f in kept if f.role == "symptom" and f.priority >= 18]
    if symptoms:
        first = symptoms[0]
        return Verdict(cls="comm_error", culprit=_culprit(None), scope="job", action="restart_from_checkpoint",
                       first_anomaly=first, evidence=_evidence(first, kept), confidence=0.3,
                       reason="only consequences seen (peers closed connections / aborted); the failing rank's own "
                              "log is missing", **base)
    return Verdict(cls=None, culprit=_culprit(None), scope=None, action=None, first_anomaly=None,
                   evidence=_evidence(None, kept), confidence=0.0,
                   reason="no recognised failure signature in the inputs", **base)


def _culprit(f: Finding | None, rank: int | None = None, node: str | None = None) -> dict[str, object]:
    if f is None:
        return {"rank": rank, "node": node, "gpu": None}
    return {"rank": f.rank if rank is None else rank, "node": f.node if node is None else node, "gpu": f.gpu}


def _evidence(first: Finding | None, kept: list[Finding], limit: int = 12) -> list[Finding]:
    out: list[Finding] = [first] if first else []
    seen = {(first.rule, first.rank, first.text[-80:])} if first else set()
    for f in kept:
        if f.role == "precursor" and f.priority < 20:
            continue
        k = (f.rule, f.rank, f.text[-80:])
        if k in seen:
            continue
        seen.add(k)
        out.append(f)
        if len(out) >= limit:
            break
    return out


def _from_cause(causes: list[Finding], kept: list[Finding], skew_s: float, rank_node: dict[int, str],
                **base: object) -> Verdict:
    timed = [f for f in causes if f.t is not None]
    if timed:
        t0 = min(f.t for f in timed if f.t is not None)
        group = [f for f in timed if f.t is not None and f.t <= t0 + skew_s] + [f for f in causes if f.t is None]
    else:
        group = list(causes)
    best = max(group, key=lambda f: (f.priority, -_key(f)[0], -f.order[0], -f.order[1]))
    if best.fields.get("_nolocate"):
        best.rank = None
    if best.rank is None:  # the same message seen elsewhere with its rank (a summary copy vs the rank's own log)
        twins = [f for f in causes if f.rule == best.rule and f.rank is not None and f.text[-60:] == best.text[-60:]]
        if twins:
            best = min(twins, key=_key)
    cls = best.cls or "user_code"
    action = best.action or DEFAULT_ACTION[cls]
    scope = best.scope or DEFAULT_SCOPE[cls]
    why = best.fields.get("why")
    if best.rule == "slurm_cancelled" and why == "NODE FAILURE":
        action, scope = "exclude_node_and_restart", "node"
    if cls == "network" and best.node is None:
        action, scope = "restart_from_checkpoint", "job"
    if cls in ("oom", "hang") and best.rank is not None:
        scope = "process"
    conf = 0.9 if best.priority >= 70 else 0.75 if best.priority >= 40 else 0.5
    if best.t_inherited:
        conf -= 0.05
    same = sum(1 for f in causes if f.cls == cls)
    reason = (f"earliest cause: {best.rule} ({cls})" + (f" on rank {best.rank}" if best.rank is not None else "")
              + (f" on {best.node}" if best.node else "") + (f"; {same - 1} more {cls} lines" if same > 1 else ""))
    return Verdict(cls=cls, culprit=_culprit(best), scope=scope, action=action, first_anomaly=best,
                   evidence=_evidence(best, kept), confidence=conf, reason=reason, **base)  # type: ignore[arg-type]


def _from_timeouts(timeouts: list[Finding], kept: list[Finding], ranks: set[int], progress: list[Progress],
                   rank_node: dict[int, str], **base: object) -> Verdict:
    first = timeouts[0]
    drops = [f for f in kept if f.rule in _SLOW_RULES and f.t is not None and first.t is not None
             and f.t < first.t]
    if drops:  # a slowdown before the timeouts is the earliest anomaly on record
        first = min(drops, key=_key)
    fr = {f.rank: f for f in kept if f.rule == "flight_recorder" and f.rank is not None}
    if len(fr) >= 2:
        seqs = {r: int(f.fields["fr_last_seq"]) for r, f in fr.items()}
        low = min(seqs.values())
        behind = [r for r, s in seqs.items() if s == low]
        if low < max(seqs.values()) and len(behind) == 1:
            f = fr[behind[0]]
            return Verdict(cls="hang", culprit=_culprit(f), scope="process", action="restart_from_checkpoint",
                           first_anomaly=f, evidence=_evidence(f, kept), confidence=0.85,
                           reason=f"flight recorder: rank {behind[0]} last entered collective {low}, others reached "
                                  f"{max(seqs.values())}: it never joined the collective they time out in",
                           **base)  # type: ignore[arg-type]
    seq_by_rank = {f.rank: int(f.fields["seq"]) for f in timeouts if f.rank is not None and "seq" in f.fields}
    if len(set(seq_by_rank.values())) > 1:
        low = min(seq_by_rank.values())
        behind = [r for r, s in seq_by_rank.items() if s == low]
        if len(behind) == 1:
            f = next(x for x in timeouts if x.rank == behind[0])
            return Verdict(cls="hang", culprit=_culprit(f), scope="process", action="restart_from_checkpoint",
                           first_anomaly=f, evidence=_evidence(f, kept), confidence=0.7,
                           reason=f"watchdog: rank {behind[0]} timed out on an earlier collective (SeqNum {low}) "
                                  f"than the others", **base)  # type: ignore[arg-type]
    reporting = {f.rank for f in timeouts if f.rank is not None}
    missing = sorted(ranks - reporting)
    if reporting and missing:
        culprit = missing[0] if len(missing) == 1 else _least_progress(missing, progress)
        return Verdict(cls="hang", culprit=_culprit(None, rank=culprit, node=rank_node.get(culprit) if culprit is not None
                                                    else None),
                       scope="process" if culprit is not None else "job", action="restart_from_checkpoint",
                       first_anomaly=first, evidence=_evidence(first, kept), confidence=0.65,
                       reason=f"ranks {sorted(reporting)} timed out in a collective; rank(s) {missing} reported no "
                              f"timeout: absent from the collective (stuck outside communication)",
                       **base)  # type: ignore[arg-type]
    precursors = [f for f in kept if f.rule in _SLOW_RULES]
    if len(precursors) == 1:
        p = precursors[0]
        return Verdict(cls="hang", culprit=_culprit(p), scope="process", action="restart_from_checkpoint",
                       first_anomaly=p, evidence=_evidence(p, kept), confidence=0.55,
                       reason=f"every rank timed out; rank {p.rank} slowed down first", **base)  # type: ignore[arg-type]
    return Verdict(cls="comm_error", culprit=_culprit(None), scope="job", action="restart_from_checkpoint",
                   first_anomaly=first, evidence=_evidence(first, kept), confidence=0.55,
                   reason="every rank timed out in the same collective and no rank or link is to blame: the "
                          "communication layer itself stalled", **base)  # type: ignore[arg-type]


def _least_progress(candidates: list[int], progress: list[Progress]) -> int | None:
    last = {r: max((p.step for p in progress if p.rank == r), default=-1) for r in candidates}
    low = min(last.values())
    lows = [r for r, s in last.items() if s == low]
    return lows[0] if len(lows) == 1 else None


def _code(f: Finding) -> int | None:
    try:
        return int(f.fields.get("exitcode"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _from_exits(exits: list[Finding], kept: list[Finding], **base: object) -> Verdict | None:
    def sig(f: Finding) -> str | None:
        s = f.fields.get("signal")
        if s:
            s = str(s)
            return {"Killed": "SIGKILL", "Terminated": "SIGTERM", "Aborted": "SIGABRT",
                    "Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS"}.get(s, s)
        c = _code(f)
        return _SIGNALS.get(c) if c is not None else None

    bad = [f for f in exits if sig(f) not in ("SIGTERM", "SIGINT") and (_code(f) not in (0, None) or sig(f))]
    if not bad:
        return None
    roots = [f for f in bad if f.fields.get("root_cause")]
    first = min(roots or bad, key=_key)
    s = sig(first)
    if s == "SIGKILL":
        cls, action, reason = "launcher", "restart_from_checkpoint", (
            "rank killed by SIGKILL with no out-of-memory line in the inputs: killed from outside (scheduler, "
            "operator, or an OOM killer whose kernel log was not collected — add dmesg)")
    elif s in ("SIGSEGV", "SIGBUS"):
        cls, action, reason = "user_code", "fix_code_or_config", f"rank crashed with {s} (native code fault)"
    elif s == "SIGABRT":  # a c10d/NCCL abort prints its reason (a comm_error rule); a bare abort is native code
        cls, action, reason = "user_code", "fix_code_or_config", "rank aborted (SIGABRT) with no communication error logged"
    else:
        cls, action, reason = "user_code", "fix_code_or_config", (
            f"rank exited with code {_code(first)} and no recognised error line")
    return Verdict(cls=cls, culprit=_culprit(first), scope="process" if cls == "launcher" else DEFAULT_SCOPE[cls],
                   action=action, first_anomaly=first, evidence=_evidence(first, kept), confidence=0.5,
                   reason=reason, **base)  # type: ignore[arg-type]
