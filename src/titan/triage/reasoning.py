"""From a chosen first anomaly to a verdict a person can check: action, evidence, reasoning.

The action follows the evidence (labelling conventions, docs/triage.md):

- the same failure again after a restart, a configuration error or a code-level cause →
  ``fix_code_or_config``;
- one node's hardware → ``exclude_node_and_restart``;
- transient, with state lost → ``restart_from_checkpoint``; transient, nothing lost (no
  progress was ever made, a serving job) → ``retry``;
- a one-off numerical glitch → ``skip_step``.

The reasoning is one line per step: first anomaly → domain → scope → action (and what the
later, louder lines are a consequence of). ``candidates`` are the other explanations the
evidence allows; for "no diagnosis" they are the nearest ones, with the reason.

Cost: linear in the findings kept.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import defaultdict

from titan.triage.confidence import adjust
from titan.triage.model import DEFAULT_ACTION, Finding, Verdict
from titan.triage.scan import Progress

__all__ = ["Context", "finish", "choose_action", "mechanism_of"]

#: IB work-completion statuses that mean the host's RDMA setup refused the transfer (protection,
#: access, flushed after such an error) rather than a lost link: ibv_wc_status 4, 5, 8, 9, 10, 11
_IB_CONFIG_STATUS = {"4", "5", "8", "9", "10", "11"}
_IB_CONFIG_ASYNC = ("local access violation", "invalid request")
_SIGNAL_SLURM = {"TIME LIMIT": "restart_from_checkpoint", "PREEMPTION": "restart_from_checkpoint",
                 "NODE FAILURE": "exclude_node_and_restart",
                 # sacct/squeue job states and reasons (rule slurm_job_state)
                 "TIMEOUT": "restart_from_checkpoint", "PREEMPTED": "restart_from_checkpoint",
                 "BOOT_FAIL": "exclude_node_and_restart", "NodeDown": "exclude_node_and_restart"}


@dataclasses.dataclass
class Context:
    kept: list[Finding]
    findings: list[Finding]
    progress: list[Progress]
    ranks: set[int]
    rank_node: dict[int, str]
    skew_s: float


@functools.lru_cache(maxsize=1)
def _mechanisms() -> dict[str, str]:
    from titan.triage.rules import builtin_rules

    return {r.id: r.mechanism for r in builtin_rules() if r.mechanism}


def mechanism_of(rule: str) -> str:
    """The mechanism a built-in rule encodes ('' for derived findings)."""
    return _mechanisms().get(rule, "")


def _k(f: Finding) -> tuple[float, int, int]:
    return (f.t if f.t is not None else float("inf"), f.order[0], f.order[1])


def choose_action(v: Verdict, ctx: Context) -> tuple[str, str]:
    """(action, why) for a diagnosed verdict."""
    f = v.first_anomaly
    cls = v.cls or "user_code"
    rule = f.rule if f else ""
    kept = ctx.kept
    made_progress = bool(ctx.progress)
    if v.action and cls not in ("numerical", "hang", "network"):
        return v.action, "the rule's documented remedy" if rule else "from the exits"
    if cls == "launcher" and rule in ("slurm_cancelled", "slurm_job_state"):
        why = str(f.fields.get("why") or f.fields.get("why2") or f.fields.get("why3") or "") if f else ""
        return _SIGNAL_SLURM.get(why, "restart_from_checkpoint"), (
            f"the scheduler ended the job ({why or 'cancelled'}): nothing is wrong with the program")
    if cls == "numerical":
        return _numerical_action(v, f, kept, ctx.progress)
    if cls == "hang":
        return _hang_action(v, f, ctx)
    if cls == "network":
        return _network_action(f, kept, made_progress)
    if cls == "gpu_hardware":
        return "exclude_node_and_restart", "one node's hardware: take it out, restart from the last checkpoint"
    return v.action or DEFAULT_ACTION[cls], {
        "oom": "memory is exhausted by the job's own size or settings: the same config fails the same way again",
        "user_code": "an exception of the program: restarting runs into it again",
        "comm_error": "the communication library refuses its setup (interfaces, shm, devices, usage): a configuration "
                      "or code change, restarting as-is fails the same way",
        "storage": "the write path failed (space, quota, permissions, the file system under it): fix it first",
        "launcher": "the launch configuration (endpoint, port, world size, environment) is wrong",
    }.get(cls, "the class's default")


def _numerical_action(v: Verdict, f: Finding | None, kept: list[Finding], progress: list[Progress]) -> tuple[str, str]:
    if f is not None and f.rule == "loss_scale_floor":
        return "fix_code_or_config", ("fp16 dynamic loss scaling reached its floor: every step overflows; a "
                                      "precision/config change (bf16, lower LR), not a skip")
    if f is not None and f.action == "restart_from_checkpoint":
        return "restart_from_checkpoint", "the guard escalated: roll back to the last good checkpoint"
    runs = [x for x in kept if x.rule in ("loss_nonfinite_run", "gnorm_nonfinite_run", "loss_collapse")]
    if any(x.fields.get("persistent") for x in runs):
        return "fix_code_or_config", ("NaN/Inf on consecutive steps: not a one-off; the model, data or precision "
                                      "produce it (the same failure again after a skip or restart)")
    if any(x.fields.get("at_start") for x in runs):
        return "fix_code_or_config", ("non-finite from the first logged step, before any finite value: the setup "
                                      "(precision, initialisation, a kernel) produces it, not one bad batch")
    again = _nonfinite_again_after_restart(progress)
    if again is not None:
        return "fix_code_or_config", (f"step {again.step} went non-finite again after the job restarted from an "
                                      "earlier step: the same failure at the same step is deterministic (data, model "
                                      "or precision) — a skip or a restart meets it again")
    spikes = [x for x in kept if x.rule == "loss_spike"]
    if spikes:
        s = spikes[0]
        if not s.fields.get("recovered") and s.fields.get("later"):
            return "fix_code_or_config", (f"the {s.fields.get('kind', 'loss spike')} did not come back down: the "
                                          "training diverged (a model/optimiser/data configuration problem)")
        if s.fields.get("recovered"):
            return "skip_step", "the loss came back to its level: a one-off, skip the step (or batch)"
    if f is not None and f.action:
        return f.action, "the rule's documented remedy"
    if f is not None and f.role == "cause" and not f.rule.startswith("event:") and not _healthy_before(f, progress):
        return "fix_code_or_config", ("a non-finite value with no healthy step logged before it and none after: nothing "
                                      "shows a one-off glitch (that takes finite steps around it), so the setup "
                                      "produces it until changed")
    return "skip_step", "one non-finite step after healthy ones, with no sign it persists: skip it"


def _nonfinite_again_after_restart(progress: list[Progress]) -> Progress | None:
    """A step whose loss went non-finite twice for one process, a lower step logged in between (a restart/resume).

    One process is a rank where the lines say which, else a file; its samples are taken in time order
    (files without stamps: file, then line). A step repeated without a lower one between it (a line logged
    twice) is no restart.
    """
    import math

    by: dict[object, list[Progress]] = defaultdict(list)
    for p in progress:
        if p.counted:
            by[p.rank if p.rank is not None else ("file", p.file)].append(p)
    for ps in by.values():
        ps.sort(key=lambda p: (p.t if p.t is not None else float("inf"), p.file, p.line))
        first_bad: dict[int, int] = {}
        for i, p in enumerate(ps):
            if p.loss is None or math.isfinite(p.loss):
                continue
            j = first_bad.get(p.step)
            if j is not None and any(q.step < p.step for q in ps[j + 1:i]):
                return p
            first_bad.setdefault(p.step, i)
    return None


def _healthy_before(f: Finding, progress: list[Progress]) -> bool:
    """Whether a finite loss/grad-norm step was logged before ``f`` (same file by line, else by time)."""
    import math

    for p in progress:
        vals = [x for x in (p.loss, p.gnorm) if x is not None]
        if not vals or not all(math.isfinite(x) for x in vals):
            continue
        if (p.file == f.file and p.line < f.line) or (p.t is not None and f.t is not None and p.t < f.t):
            return True
    return False


def _hang_action(v: Verdict, f: Finding | None, ctx: Context) -> tuple[str, str]:
    if f is not None and f.action:
        return f.action, "the rule's documented remedy"
    t0 = f.t if f is not None and f.t is not None else None
    frozen = [x for x in ctx.findings if x.rule == "unkillable_worker" and (t0 is None or x.t is None or x.t >= t0)
              and (x.rank is None or v.culprit.get("rank") is None or x.rank == v.culprit.get("rank"))]
    if frozen:
        return "restart_from_checkpoint", (f"the stuck process did not answer SIGTERM ({frozen[0].file}:"
                                           f"{frozen[0].line}): frozen from outside the program (SIGSTOP, D state), "
                                           "a transient; restart from the last checkpoint")
    slow = [x for x in ctx.findings if x.rule == "throughput_drop" and (t0 is None or x.t is None or x.t <= t0)]
    if slow:
        return "restart_from_checkpoint", ("the rank slowed down before it stopped: a degrading device or host, "
                                           "restart (and watch that node)")
    return "fix_code_or_config", ("a stall that no error line explains is code- or config-level (a rank doing other "
                                  "work — evaluation, preprocessing, saving —, uneven control flow, collectives the "
                                  "ranks disagree on, a timeout shorter than the work): restarting meets it again")


def _network_action(f: Finding | None, kept: list[Finding], made_progress: bool) -> tuple[str, str]:
    if f is not None and f.rule == "nccl_socket_fallback":
        return "fix_code_or_config", ("NCCL finds no RDMA device / routes over sockets: the NCCL or host "
                                      "configuration (NCCL_IB_HCA, drivers, container devices), not a broken link")
    net = [x for x in kept if x.cls == "network" and x.role == "cause"]
    recovered = [x for x in kept if x.rule in ("nccl_ib_port_recovered", "kernel_link_up")]
    if f is not None and f.fields.get("port") is not None:  # a state snapshot (rdma link): that port, seen later up
        recovered += [x for x in kept if x.rule == "rdma_link_active" and x.fields.get("port") == f.fields["port"]
                      and (x.t is not None and f.t is not None and x.t >= f.t or x.file == f.file and x.order > f.order
                           or x.file != f.file and (x.t is None or f.t is None))]
    if f is not None and recovered and any(r.t is None or f.t is None or r.t >= f.t for r in recovered):
        if made_progress:
            return "restart_from_checkpoint", "the port came back (a link flap): transient; restart from the checkpoint"
        return "retry", "the port came back (a link flap) and no training state was lost: transient, retry"
    status = {str(x.fields.get("status")) for x in net if x.fields.get("status") is not None}
    what = " ".join(str(x.fields.get("what", "")) for x in net)
    if status & _IB_CONFIG_STATUS or any(a in what for a in _IB_CONFIG_ASYNC):
        return "fix_code_or_config", ("the HCA refused the transfer (protection/access error): the hosts' RDMA "
                                      "configuration (GPU Direct/ACS, MTU, memory registration), not one bad link")
    if f is not None and f.fields.get("_peer_consensus"):
        return "exclude_node_and_restart", (f"the nodes that report fabric errors all name one peer "
                                            f"({f.fields['_peer_consensus']}): its link/NIC failed, exclude it")
    nodes = {x.node for x in net if x.node}
    if len(nodes) >= 2:
        return "fix_code_or_config", (f"the same fabric error on {len(nodes)} nodes at once: a configuration of the "
                                      "fabric or the hosts, not one node")
    ib = [x for x in net if x.rule in ("nccl_ib_completion_error", "nccl_ib_async_event", "ib_retry_exceeded")]
    if ib and not made_progress:
        return "fix_code_or_config", ("the RDMA path failed before any training progress: it never worked "
                                      "(provisioning, subnet/partition, GPU Direct setup), a configuration to fix")
    return "exclude_node_and_restart", "a link/NIC of one node failed: exclude it and restart from the checkpoint"


def _evidence(first: Finding | None, kept: list[Finding], limit: int = 12) -> list[Finding]:
    """The first anomaly and what bears on it, in time order (untimed lines last, in file order)."""
    out: list[Finding] = [first] if first else []
    seen = {(first.rule, first.rank, first.text[-80:])} if first else set()
    for f in kept:
        if f.role == "lifecycle" or (f.role == "precursor" and f.priority < 20):
            continue
        k = (f.rule, f.rank, f.text[-80:])
        if k in seen:
            continue
        seen.add(k)
        out.append(f)
        if len(out) >= limit:
            break
    return sorted(out, key=_k)


def _where(f: Finding) -> str:
    when = f"{_iso(f.t)}" if f.t is not None else "untimed"
    return f"{f.file}:{f.line} ({when})"


def _iso(t: float) -> str:
    from titan.events import utc_iso

    return utc_iso(t)


def _culprit_words(v: Verdict) -> str:
    from titan.triage.render import culprit_text

    return culprit_text(v.culprit)


def _consequences(v: Verdict, kept: list[Finding]) -> str | None:
    f = v.first_anomaly
    if f is None:
        return None
    later = [x for x in kept if x is not f and x.role in ("timeout", "symptom", "exit")
             and (x.t is None or f.t is None or x.t >= f.t)]
    if not later:
        return None
    by: dict[str, set[object]] = defaultdict(set)
    for x in later:
        by[x.rule].add(x.rank if x.rank is not None else x.file)
    parts = [f"{rule} ×{len(who)}" for rule, who in sorted(by.items(), key=lambda kv: -len(kv[1]))[:4]]
    return f"consequences: {len(later)} later line(s) follow from it ({', '.join(parts)}); they are not the cause"


def _alternatives(v: Verdict, kept: list[Finding], limit: int = 3) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    seen = {v.cls}
    for f in sorted((x for x in kept if x.role == "cause" and x is not v.first_anomaly),
                    key=lambda x: (-x.priority, _k(x))):
        if f.cls in seen:
            continue
        seen.add(f.cls)
        out.append({"class": f.cls, "rule": f.rule, "file": f.file, "line": f.line, "text": f.text[:200]})
        if len(out) >= limit:
            break
    return out


def _nearest(ctx: Context, limit: int = 3) -> list[dict[str, object]]:
    pool = [f for f in ctx.findings if f.role != "lifecycle" and f.priority > 0]
    out: list[dict[str, object]] = []
    seen: set[tuple[str, str | None]] = set()
    for f in sorted(pool, key=lambda x: ({"cause": 0, "timeout": 1, "exit": 2, "symptom": 3}.get(x.role, 4),
                                         -x.priority, _k(x))):
        key = (f.rule, f.cls)
        if key in seen:
            continue
        seen.add(key)
        out.append({"class": f.cls, "rule": f.rule, "role": f.role, "file": f.file, "line": f.line,
                    "text": f.text[:200]})
        if len(out) >= limit:
            break
    return out


def finish(v: Verdict, ctx: Context) -> Verdict:
    """Fill the action, evidence (time order), reasoning steps, alternatives and confidence."""
    if not v.diagnosed:
        v.candidates = _nearest(ctx)
        v.evidence = _evidence(None, ctx.kept)
        v.steps = [f"no diagnosis: {v.reason}"] + ([
            "nearest candidates: " + "; ".join(f"{c['rule']} ({c['class'] or c['role']}) at {c['file']}:{c['line']}"
                                               for c in v.candidates)] if v.candidates else [])
        return v
    f = v.first_anomaly
    action, why = choose_action(v, ctx)
    v.action = action
    if v.cls in ("oom", "hang") and v.culprit.get("rank") is not None and v.scope != "job":
        v.scope = "process"
    v.evidence = _evidence(f, ctx.kept)
    mech = mechanism_of(f.rule) if f else ""
    steps = []
    if f is not None:
        steps.append(f"first anomaly: {_where(f)} [{f.rule}] {f.text[:160]}")
    steps.append(f"domain: {v.cls} — {v.reason}" + (f" ({mech})" if mech and mech not in v.reason else ""))
    steps.append(f"scope: {v.scope} — culprit {_culprit_words(v)}")
    cons = _consequences(v, ctx.kept)
    if cons:
        steps.append(cons)
    steps.append(f"action: {action} — {why}")
    v.confidence, factors = adjust(v, ctx.kept)
    steps.append(f"confidence: {v.confidence:.2f} — " + "; ".join(factors))
    v.steps = steps
    v.candidates = _alternatives(v, ctx.kept)
    return v
