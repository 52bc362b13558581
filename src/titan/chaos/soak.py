"""The soak: hours of training under faults drawn from every kind, and what it cost.

``titan drill --plan soak --duration 2h [--every 2m]`` trains tinygpt for about the given
time with one fault about every ``--every`` (default 2 minutes), drawn from every fault
kind the machine can inject (the network kinds with ``--nodes 2``): a shuffled cycle, so a
long soak meets every kind and a short one a random selection. The plan is step-based like
every plan: a short calibration job measures this machine's steps per second first
(:func:`calibrate`), and the soak turns time into steps with it.

Placement keeps each verdict about one fault: faults are at least :data:`MIN_GAP` steps
apart — an SDC round of the default cadence, and the re-learning of every baseline after a
restart (the effect's 20 reference steps, the detectors' ~20 steps or 3 saves), fit
between two — and a bit flip lands strictly between two SDC rounds, with the next fault
after the round.

:func:`soak_summary` reads the finished run: goodput and badput by cause (``titan.sla``),
faults survived, the detection-latency distribution per detector, and whether anything was
lost — every step of the final lineage applied once, each restart resumed from the newest
checkpoint (steps lost = steps recomputed), the SDC rounds agreeing, and, with a reference
run, the final model bitwise equal to it.
"""

from __future__ import annotations

import random
import re
import statistics
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from titan.chaos.plan import Plan
from titan.errors import UserError
from titan.events import read_run

if TYPE_CHECKING:
    from titan.chaos.drills import PlanDrill, PlanReport

__all__ = ["parse_duration", "soak_plan", "calibrate", "soak_summary", "planner_check", "interruption_costs", "SOAK_KINDS", "NET_KINDS", "MIN_GAP"]

MIN_GAP = 120
SDC_EVERY = 50
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}

#: The local fault kinds a soak draws from, with the sizes the built-in plans use.
SOAK_KINDS: list[tuple[str, dict[str, Any]]] = [
    ("nan_grad", {}), ("inf_loss", {}), ("spike", {"factor": 50.0}), ("poison_sample", {}),
    ("bitflip", {"target": "param", "tensor": "*", "index": -1, "bit": 31}),
    ("bitflip", {"target": "exp_avg_sq", "tensor": "*", "index": -1, "bit": 30}),
    ("kill", {}), ("hang", {"where": "collective", "seconds": 120.0}), ("hang", {"where": "data", "seconds": 120.0}),
    ("hang", {"where": "gil", "seconds": 60.0}), ("slow", {"factor": 4.0, "steps": 14}),
    ("exception", {"what": "cuda"}), ("exception", {"what": "comm"}), ("preempt", {}),
    ("disk", {"what": "enospc", "seconds": 2.0}), ("disk", {"what": "slow_fsync", "seconds": 0.5}),
    ("disk", {"what": "corrupt"}), ("disk", {"what": "truncate"}),
    ("stress", {"what": "cpu", "workers": 0, "seconds": 4.0}), ("stress", {"what": "vm", "workers": 2, "seconds": 4.0}),
]
#: Added with ``--nodes 2``.
NET_KINDS: list[tuple[str, dict[str, Any]]] = [
    ("net", {"what": "loss", "percent": 10.0, "seconds": 4.0}), ("net", {"what": "bandwidth", "rate": "4mbit", "seconds": 3.0}),
    ("net", {"what": "delay", "delay_ms": 50.0, "seconds": 3.0}), ("net", {"what": "partition", "seconds": 2.0}),
]
_RANKED = {"nan_grad", "inf_loss", "spike", "bitflip", "kill", "hang", "slow", "exception"}


def parse_duration(text: str | float, what: str = "--duration") -> float:
    """Seconds in ``text``: ``90``, ``90s``, ``20m``, ``2h``, ``1.5h``, ``1d``. ``UserError`` otherwise."""
    if isinstance(text, (int, float)):
        secs = float(text)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(s|m|min|h|d)?\s*", str(text))
        if not m:
            raise UserError(f"{what} {text!r} is not a duration", "e.g. 90, 90s, 20m, 2h")
        secs = float(m.group(1)) * _UNITS[m.group(2) or ""]
    if not secs > 0:
        raise UserError(f"{what} must be > 0, got {text!r}", "e.g. 20m")
    return secs


def soak_plan(duration_s: float, every_s: float = 120.0, *, seed: int = 0, steps_per_s: float = 10.0,
              nodes: int = 1, ranks: int = 2, ckpt_every: int = 5) -> tuple[Plan, int, int]:
    """The soak's plan (see the module doc): ``(plan, steps, ckpt_every)``."""
    if every_s <= 0 or duration_s < every_s:
        raise UserError("soak needs 0 < --every <= --duration", "e.g. --duration 20m --every 2m")
    if steps_per_s <= 0:
        raise UserError("soak: the step rate must be > 0", "calibration measured none")
    rng = random.Random(seed)
    pool = list(SOAK_KINDS) + (list(NET_KINDS) if nodes > 1 else [])
    steps = max(2 * MIN_GAP, int(duration_s * steps_per_s))
    gap = max(MIN_GAP, int(every_s * steps_per_s))
    plan = Plan(name="soak")
    cycle: list[tuple[str, dict[str, Any]]] = []
    s = gap // 2
    while s < steps - gap // 2:
        if not cycle:
            cycle = pool[:]
            rng.shuffle(cycle)
        kind, params = cycle.pop()
        params = dict(params)
        step = s
        if kind == "bitflip":  # strictly between rounds; the round comes before the next fault
            step = s if s % SDC_EVERY else s + 1
            params["seed"] = rng.randrange(1 << 30)
        rank = rng.randrange(ranks) if kind in _RANKED else None
        plan.add(kind, step=step, rank=rank, **params)
        s += gap
    return plan, steps, ckpt_every


def calibrate(cfg: "PlanDrill", *, cwd: Path, env: dict[str, str], steps: int = 80) -> float:
    """This machine's training rate in steps per second (wall, with checkpoints), from one
    fault-free job of ``steps`` steps (its last half). Cost: one short ``titan run``."""
    import dataclasses

    from titan.chaos.jobs import start_job
    from titan.events import RunDir
    from titan.events.rundir import new_run_id

    runs = cfg.runs_dir if cfg.runs_dir.is_absolute() else cwd / cfg.runs_dir
    rd = RunDir.create(runs / ".calibration", f"cal-{new_run_id()}")
    job_cfg = dataclasses.replace(cfg, plan=Plan([], name="calibration"), steps=steps, nodes=1)
    e = {k: v for k, v in env.items() if k != "TITAN_CHAOS_PLAN"}
    with open(rd.path / "console.log", "ab") as fh:
        job = start_job(job_cfg, rd, e, None, [f"watchdog.ledger_path={rd.path / 'ledger.sqlite'}"], cwd, fh)
        try:
            job.procs[0].wait(max(120.0, steps * 2.0))
        except subprocess.TimeoutExpired:
            pass
        finally:
            job.stop()
    ts = sorted(e.t for e in read_run(rd).events if e.kind == "step" and (e.rank or 0) == 0
                and e.step is not None and e.step > steps // 2)
    if len(ts) < 5 or ts[-1] <= ts[0]:
        raise UserError("soak calibration ran no steps", f"see {rd.path / 'console.log'}")
    return (len(ts) - 1) / (ts[-1] - ts[0])


def _q(xs: list[float], p: float) -> float | None:
    return round(xs[min(len(xs) - 1, int(p * len(xs)))], 3) if xs else None


def interruption_costs(acc: Any, events: Any) -> dict[str, list[float]]:
    """What each interruption of a run cost beyond the work the model itself counts lost,
    by kind (the model's ``R``), measured on its accounting ``acc`` and ``events``:

    * ``restart``: a restart incident's onset to the first step of the next attempt
      (detection + restart, ``titan.sla.measured_costs``);
    * ``resubmission``: a preempted job's last step to the resubmitted job's first (the
      restart-labelled time outside every restart incident);
    * ``rollback``: an in-job rollback (SDC, guard escalation) from the start of the first
      step it threw away to the rollback — the replay from the last verified round is its
      cost, as the model knows only one checkpoint interval.

    Costs O(events + steps)."""
    from titan.sla.steps import KEPT

    out: dict[str, list[float]] = {"restart": [], "resubmission": [], "rollback": []}
    windows = []
    for inc in acc.incidents:
        if inc.kind not in ("restart", "fatal") or inc.recovered_t is None:
            continue
        first = next((e for e in acc.execs if e.t_end == inc.recovered_t), None)
        start = first.start if first is not None else inc.recovered_t
        out["restart"].append(start - inc.onset_t)
        windows.append((inc.onset_t - 1e-3, start + 1e-3))
    gap: list[list[float]] = []
    for a, b, label in acc.segments:
        if label == "ckpt_stall" and gap and abs(a - gap[-1][1]) < 1e-6:
            gap[-1][1] = b  # the preemption's own save sits inside the gap
        elif label == "restart" and not any(lo <= a and b <= hi for lo, hi in windows):
            if gap and abs(a - gap[-1][1]) < 1e-6:
                gap[-1][1] = b
            else:
                gap.append([a, b])
    out["resubmission"] = [b - a for a, b in gap]
    seen: set[tuple[int | None, int | None]] = set()
    for ev in events:
        if ev.kind != "guard.rollback" or (ev.attempt, ev.step) in seen:
            continue
        seen.add((ev.attempt, ev.step))
        restored = ev.data.get("restored_step")
        if not isinstance(restored, int):
            continue
        lost = [e for e in acc.execs if e.label != KEPT and e.attempt == ev.attempt and e.step > restored
                and e.t_end <= ev.t + 1e-3]
        if lost:
            out["rollback"].append(ev.t - min(e.start for e in lost))
    return out


def planner_check(report: "PlanReport", acc: Any = None, *, ckpt_every: int = 5) -> dict[str, Any]:
    """What ``titan plan`` predicts for this run from the costs measured in it, next to the
    goodput it had: the model (``titan.sla.plan``) of interruptions at the measured rate —
    restarts, resubmissions after a preemption, in-job rollbacks — each costing its measured
    cost (:func:`interruption_costs`), work cut into segments of ``ckpt_every`` kept steps
    with the measured checkpoint stall after each.

    The model is of steady state: the measured goodput is the kept steps' time over the run
    without its first start-up and its final shutdown (the whole run's is reported too).
    Returns the inputs, the ``titan plan`` command line that reproduces the prediction, both
    goodputs and the difference in points."""
    from titan.events import read_run
    from titan.sla import account_run, measured_costs
    from titan.sla.plan import PlanInput, plan
    from titan.sla.steps import KEPT

    acc = acc if acc is not None else account_run(report.run_dir)
    b, wall = acc.buckets, acc.wall_s
    segs = acc.segments
    lo = next((a for a, _b, lab in segs if lab != "startup"), acc.t0)
    hi = next((bb for _a, bb, lab in reversed(segs) if lab != "shutdown"), acc.t1)
    steady = max(0.0, hi - lo)
    gpus = len({r for e in acc.execs for r in e.ranks}) or 1  # ranks: this machine's "GPUs"
    costs = interruption_costs(acc, read_run(report.run_dir).events)
    every = [x for xs in costs.values() for x in xs]
    kept = sum(1 for e in acc.execs if e.label == KEPT and not e.skipped)
    stall = measured_costs(acc)["ckpt_stall_s"]
    step_s = b.get("goodput", 0.0) / kept if kept else 0.0
    tau = ckpt_every * step_s
    out: dict[str, Any] = {
        "wall_s": round(wall, 1), "steady_s": round(steady, 1), "interruptions": len(every),
        "interruptions_by_kind": {k: len(v) for k, v in costs.items()},
        "cost_s_by_kind": {k: round(statistics.fmean(v), 3) for k, v in costs.items() if v},
        "goodput_steps": kept, "work_s_per_step": round(step_s, 4), "interval_s": round(tau, 4),
        "ckpt_stall_s": stall, "restart_s": round(statistics.fmean(every), 4) if every else None,
        "guard_skipped_s": round(b.get("skipped_replayed", 0.0), 3),
        "measured_goodput": round(b.get("goodput", 0.0) / steady, 4) if steady > 0 else None,
        "measured_goodput_whole_run": round(b.get("goodput", 0.0) / wall, 4) if wall else None}
    if not every or not steady or stall is None or tau <= 0:
        out["predicted_goodput"] = None
        return out
    restart_s = statistics.fmean(every)
    # The model's M is the time between interruptions while the job trains: Daly's process
    # draws the next one over the time a segment runs (a soak's faults strike by step, never
    # during a restart). Over the wall time, restarts included, it is reported beside it.
    up = steady - sum(every)
    mtbi_h = up / 3600.0 / len(every)  # the job's, at its size (a soak's rate is off any fleet's scale)
    out["mtbi_h_wall"] = round(steady / 3600.0 / len(every), 6)
    rate = 1.0 / (mtbi_h * gpus)
    res = plan(PlanInput(gpus=gpus, rate_per_gpu_hour=rate, ckpt_stall_s=stall, restart_s=restart_s,
                         interval_s=tau, cost_source="measured"), simulate=False)
    out.update(gpus=gpus, mtbi_h=round(mtbi_h, 6), predicted_goodput=round(res.goodput, 4),
               predicted_goodput_first_order=round(res.goodput_first_order, 4),
               difference_points=round(100 * (res.goodput - out["measured_goodput"]), 2),
               command=(f"titan plan --gpus {gpus} --mtbi-h {mtbi_h:.6g} --ckpt-stall-s {stall:.6g} "
                        f"--restart-s {restart_s:.6g} --interval-s {tau:.6g} --no-sim --json"))
    return out


def soak_summary(report: "PlanReport", *, every_s: float | None = None, ckpt_every: int = 5) -> dict[str, Any]:
    """Goodput, faults survived, detection latencies, "nothing lost" and the planner's
    prediction of the goodput, for a finished soak."""
    from titan.sla import account_run, measured_costs

    acc = account_run(report.run_dir)
    wall = acc.wall_s or report.wall_s
    buckets = {k: float(v) for k, v in acc.buckets.items()}
    good = buckets.get("goodput", 0.0)
    faults = report.faults
    lat: dict[str, list[float]] = {}
    for f in faults:
        if f.detection_s is not None and f.detector:
            lat.setdefault(f.detector, []).append(f.detection_s)
    all_lat = sorted(x for xs in lat.values() for x in xs)
    restarts = [i for i in acc.incidents if i.kind in ("restart", "fatal")]
    evs = read_run(report.run_dir).events
    rounds = [e for e in evs if e.kind == "sdc.round"]
    unrepaired = [e for e in evs if e.kind in ("sdc.persistent", "sdc.unrepaired")]
    lineage_ok = report.steps == report.target_steps
    recomputed_ok = all((f.steps_lost or 0) >= 0 for f in faults)
    lost = {"reached_last_step": lineage_ok, "steps_recomputed": report.steps_recomputed,
            "restarts_resumed_from_checkpoint": recomputed_ok, "sdc_rounds": len(rounds),
            "sdc_unrepaired": len(unrepaired), "final_model_bitwise_equal_reference": report.final_state_equal}
    lost["nothing_lost"] = bool(lineage_ok and recomputed_ok and not unrepaired
                                and report.final_state_equal is not False)
    return {
        "wall_s": round(wall, 1), "goodput": round(good / wall, 4) if wall else None,
        "buckets_s": {k: round(v, 2) for k, v in buckets.items()},
        "faults": len(faults), "faults_survived": sum(f.passed for f in faults),
        "faults_by_kind": _by_kind(faults), "every_s": every_s,
        "interruptions": len(restarts), "interruptions_per_hour": round(len(restarts) / (wall / 3600.0), 2) if wall else None,
        "detection_latency_s": {"all": {"median": statistics.median(all_lat) if all_lat else None,
                                        "p90": _q(all_lat, 0.9), "max": all_lat[-1] if all_lat else None,
                                        "n": len(all_lat)},
                                **{k: {"median": statistics.median(v), "max": max(v), "n": len(v)}
                                   for k, v in sorted(lat.items())}},
        "measured_costs": measured_costs(acc), "lost": lost,
        "planner": planner_check(report, acc, ckpt_every=ckpt_every),
    }


def _by_kind(faults: list[Any]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for f in faults:
        k = f.kind + (f" {f.what}" if f.what else "")
        row = out.setdefault(k, {"n": 0, "passed": 0})
        row["n"] += 1
        row["passed"] += int(f.passed)
    return out
