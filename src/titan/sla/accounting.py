"""Goodput and badput accounting: every wall-clock second of a run gets one named cause.

The job's wall time ``[T0, T1]`` (first to last launcher/worker event; agent events do
not stretch it) is first *tiled* by a base timeline, then *overlays* take precedence
inside it (``docs/sla.md`` has the full definition):

base (one label per second, no gaps by construction)
  ``startup``     T0 → start of the first step of the first attempt that ran steps
  step interval   end of the previous step (or this step's own start, ``t − step_time_s``,
                  for an attempt's first step) → this step's end; labelled by the
                  lineage: ``goodput`` (kept), ``recompute`` (later lost to a rollback),
                  ``skipped_replayed`` (update skipped, or replayed in-process)
  ``recompute``   last step's end → fault onset (the partial step the fault destroyed)
  ``detection``   fault onset → detection event
  ``restart``     detection → start of the first step of the next attempt
  ``shutdown``    last step (or final detection) → T1
overlays (win over the base)
  ``ckpt_stall``  ``[t − stall_s, t]`` of every ``ckpt.saved``
  ``eval``        ``eval.*`` events with a duration, or ``eval.start``/``eval.end`` pairs

There is no "other" bucket: the buckets partition ``[T0, T1]`` exactly, and
``reconciliation`` compares their sum with the wall time recorded in ``run.json`` when
the launcher recorded one.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import defaultdict
from typing import Any, Iterable, Mapping, Sequence

from titan.events import Event, ReadResult, RunDir, read_run
from titan.sla.incidents import Failure, Incident, attempt_failures, build_incidents, stepless_failures
from titan.sla.steps import KEPT, StepExec, event_attempt, resolve_lineage, step_executions

__all__ = ["BUCKETS", "BUCKET_DOC", "Accounting", "account", "account_run", "corrected_events", "run_outcome"]

BUCKETS: tuple[str, ...] = ("goodput", "startup", "ckpt_stall", "eval", "detection", "restart",
                            "recompute", "skipped_replayed", "shutdown")
BUCKET_DOC: dict[str, str] = {
    "goodput": "steps whose results were kept",
    "startup": "launch to the first step (process start, rendezvous, init, first checkpoint load)",
    "ckpt_stall": "training blocked while a checkpoint was saved (stall_s of ckpt.saved)",
    "eval": "evaluation (eval.* events)",
    "detection": "fault onset to its detection (detection latency)",
    "restart": "detection to the first step of the next attempt (teardown, re-rendezvous, reload)",
    "recompute": "work lost to a rollback: steps later re-executed, and the step the fault cut short",
    "skipped_replayed": "steps whose update the guard skipped, or that it replayed",
    "shutdown": "after the last step (final checkpoint, exit) or after a final failure",
}
_OVERLAY_PRIORITY = ("ckpt_stall", "eval", "skipped_replayed", "restart")


@dataclasses.dataclass
class Accounting:
    """The accounting of one run. Durations in seconds; times UNIX seconds."""

    run_dir: str | None
    t0: float
    t1: float
    buckets: dict[str, float]
    segments: list[tuple[float, float, str]]
    execs: list[StepExec]
    failures: dict[int, Failure]
    incidents: list[Incident]
    reconciliation: dict[str, Any]
    outcome: dict[str, Any]
    overhead: dict[str, Any]
    step_time_sum_kept_s: float
    #: event counts: ``restarts`` (launcher.restart), ``worker_failures`` (worker.failed),
    #: ``submissions`` (launcher.started per node), ``checkpoints`` (saves: distinct
    #: (attempt, step) of ckpt.saved, whatever the number of ranks)
    counts: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def wall_s(self) -> float:
        return self.t1 - self.t0

    @property
    def goodput_fraction(self) -> float:
        return self.buckets["goodput"] / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON summary (no per-step data; the report embeds that separately)."""
        w = self.wall_s
        restarts = [i for i in self.incidents if i.kind in ("restart", "fatal")]
        return {
            "run_dir": self.run_dir, "t0": self.t0, "t1": self.t1, "wall_s": w,
            "goodput_fraction": self.goodput_fraction,
            "buckets_s": dict(self.buckets),
            "buckets_fraction": {k: (v / w if w > 0 else 0.0) for k, v in self.buckets.items()},
            "bucket_definitions": BUCKET_DOC,
            "reconciliation": self.reconciliation, "outcome": self.outcome, "overhead": self.overhead,
            "steps": {"executions": len(self.execs), "kept": sum(1 for e in self.execs if e.label == KEPT),
                      "last_step": max((e.step for e in self.execs), default=None),
                      "step_time_sum_kept_s": self.step_time_sum_kept_s,
                      "loop_gap_in_goodput_s": self.buckets["goodput"] - self.step_time_sum_kept_s},
            "attempts": sorted({e.attempt for e in self.execs}),
            "interruptions": len(restarts),
            "counts": dict(self.counts),
            "incidents": [i.to_dict() for i in self.incidents],
        }


def _merge(iv: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(iv):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _num(x: Any) -> float | None:
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _overlays(events: Sequence[Event]) -> dict[str, list[tuple[float, float]]]:
    ov: dict[str, list[tuple[float, float]]] = defaultdict(list)
    opened: dict[tuple[str, int | None, int], float] = {}
    for ev in events:
        if ev.kind == "ckpt.saved":
            stall = _num(ev.data.get("stall_s"))
            if stall and stall > 0:
                ov["ckpt_stall"].append((ev.t - stall, ev.t))
        elif ev.kind.startswith("eval."):
            key = (ev.node, ev.rank, event_attempt(ev))
            if ev.kind in ("eval.start", "eval.begin"):
                opened[key] = ev.t
                continue
            if ev.kind in ("eval.end", "eval.done") and key in opened:
                ov["eval"].append((opened.pop(key), ev.t))
                continue
            d = next((v for v in (_num(ev.data.get(k)) for k in ("duration_s", "elapsed_s", "eval_s")) if v), None)
            if d and d > 0:
                ov["eval"].append((ev.t - d, ev.t))
    return {k: _merge(v) for k, v in ov.items()}


def _resubmission_overlay(events: Sequence[Event], execs: Sequence[StepExec]) -> list[tuple[float, float]]:
    """A resubmitted job (after a preemption, say) numbers its attempts from 0 again, so its
    first step would span the whole gap — the old job's shutdown, the requeue, the new one's
    start — as if it were training. The gap, last step before a later ``launcher.started``
    to the first step's own start after it, is restart time."""
    out = []
    seen: set[str] = set()
    for ev in events:
        if ev.kind != "launcher.started" or ev.rank is not None:
            continue
        if ev.node not in seen:
            seen.add(ev.node)
            continue
        before = [e.t_end for e in execs if e.t_end <= ev.t]
        after = [e for e in execs if e.t_end > ev.t]
        if before and after:
            nxt = min(after, key=lambda e: e.t_end)
            a, b = max(before), nxt.t_end - nxt.dur
            if b > a:
                out.append((a, b))
    return _merge(out)


def _replay_overlay(events: Sequence[Event], execs: Sequence[StepExec]) -> list[tuple[float, float]]:
    """The wasted first pass of each kept step the guard replayed: step start → fault report."""
    replayed = {(event_attempt(ev), ev.step) for ev in events if ev.kind == "guard.replay" and ev.step is not None}
    if not replayed:
        return []
    fault_t: dict[tuple[int, int], float] = {}
    for ev in events:
        key = (event_attempt(ev), ev.step)
        if ev.kind in ("guard.nonfinite", "guard.spike") and key in replayed:
            fault_t[key] = min(fault_t.get(key, ev.t), ev.t)
    out = []
    for e in execs:
        t = fault_t.get((e.attempt, e.step))
        if e.label == KEPT and t is not None and e.start < t <= e.t_end:
            out.append((e.start, t))
    return _merge(out)


def _base_segments(execs: list[StepExec], failures: dict[int, Failure], t0: float, t1: float,
                   late_attempts: bool, first_fail: float | None = None) -> list[tuple[float, float, str]]:
    segs: list[tuple[float, float, str]] = []

    def add(a: float, b: float, label: str) -> None:
        a, b = max(a, t0), min(b, t1)
        if b > a:
            segs.append((a, b, label))

    cursor = t0
    order: list[int] = []
    for e in execs:
        if e.attempt not in order:
            order.append(e.attempt)
    final_failed = False
    for i, att in enumerate(order):
        ex = [e for e in execs if e.attempt == att]
        first_start = max(cursor, ex[0].t_end - ex[0].dur)
        if i == 0 and first_fail is not None and first_fail < first_start:
            add(cursor, first_fail, "startup")  # an attempt died before its first step:
            cursor = first_fail  # from its detection on, the job is restarting
        add(cursor, first_start, "startup" if i == 0 and cursor == t0 else "restart")
        prev = first_start
        for e in ex:
            e.start = min(prev, e.t_end)
            add(e.start, e.t_end, e.label)
            prev = max(prev, e.t_end)
        cursor = prev
        f = failures.get(att)
        if f is not None:
            onset = min(max(f.onset, cursor), max(f.detect, cursor))
            add(cursor, onset, "recompute")
            add(onset, f.detect, "detection")
            cursor = max(cursor, f.detect)
            final_failed = f.next_attempt is None
    if not order and first_fail is not None:  # no attempt ever stepped
        add(cursor, first_fail, "startup")
        cursor = max(cursor, first_fail)
        final_failed = True
    if final_failed:
        add(cursor, t1, "restart" if late_attempts else "shutdown")
    else:
        add(cursor, t1, "startup" if not order else "shutdown")
    return segs


def _apply_overlays(base: list[tuple[float, float, str]], ov: Mapping[str, list[tuple[float, float]]]
                    ) -> list[tuple[float, float, str]]:
    cuts = sorted({x for a, b, _ in base for x in (a, b)} | {x for iv in ov.values() for a, b in iv for x in (a, b)})
    starts = {k: [a for a, _ in iv] for k, iv in ov.items()}
    out: list[tuple[float, float, str]] = []
    bi = 0
    for a, b in zip(cuts, cuts[1:]):
        mid = (a + b) / 2
        while bi < len(base) and base[bi][1] <= mid:
            bi += 1
        if bi >= len(base) or base[bi][0] > mid:
            continue  # outside [T0, T1]
        label = base[bi][2]
        for k in _OVERLAY_PRIORITY:
            iv = ov.get(k, [])
            j = bisect.bisect_right(starts.get(k, []), mid) - 1
            if j >= 0 and iv[j][0] <= mid < iv[j][1]:
                label = k
                break
        if out and out[-1][2] == label and out[-1][1] == a:
            out[-1] = (out[-1][0], b, label)
        else:
            out.append((a, b, label))
    return out


def run_outcome(events: Sequence[Event], run_json: Mapping[str, Any], final_failed: bool) -> dict[str, Any]:
    """Did the job succeed? ``run.json`` (exit_code/status) wins; else inferred from events."""
    for key in ("exit_code", "returncode"):
        if isinstance(run_json.get(key), int):
            return {"succeeded": run_json[key] == 0, "exit_code": run_json[key], "source": f"run.json {key}"}
    st = run_json.get("status") or run_json.get("outcome")
    if isinstance(st, str):
        return {"succeeded": st.lower() in ("succeeded", "success", "ok", "completed", "done"),
                "status": st, "source": "run.json status"}
    for ev in reversed(events):
        if ev.kind.startswith("launcher.") and isinstance(ev.data.get("exit_code"), int) and ev.rank is None:
            return {"succeeded": ev.data["exit_code"] == 0, "exit_code": ev.data["exit_code"], "source": ev.kind}
    return {"succeeded": not final_failed, "source": "inferred from events (no exit status recorded)"}


def _recorded_wall(run_json: Mapping[str, Any]) -> tuple[float, str] | None:
    for a, b in (("started_at", "finished_at"), ("started_t", "ended_t"), ("start_t", "end_t")):
        s, e = _num(run_json.get(a)), _num(run_json.get(b))
        if s is not None and e is not None and e > s:
            return e - s, f"run.json {a}..{b}"
    for k in ("duration_s", "wall_s"):
        w = _num(run_json.get(k))
        if w and w > 0:
            return w, f"run.json {k}"
    return None


def account(events: Sequence[Event], run_json: Mapping[str, Any] | None = None, *,
            run_dir: str | None = None) -> Accounting:
    """Account a run's events (time-ordered, as ``read_run`` returns them). Cost: O(n log n)."""
    run_json = run_json or {}
    core = [ev for ev in events if not ev.kind.startswith("agent.")] or list(events)
    if not core:
        raise ValueError("no events to account")
    t0, t1 = min(ev.t for ev in core), max(ev.t for ev in core)
    execs = step_executions(core)
    discarded = resolve_lineage(execs, core)
    failures = attempt_failures(core, execs, t1)
    stepless = stepless_failures(core, execs)
    final_failed = any(f.next_attempt is None for f in failures.values())
    last_exec_att = execs[-1].attempt if execs else None
    late = any(ev.rank is not None and last_exec_att is not None and event_attempt(ev) > last_exec_att for ev in core)
    first_fail = min((f.detect for f in stepless), default=None)
    if not execs:
        late = any(f.restarted for f in stepless)
    base = _base_segments(execs, failures, t0, t1, late, first_fail)
    overlays = _overlays(core)
    overlays["skipped_replayed"] = _replay_overlay(core, execs)
    overlays["restart"] = _resubmission_overlay(core, execs)
    segs = _apply_overlays(base, overlays)
    buckets = {k: 0.0 for k in BUCKETS}
    for a, b, label in segs:
        buckets[label] += b - a
    incidents = build_incidents(core, execs, failures, discarded, stepless)
    for inc in incidents:
        if inc.kind == "guard":  # the time the guard threw away at that step (skip, replay's first pass)
            spans = [(e.start, e.t_end) for e in execs if (e.attempt, e.step) == (inc.attempt, inc.step)]
            inc.rpo_s = sum(max(0.0, min(b, hi) - max(a, lo)) for a, b, lab in segs
                            if lab in ("skipped_replayed", "recompute") for lo, hi in spans)
    for inc in incidents:
        win = inc.data.pop("lost_window", None)
        if win is not None:  # RPO in seconds: the recompute-labelled time the rollback threw away
            inc.rpo_s = sum(max(0.0, min(b, win[1]) - max(a, win[0])) for a, b, lab in segs if lab == "recompute")
    total = sum(buckets.values())
    rec: dict[str, Any] = {"wall_s": t1 - t0, "sum_s": total, "reference": "event span T0..T1",
                           "error_fraction": abs(total - (t1 - t0)) / (t1 - t0) if t1 > t0 else 0.0}
    recorded = _recorded_wall(run_json)
    if recorded:
        rec.update(reference=recorded[1], recorded_wall_s=recorded[0],
                   error_fraction=abs(total - recorded[0]) / recorded[0])
    rec["within_1pct"] = rec["error_fraction"] <= 0.01
    overhead = run_json.get("overhead") if isinstance(run_json.get("overhead"), dict) else {}
    return Accounting(
        run_dir=run_dir, t0=t0, t1=t1, buckets=buckets, segments=segs, execs=execs, failures=failures,
        incidents=incidents, reconciliation=rec, outcome=run_outcome(core, run_json, final_failed),
        overhead=overhead or {"measured": False, "note": "no A/B overhead measurement in run.json['overhead']"},
        step_time_sum_kept_s=sum(e.dur for e in execs if e.label == KEPT),
        counts={"restarts": sum(1 for ev in core if ev.kind == "launcher.restart"),
                "worker_failures": sum(1 for ev in core if ev.kind == "worker.failed"),
                "submissions": sum(1 for ev in core if ev.kind == "launcher.started"),
                "checkpoints": len({(event_attempt(ev), ev.data.get("step", ev.step)) for ev in core
                                    if ev.kind == "ckpt.saved"})},
    )


def corrected_events(res: ReadResult) -> list[Event]:
    """The reader's events with each node's clock offset (vs rank 0) subtracted from ``t``."""
    offs = res.clock_offsets
    if not offs or not any(offs.values()):
        return res.events
    return [dataclasses.replace(ev, t=ev.t - offs.get(ev.node, 0.0)) if offs.get(ev.node) else ev for ev in res.events]


def account_run(path: str | RunDir) -> Accounting:
    """Read a run directory and account it; ``UserError`` when it is not a run directory."""
    rd = path if isinstance(path, RunDir) else RunDir.open(path)
    res = read_run(rd)
    if not res.events:
        from titan.errors import UserError

        raise UserError(f"{rd.path} has no events", "run something with `titan run` first")
    return account(corrected_events(res), rd.read_run_json(), run_dir=str(rd.path))
