"""The method: from findings to one verdict (see docs/triage.md for the decision table).

1. Derive what the lines alone do not say (``titan.triage.derive``): stack dumps grouped across
   processes (the odd one out), progress read for slowdowns, loss spikes and NaN runs, ranks
   claimed twice.
2. Date the failure: the earliest death sign (a process exit, a collective timeout, a
   peer-closed/aborted error); keep what lies within ±window of it — reaching back by the
   largest collective timeout reported, because a watchdog fires only that long after the
   stall began. Without a death sign: the last progress line, or everything.
3. Among the causes kept, take the earliest; causes within the clock-skew tolerance of it
   compete on priority (specific beats generic). An earlier cause beats later timeouts.
4. With no cause, reason from timeouts (the rank absent from the collective the others wait
   in: flight-recorder sequence numbers, watchdog SeqNum, or no timeout reported) → ``hang``;
   then from exits (the rank that died, not the peers that saw it go; the launcher's summary
   is not the root cause); then from consequences only (a peer's connection broke and nobody
   died: the network); then a sustained slowdown; then silence (the logs stop without an
   error, an exit or a normal end: progress stopped).
5. Localise, scope, act, explain (``titan.triage.reasoning``).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict

from titan.triage.confidence import prior_for_cause
from titan.triage.derive import drop_superseded, fill_identity, merge, rank_claims, stack_findings
from titan.triage.derive import time_order as _key
from titan.triage.model import DEFAULT_SCOPE, Finding, Verdict
from titan.triage.progress import numerics, slowdown, throughput_drops
from titan.triage.reasoning import Context, finish
from titan.triage.scan import FileScan, Progress

__all__ = ["decide", "DEFAULT_SKEW_S"]

#: Clock skew tolerated between nodes' raw logs (NTP-synchronised hosts: well under 1 s).
DEFAULT_SKEW_S = 2.0
_SLOW_RULES = ("throughput_drop", "event:straggler.detected")
_SIGNALS = {-9: "SIGKILL", -15: "SIGTERM", -6: "SIGABRT", -11: "SIGSEGV", -7: "SIGBUS", -2: "SIGINT",
            137: "SIGKILL", 143: "SIGTERM", 134: "SIGABRT", 139: "SIGSEGV"}
#: consequences: a peer's connection went away, the process is taken down after an earlier failure
_CONSEQUENCE_RULES = ("peer_closed", "nccl_peer_lost", "comm_aborted", "agent_sigterm", "event:dist.error",
                      "event:worker.stopped", "gdb_frame_c10d_teardown")
#: c10d's own teardown after a failed or timed-out NCCL work (ProcessGroupNCCL.cpp WorkNCCL::handleException, formerly
#: handleNCCLGuard): its log lines, or its frame in a native backtrace of the aborted process
_C10D_TEARDOWN = re.compile(r"Some NCCL operations have failed or timed out|taking the entire process down|"
                            r"WorkNCCL::(?:handleNCCLGuard|handleException)")
#: a peer's connection went away (reset, closed): a dead peer's consequence, or with no death anywhere the network
_PEER_LOSS = ("peer_closed", "nccl_peer_lost")


def decide(scans: list[FileScan], *, window_s: float = 30.0, skew_s: float = DEFAULT_SKEW_S) -> Verdict:
    """Turn the scans of all inputs into a verdict. Pure computation; no I/O."""
    findings, progress, ranks, pid_rank, rank_node, rank_gpu = merge(scans)
    ip_host: dict[str, str] = {}
    for sc in scans:
        for ip, h in sc.ip_host.items():
            ip_host.setdefault(ip, h)
    findings += throughput_drops(progress, order=10**6) + slowdown(progress, order=10**6) \
        + numerics(progress, order=10**6) + stack_findings(scans, pid_rank) + rank_claims(findings)
    fill_identity(findings, pid_rank, rank_node, rank_gpu)
    findings = drop_superseded(findings, progress)
    for f in findings:
        if f.rank is not None:
            ranks.add(f.rank)
        if "claim" in f.fields:  # a process announced its rank at start-up: that rank exists
            ranks.add(int(f.fields["claim"][0]))
    deaths = [f for f in findings if f.t is not None and (f.role in ("exit", "timeout") or
                                                         (f.role == "symptom" and f.priority >= 18))]
    causes_all = [f for f in findings if f.role == "cause"]
    last_progress = max((p.t for p in progress if p.t is not None), default=None)
    if deaths:  # a death with its own timestamp beats one whose time is inherited (a lower bound)
        own = [f.t for f in deaths if f.t is not None and not f.t_inherited]
        t_fail: float | None = min(own) if own else min(f.t for f in deaths if f.t is not None)
    elif last_progress is not None:  # no death recorded: the job's last sign of life dates the failure
        t_fail = last_progress
    else:  # nothing dates a failure: every finding is kept, the earliest cause dates it
        timed = [f.t for f in causes_all if f.t is not None]
        t_fail = min(timed) if timed else None
    max_timeout = max((float(f.fields.get("timeout_ms", 0)) / 1000.0 for f in findings if f.role == "timeout"),
                      default=0.0)
    if t_fail is not None and (deaths or last_progress is not None):
        lo = t_fail - window_s - skew_s - max_timeout
        # without a recorded death, whatever came after the last sign of life is kept
        hi = t_fail + window_s + skew_s if deaths else float("inf")
        kept = [f for f in findings if f.t is None or lo <= f.t <= hi]
    else:
        kept = list(findings)
    kept.sort(key=_key)
    base = dict(failure_time=t_fail, window_s=window_s)
    ctx = Context(kept=kept, findings=findings, progress=progress, ranks=ranks, rank_node=rank_node,
                  skew_s=skew_s)
    v = _choose(kept, ranks, progress, rank_node, skew_s, base)
    if v.cls == "network":
        _peer_culprit(v, kept, ip_host)
    endings = [(s.file, *s.ending) for s in scans if s.ending is not None]
    if v.cls == "hang" and v.first_anomaly is not None and v.first_anomaly.rule in ("last_progress", "job_init") \
            and endings:  # the logs do not fall silent: they end in an error no rule recognises
        file, line, text = endings[0]
        v = Verdict(cls=None, culprit=_culprit(None), scope=None, action=None, first_anomaly=None, evidence=[],
                    confidence=0.0, reason=f"the logs end in an error no rule recognises ({file}:{line}: {text[:160]})",
                    **base)
    return finish(v, ctx)


def _peer_host(peer: str, ip_host: dict[str, str]) -> str:
    """``10.0.0.5<43567>`` / ``[fe80::1%ib0]:4521`` -> the host NCCL's bootstrap lines give that address, else the address."""
    addr = re.sub(r"<\d+>$|%\w+|^\[|\](?::\d+)?$", "", peer.strip())
    return ip_host.get(addr, addr)


def _peer_culprit(v: Verdict, kept: list[Finding], ip_host: dict[str, str]) -> None:
    """Fabric errors from several nodes that all name one peer: that peer is the node at fault, not the reporters."""
    named: dict[str, set[str]] = defaultdict(set)
    total: set[str] = set()
    for f in kept:
        if f.cls == "network" and f.role == "cause" and f.fields.get("peer"):
            who = f.node or f.file
            total.add(who)
            named[_peer_host(str(f.fields["peer"]), ip_host)].add(who)
    if not named:
        return
    peer, reporters = max(named.items(), key=lambda kv: len(kv[1]))
    if len(reporters) >= 2 and len(reporters) * 3 >= len(total) * 2 and peer not in reporters:
        v.culprit = {"rank": None, "node": peer, "gpu": None}
        if v.first_anomaly is not None:
            v.first_anomaly.fields["_peer_consensus"] = peer
        v.reason += f"; {len(reporters)} nodes report the fabric error against the same peer {peer}: the fault is there"


#: a cancellation this long after the job's last sign of life follows a stall (a person cancelled a stuck job)
STALL_BEFORE_CANCEL_S = 600.0


def _choose(kept: list[Finding], ranks: set[int], progress: list[Progress], rank_node: dict[int, str],
            skew_s: float, base: dict) -> Verdict:  # type: ignore[type-arg]
    causes = [f for f in kept if f.role == "cause"]
    if causes:
        v = _from_cause(causes, kept, skew_s, **base)
        f = v.first_anomaly
        if f is not None and f.rule == "slurm_cancelled" and not f.fields.get("why") and f.t is not None:
            life = [p.t for p in progress if p.t is not None and p.t < f.t]
            if life and f.t - max(life) >= STALL_BEFORE_CANCEL_S:
                last = max((p for p in progress if p.t is not None and p.t < f.t), key=lambda p: p.t or 0.0)
                lp = Finding(rule="last_progress", role="precursor", cls=None, file=last.file, line=last.line,
                             text=f"last progress line: step {last.step}", t=last.t, rank=last.rank,
                             order=(10**6, last.line))
                return Verdict(cls="hang", culprit=_culprit(None), scope="job", action=None, first_anomaly=lp,
                               evidence=[], confidence=0.5,
                               reason=f"progress stopped {(f.t - max(life)) / 60:.0f} min before the job was cancelled "
                                      "by hand (no reason given): the job was stuck and a person ended it", **base)
        return v
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
        return _from_symptoms(symptoms, kept, **base)
    warns = [f for f in kept if f.rule == "nccl_warn_generic"]
    if warns:  # NCCL only warns when something is wrong: with nothing else, the first warning is the anomaly
        first = warns[0]
        return Verdict(cls="comm_error", culprit=_culprit(first), scope="job", action=None, first_anomaly=first,
                       evidence=[], confidence=0.35,
                       reason=f"no error line but NCCL warned ({len(warns)} warning(s)): the communication library "
                              "reports a problem of its setup", **base)
    net = [f for f in kept if f.role == "precursor" and f.cls == "network" and f.priority >= 20]
    if net:  # nothing failed, but NCCL carries the traffic over sockets: the fabric is not in use
        first = min(net, key=_key)
        return Verdict(cls="network", culprit=_culprit(first), scope="job", action=None, first_anomaly=first,
                       evidence=[], confidence=0.35,
                       reason="no failure line; NCCL uses TCP sockets instead of the RDMA fabric (no IB device found "
                              "or the channels go via NET/Socket)", **base)
    numeric = [f for f in kept if f.role == "precursor" and f.cls == "numerical" and f.priority >= 20]
    if numeric:  # nothing failed, but the numbers misbehaved (overflow skips, NaN/grad-norm spikes)
        first = min(numeric, key=_key)
        return Verdict(cls="numerical", culprit=_culprit(first if first.rank is not None else None), scope="job",
                       action=None, first_anomaly=first, evidence=[], confidence=0.45,
                       reason=f"no failure line; the numbers misbehaved: {len(numeric)} numerical warning(s) "
                              f"({', '.join(sorted({f.rule for f in numeric}))})", **base)
    alive = [f for f in kept if f.role == "lifecycle" and f.fields.get("phase") == "init"] or progress
    ended = [f for f in kept if f.role == "lifecycle" and f.fields.get("phase") == "end"]
    if ended:
        return Verdict(cls=None, culprit=_culprit(None), scope=None, action=None, first_anomaly=None, evidence=[],
                       confidence=0.0, reason=f"the logs show the job finishing normally ({ended[-1].file}:"
                                              f"{ended[-1].line}) and no failure signature", **base)
    slow = [f for f in kept if f.rule == "slowdown"]
    if slow:
        s = min(slow, key=_key)
        return Verdict(cls="gpu_hardware", culprit=_culprit(s), scope="node", action=None, first_anomaly=s,
                       evidence=[], confidence=0.35,
                       reason="no error anywhere, but the job slowed down for good: a synchronous job runs at the pace "
                              "of its slowest device, so one GPU/node has degraded (throttling, a failing part)",
                       **base)
    waits = [f for f in kept if f.role == "lifecycle" and f.fields.get("phase") == "rdzv"]
    if waits and not any(f.role == "lifecycle" and f.fields.get("phase") == "init" and _key(f) > _key(waits[-1])
                         for f in kept) and not progress:
        w = waits[-1]  # the nodes joined the rendezvous and never met
        return Verdict(cls="launcher", culprit=_culprit(None), scope="job", action="retry", first_anomaly=w,
                       evidence=[], confidence=0.4,
                       reason="a node joined the rendezvous and the logs stop without it completing: the other nodes "
                              "never arrived (late, missing, or pointed at another endpoint)", **base)
    if alive:
        last = max(alive, key=lambda x: (x.t if x.t is not None else -1.0, x.line))
        f = last if isinstance(last, Finding) else Finding(
            rule="last_progress", role="precursor", cls=None, file=last.file, line=last.line,
            text=f"last progress line: step {last.step}", t=last.t, rank=last.rank, order=(10**6, last.line))
        return Verdict(cls="hang", culprit=_culprit(None), scope="job", action=None, first_anomaly=f, evidence=[],
                       confidence=0.3,
                       reason="the job started and its logs stop without an error, an exit or a normal end: progress "
                              "stopped (nothing names the stuck rank)", **base)
    return Verdict(cls=None, culprit=_culprit(None), scope=None, action=None, first_anomaly=None,
                   evidence=[], confidence=0.0, reason="no recognised failure signature in the inputs", **base)


def _culprit(f: Finding | None, rank: int | None = None, node: str | None = None) -> dict[str, object]:
    if f is None:
        return {"rank": rank, "node": node, "gpu": None}
    return {"rank": f.rank if rank is None else rank, "node": f.node if node is None else node, "gpu": f.gpu}


#: untimed lines of one file this close to its first cause line count as simultaneous with it
#: (the lines of one traceback); later ones in that file came after it
SAME_FILE_LINES = 8


def _untimed_group(untimed: list[Finding]) -> list[Finding]:
    """Untimed causes: within one file, order is time — keep each file's first cause (and its traceback)."""
    by_file: dict[tuple[int, str], list[Finding]] = defaultdict(list)
    for f in untimed:
        by_file[(f.order[0], f.file)].append(f)
    out: list[Finding] = []
    for fs in by_file.values():
        fs.sort(key=lambda x: x.line)
        out += [f for f in fs if f.line - fs[0].line <= SAME_FILE_LINES]
    return out


def _from_cause(causes: list[Finding], kept: list[Finding], skew_s: float, **base: object) -> Verdict:
    timed = [f for f in causes if f.t is not None]
    untimed = _untimed_group([f for f in causes if f.t is None])
    if timed:
        t0 = min(f.t for f in timed if f.t is not None)
        group = [f for f in timed if f.t is not None and f.t <= t0 + skew_s] + untimed
    else:
        group = untimed
    best = max(group, key=lambda f: (f.priority, -_key(f)[0], -f.order[0], -f.order[1]))
    if best.fields.get("_peer_prone") and best.t is None:
        # what the peers of a dying rank report loses to a program/device failure on another rank (no time order)
        other = [f for f in group if not f.fields.get("_peer_prone") and f.cls in ("user_code", "oom", "gpu_hardware")
                 and f.rank is not None and f.rank != best.rank]
        if other:
            best = max(other, key=lambda f: (f.priority, -_key(f)[0]))
    if best.fields.get("_nolocate"):
        best.rank = None
    if best.fields.get("more"):  # the message names several culprit ranks: no single one
        best.rank = None
    if best.rank is None:  # the same message seen elsewhere with its rank (a summary copy vs the rank's own log)
        tail = best.text[-60:]
        twins = [f for f in causes if f.rule == best.rule and f.rank is not None and
                 (f.text.endswith(tail) or best.text.endswith(f.text[-60:]))]
        if twins:
            best = min(twins, key=_key)
    cls = best.cls or "user_code"
    conf = prior_for_cause(best.priority)  # the evidence moves it (titan.triage.confidence)
    same = sum(1 for f in causes if f.cls == cls)
    reason = (f"earliest cause: {best.rule} ({cls})" + (f" on rank {best.rank}" if best.rank is not None else "")
              + (" (the rank from its GPU index: one node, devices bound as cuda:LOCAL_RANK)"
                 if best.fields.get("rank_from_gpu") and best.rank is not None else "")
              + (" (the rank from torchrun's summary: the only process that failed)"
                 if best.fields.get("rank_from_summary") and best.rank is not None else "")
              + (f" on {best.node}" if best.node else "") + (f"; {same - 1} more {cls} lines" if same > 1 else ""))
    return Verdict(cls=cls, culprit=_culprit(best), scope=best.scope or DEFAULT_SCOPE[cls], action=best.action,
                   first_anomaly=best, evidence=[], confidence=conf, reason=reason, **base)  # type: ignore[arg-type]


def _from_timeouts(timeouts: list[Finding], kept: list[Finding], ranks: set[int], progress: list[Progress],
                   rank_node: dict[int, str], **base: object) -> Verdict:
    """Only timeouts: progress stopped (``hang``); the culprit is the rank the others wait for."""
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
            return Verdict(cls="hang", culprit=_culprit(f), scope="process", action=None,
                           first_anomaly=f, evidence=[], confidence=0.8,
                           reason=f"flight recorder: rank {behind[0]} last entered collective {low}, others reached "
                                  f"{max(seqs.values())}: it never joined the collective they time out in",
                           **base)  # type: ignore[arg-type]
    # sequence numbers count per process group: compare them only for the default group's works (the
    # message's process-group rank is the global one) and status lines of one group
    default_pg = [f for f in timeouts if f.rank is not None and
                  (f.fields.get("pgrank") is None or int(f.fields["pgrank"]) == f.rank)]
    one_pg = len({f.fields.get("pg") for f in timeouts if f.fields.get("enq") is not None}) <= 1
    seq_by_rank = {f.rank: int(f.fields["seq"]) for f in default_pg if "seq" in f.fields}
    if len(default_pg) < len([f for f in timeouts if f.rank is not None]):
        seq_by_rank = {}
    if len(set(seq_by_rank.values())) > 1:
        low = min(seq_by_rank.values())
        behind = [r for r, s in seq_by_rank.items() if s == low]
        if len(behind) == 1:
            f = next(x for x in timeouts if x.rank == behind[0])
            return Verdict(cls="hang", culprit=_culprit(f), scope="process", action=None,
                           first_anomaly=f, evidence=[], confidence=0.65,
                           reason=f"watchdog: rank {behind[0]} timed out on an earlier collective (SeqNum {low}) "
                                  f"than the others", **base)  # type: ignore[arg-type]
    enq = {f.rank: (int(f.fields["seq"]), int(f.fields["enq"])) for f in timeouts
           if f.rank is not None and f.fields.get("enq") is not None}
    if len(enq) >= 2 and one_pg:  # a rank that has not even enqueued the work the others are stuck in is behind them
        stuck = max(s for s, _ in enq.values())
        behind = [r for r, (_, e) in enq.items() if e < stuck]
        if len(behind) == 1 and len(enq) > 1:
            f = next(x for x in timeouts if x.rank == behind[0] and x.fields.get("enq") is not None)
            return Verdict(cls="hang", culprit=_culprit(f), scope="process", action=None, first_anomaly=f,
                           evidence=[], confidence=0.65,
                           reason=f"watchdog: rank {behind[0]} last enqueued work {enq[behind[0]][1]}, the others are "
                                  f"stuck in work {stuck}: it never reached the collective they wait in",
                           **base)  # type: ignore[arg-type]
    odd = _odd_collective(default_pg)
    if odd is not None:
        f, n_same, sig = odd
        return Verdict(cls="hang", culprit=_culprit(f), scope="process", action=None, first_anomaly=f, evidence=[],
                       confidence=0.6,
                       reason=f"watchdog: {n_same} ranks time out in {sig[0]}" + (f" of {sig[1]} elements" if sig[1] else "")
                              + f", rank {f.rank} in {f.fields.get('op')}"
                              + (f" of {f.fields.get('numel')}" if f.fields.get("numel") else "")
                              + ": its collective sequence diverged from the others'", **base)  # type: ignore[arg-type]
    reporting = {f.rank for f in timeouts if f.rank is not None}
    # ranks are numbered from 0: below the highest rank seen, every rank exists even if no line of it is here
    implied = set(range(max(ranks | reporting) + 1)) if reporting and max(ranks | reporting) < 4096 else set()
    missing = sorted((ranks | implied) - reporting)
    if reporting and missing:
        culprit = missing[0] if len(missing) == 1 else _least_progress(missing, progress)
        seen = culprit is not None and culprit in ranks  # a rank whose own lines are here, or one only implied
        return Verdict(cls="hang", culprit=_culprit(None, rank=culprit, node=rank_node.get(culprit) if culprit is not None
                                                    else None),
                       scope="process" if culprit is not None else "job", action=None,
                       first_anomaly=first, evidence=[], confidence=0.6 if seen or culprit is None else 0.45,
                       reason=f"ranks {sorted(reporting)} timed out in a collective; rank(s) {missing} reported no "
                              "timeout" + ("" if seen or culprit is None else " (no line of it is in the inputs; ranks "
                                           "count from 0)") + ": absent from the collective (stuck outside communication)",
                       **base)  # type: ignore[arg-type]
    if reporting and not missing:
        lag = _progress_lag(reporting, progress)
        if lag is not None:
            r, step, others = lag
            return Verdict(cls="hang", culprit=_culprit(None, rank=r, node=rank_node.get(r)), scope="process",
                           action=None, first_anomaly=first, evidence=[], confidence=0.45,
                           reason=f"every rank timed out; rank {r}'s last logged step is {step}, the others reached "
                                  f"{others}: it fell behind before the stall", **base)  # type: ignore[arg-type]
    precursors = [f for f in kept if f.rule in _SLOW_RULES]
    if len(precursors) == 1:
        p = precursors[0]
        return Verdict(cls="hang", culprit=_culprit(p), scope="process", action=None,
                       first_anomaly=p, evidence=[], confidence=0.55,
                       reason=f"every rank timed out; rank {p.rank} slowed down first", **base)  # type: ignore[arg-type]
    n = len(reporting)
    return Verdict(cls="hang", culprit=_culprit(None), scope="job", action=None,
                   first_anomaly=first, evidence=[], confidence=0.5,
                   reason=("the ranks whose logs are here all timed out in a collective" if n > 1 else
                           "a collective timed out") + " and no error line names a cause: progress stopped while a "
                   "rank was elsewhere (other work, uneven control flow, a stalled collective); the timeouts are "
                   "its consequence", **base)  # type: ignore[arg-type]


def _odd_collective(timeouts: list[Finding]) -> tuple[Finding, int, tuple[str, str]] | None:
    """The one rank whose timed-out collective (op, size) differs from what all the others (≥ 2) time out in."""
    sig: dict[int, tuple[str, str]] = {}
    first: dict[int, Finding] = {}
    for f in timeouts:
        if f.rank is not None and f.fields.get("op") and f.rank not in sig:
            sig[f.rank] = (str(f.fields["op"]), str(f.fields.get("numel") or ""))
            first[f.rank] = f
    if len(sig) < 3:
        return None
    count = Counter(sig.values())
    if len(count) != 2:
        return None
    (common, n), (rare, k) = count.most_common()
    if k != 1 or n < 2:
        return None
    r = next(r for r, s in sig.items() if s == rare)
    return first[r], n, common


def _progress_lag(ranks: set[int], progress: list[Progress]) -> tuple[int, int, int] | None:
    """(rank, its last step, the others' lowest last step) when one rank's progress stops behind all the others'."""
    last: dict[int, int] = {}
    for p in progress:
        if p.rank in ranks and p.counted:
            last[p.rank] = max(last.get(p.rank, -1), p.step)
    if len(last) < 2 or len(last) < len(ranks):
        return None
    low = min(last.values())
    behind = [r for r, s in last.items() if s == low]
    rest = [s for r, s in last.items() if s != low]
    if len(behind) != 1 or not rest:
        return None
    return behind[0], low, min(rest)


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


#: NVIDIA's user-space driver libraries (libcuda, libnvidia-ml, libnvidia-ptxjitcompiler…), as the kernel names a VMA
_GPU_DRIVER_LIB = re.compile(r"(?:^|/)lib(?:cuda|nvidia-[\w-]+)\.so\b")


def _sig(f: Finding) -> str | None:
    s = f.fields.get("signal")
    if s:
        s = str(s)
        if s.isdigit():  # a signal number (mpirun 'exited on signal 9')
            return _SIGNALS.get(-int(s), f"signal {s}")
        return {"Killed": "SIGKILL", "Terminated": "SIGTERM", "Aborted": "SIGABRT", "segfault": "SIGSEGV",
                "Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS"}.get(s, s)
    c = _code(f)
    return _SIGNALS.get(c) if c is not None else None


def _from_exits(exits: list[Finding], kept: list[Finding], **base: object) -> Verdict | None:
    """The rank that died, not the peers that saw it go; the launcher's summary is not the root cause."""
    bad = [f for f in exits if _sig(f) not in ("SIGTERM", "SIGINT") and (_code(f) not in (0, None) or _sig(f))]
    if not bad:
        return None
    saw: dict[int, list[Finding]] = defaultdict(list)  # ranks that logged a consequence (peer gone, timeout)
    for f in kept:
        if f.rank is not None and (f.rule in _CONSEQUENCE_RULES or f.role == "timeout"):
            saw[f.rank].append(f)
    own = [f for f in bad if not f.fields.get("consequence") and (f.rank is None or f.rank not in saw)]
    lost = [x for r in saw for x in saw[r] if x.rule in _PEER_LOSS]
    if not own and lost and all(f.rank is not None for f in bad):
        # every rank that died first lost its connections to peers, and none died on its own: the link is the anomaly
        p = min(lost, key=_key)
        return Verdict(cls="network", culprit=_culprit(None), scope="node", action=None, first_anomaly=p,
                       evidence=[], confidence=0.4,
                       reason=f"ranks {sorted({f.rank for f in bad})} exited after losing their connections to peers "
                              "and no rank died on its own: the network between them", **base)  # type: ignore[arg-type]
    pool = own or bad
    first = min(pool, key=lambda f: (0 if _sig(f) in ("SIGKILL", "SIGSEGV", "SIGBUS", "SIGABRT") else 1, _key(f)))
    s = _sig(first)
    others = sorted({f.rank for f in bad if f is not first and f.rank is not None and f.rank != first.rank})
    tail = (f"; ranks {others} exited after seeing it go (consequences)" if others and own else "")
    if s == "SIGKILL":
        cls, action, reason = "launcher", "restart_from_checkpoint", (
            "rank killed by SIGKILL with no out-of-memory line in the inputs: killed from outside (scheduler, "
            "operator, or an OOM killer whose kernel log was not collected — add dmesg)")
    elif s in ("SIGSEGV", "SIGBUS") and _GPU_DRIVER_LIB.search(str(first.fields.get("what") or "")):
        # the kernel names the object the faulting instruction was in: NVIDIA's driver library, not the program
        cls, action, reason = "gpu_hardware", "exclude_node_and_restart", (
            f"a process crashed with {s} inside the GPU driver's library ({first.fields.get('what')}), not in the "
            "program's code: the node's GPU or driver stack is suspect")
    elif s in ("SIGSEGV", "SIGBUS") and any(f.rule == "native_frame_nccl" for f in kept):
        cls, action, reason = "comm_error", "fix_code_or_config", (
            f"rank crashed with {s} in NCCL's own code (the innermost native frames)" +
            (": a bus error there is NCCL touching a shared-memory segment /dev/shm cannot back (a container's "
             "default 64 MB)" if s == "SIGBUS" else ""))
    elif s in ("SIGSEGV", "SIGBUS"):
        cls, action, reason = "user_code", "fix_code_or_config", f"rank crashed with {s} (native code fault)"
    elif s == "SIGABRT" and any(f.cls == "comm_error" and _C10D_TEARDOWN.search(f.text) for f in kept):
        # c10d took the process down itself (its message, or its frame in the core's backtrace): the NCCL failure or
        # timeout it reacted to is the anomaly, and its own line is not in the inputs
        cls, action, reason = "comm_error", None, (
            "rank aborted (SIGABRT) by c10d's NCCL error handling (a failed or timed-out NCCL work taken as fatal); "
            "the communication failure it reacted to is not in the inputs (add every rank's log)")
    elif s == "SIGABRT":  # a c10d/NCCL abort prints its reason (a comm_error rule); a bare abort is native code
        cls, action, reason = "user_code", "fix_code_or_config", "rank aborted (SIGABRT) with no communication error logged"
    else:
        cls, action, reason = "user_code", "fix_code_or_config", (
            f"rank exited with code {_code(first)} and no recognised error line")
    return Verdict(cls=cls, culprit=_culprit(first), scope="process" if cls == "launcher" else DEFAULT_SCOPE[cls],
                   action=action, first_anomaly=first, evidence=[], confidence=0.45 if own else 0.35,
                   reason=reason + tail, **base)  # type: ignore[arg-type]


def _from_symptoms(symptoms: list[Finding], kept: list[Finding], **base: object) -> Verdict:
    """Only consequences: a connection to a peer broke (with no process death anywhere, the network); only the GPU
    driver cleaning up (that GPU); else communicators aborted (the failing rank's log is missing)."""
    first = symptoms[0]
    peers = [f for f in symptoms if f.rule in _PEER_LOSS]
    if peers:
        p = peers[0]
        return Verdict(cls="network", culprit=_culprit(None, node=None), scope="node", action=None, first_anomaly=p,
                       evidence=[], confidence=0.35,
                       reason="connections to peers broke and no process death, exit or other cause is in the inputs: "
                              "the network between them (add the peers' logs to tell a dead peer from a bad link)",
                       **base)  # type: ignore[arg-type]
    gpu = [f for f in symptoms if f.cls == "gpu_hardware"]
    if gpu and len(gpu) == len(symptoms):  # only the driver's clean-up after a GPU error: that GPU, its cause unseen
        g = gpu[0]
        return Verdict(cls="gpu_hardware", culprit=_culprit(g), scope="node", action=None, first_anomaly=g,
                       evidence=[], confidence=0.3,
                       reason="only the GPU driver's clean-up after an earlier error of this GPU is in the inputs "
                              "(the Xid that caused it is missing)", **base)  # type: ignore[arg-type]
    return Verdict(cls="comm_error", culprit=_culprit(None), scope="job", action=None,
                   first_anomaly=first, evidence=[], confidence=0.3,
                   reason="only consequences seen (communicators aborted); the failing rank's own log is missing",
                   **base)  # type: ignore[arg-type]
