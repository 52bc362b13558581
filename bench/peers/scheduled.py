"""Measure (3): one run per system under the whole fault schedule — a kill, a hang, a NaN,
a slow rank — and its goodput, computed by the system's own means where it has one and by
ml-goodput-measurement fed from the run's events (``goodput_adapter``).

The kill and the hang of this run are also reported as recovery trials (the quick profile
takes its measures (1) and (2) from here).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import rto
from peers import goodput_adapter
from peers.systems import System

__all__ = ["schedule_for", "scheduled_run"]


def schedule_for(wl: dict[str, Any], steps: int, profile: dict[str, Any] | None = None,
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(external, internal) faults of the workload's schedule for a run of ``steps`` steps
    (a profile may pin the steps: ``schedule_steps``, ``slow_steps``)."""
    profile = profile or {}
    pinned = profile.get("schedule_steps", {})
    external, internal = [], []
    for f in wl["schedule"]:
        step = int(pinned.get(f["kind"], max(2, int(round(f["at"] * steps)))))
        if f["kind"] in rto.EXTERNAL:
            external.append({"kind": f["kind"], "rank": f["rank"], "step": step})
        elif f["kind"] == "slow":
            n = profile.get("slow_steps") or max(f.get("min_steps", 40), int(round(f["steps_fraction"] * steps)))
            internal.append({"kind": "slow", "rank": f["rank"], "step": step, "factor": f["factor"], "steps": n})
        else:
            internal.append({"kind": f["kind"], "rank": f["rank"], "step": step})
    return external, internal


def _fired_internal(job_dir: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for p in (job_dir / "log").glob("fired.*"):
        kind = p.name.split(".")[2]
        try:
            out[kind] = json.loads(p.read_text() or "{}")
        except json.JSONDecodeError:
            out[kind] = {}
    return out


def _own_goodput(system: System, job_dir: Path) -> dict[str, Any]:
    if system.name != "titan":
        return {"goodput": None, "means": f"none: {system.name} has no goodput or badput accounting"}
    from titan.sla.accounting import account_run

    acc = account_run(job_dir / "runs" / "run")
    return {"goodput": round(acc.goodput_fraction, 4), "means": "titan.sla.account_run (titan report)",
            "buckets_s": {k: round(v, 2) for k, v in acc.buckets.items()}, "wall_s": round(acc.wall_s, 1),
            "incidents": len(acc.incidents)}


class _Finished:
    """Every rank marked "done" ``grace_s`` ago: the run is over even when a process of the
    system stays up by design (torchft's lighthouse waits for more quorums; the harness
    used to wait out ``trial_timeout_s`` for it: 100 s of nothing per run, counted as
    torchft's badput). ``t_done``: the last rank's "done" when this ended the run."""

    def __init__(self, world: int, grace_s: float = 20.0) -> None:
        self.world, self.grace_s, self.t_done = world, grace_s, None

    def __call__(self, res: rto.ScheduleResult) -> bool:
        marks = [r["t"] for r in res.job.records if r["kind"] == "mark" and r["what"] == "done"]
        ranks = {r.get("rank") for r in res.job.records if r["kind"] == "mark" and r["what"] == "done"}
        if not set(range(self.world)) <= ranks or time.time() - max(marks) < self.grace_s:
            return False
        res.completed, self.t_done = True, max(marks)
        return True


def scheduled_run(system: System, world: int, steps: int, *, wl: dict[str, Any], profile: dict[str, Any],
                  job_dir: Path) -> dict[str, Any]:
    """The schedule on ``system``: fault reports, goodput (own and ml-goodput-measurement)."""
    external, internal = schedule_for(wl, steps, profile)
    t0 = time.monotonic()
    res = rto.run_schedule(system, world, steps, external, internal, job_dir=job_dir, wl=wl,
                           hang_release_s=profile["hang_release_s"], timeout_s=profile["trial_timeout_s"],
                           done=(finished := _Finished(world)))
    # The job's end: its launcher's exit, or the last rank's "done" when a process stayed up.
    job_end = finished.t_done if finished.t_done is not None else res.t_end
    out: dict[str, Any] = {"steps": steps, "world": world, "wall_s": round(time.monotonic() - t0, 1),
                           "finish_s": round(job_end - res.t_launch, 1),
                           "completed": res.completed, "error": res.error,
                           "schedule": {"external": external, "internal": internal}}
    steps_done = [r for r in res.job.records if r["kind"] == "step"]
    out["final_step"] = max((r["step"] for r in steps_done), default=0)
    finals = [r for r in steps_done if r["step"] == out["final_step"]]
    out["final_loss"] = finals[-1]["loss"] if finals else None
    out["nonfinite_steps"] = len({r["step"] for r in steps_done if not r["finite"]})
    fired = _fired_internal(res.job.dir)
    fire_times = sorted([f.t for f in res.fired] + [v["t"] for v in fired.values() if "t" in v])
    for i, f in enumerate(res.fired):
        nxt = next((t for t in fire_times if t > f.t), None)
        out[f.kind] = rto.fault_report(res, i, world, t_next=nxt)
    dets = system.detections(res.job, res.t_launch)
    for kind, words in (("nan", ("guard.nonfinite", "nonfinite")), ("slow", ("straggler",))):
        spec = next((f for f in internal if f["kind"] == kind), None)
        t = fired.get(kind, {}).get("t")
        hit = next((d for d in dets if t is not None and d.t >= t and any(w in d.what for w in words)), None)
        out[kind] = {"step": spec["step"] if spec else None, "fired": t is not None,
                     "detected_s": round(hit.t - t, 3) if hit else None, "detected_by": hit.what if hit else None,
                     "culprit_named": hit is not None and hit.culprit == (spec or {}).get("rank")}
    out["nan"]["weights_poisoned"] = out["nonfinite_steps"] > 0
    own = _own_goodput(system, res.job.dir)
    out["goodput_own"] = own
    ranks = "rank0" if system.name == "torchft" else "all"
    try:
        lib = goodput_adapter.calculate(goodput_adapter.records_from_steplog(
            res.job.records, job_start=res.t_launch, job_end=job_end, ranks=ranks))
        lib_finite = goodput_adapter.calculate(goodput_adapter.records_from_steplog(
            res.job.records, job_start=res.t_launch, job_end=job_end, ranks=ranks, nonfinite_badput=True))
        out["goodput_lib"] = round(lib["goodput_pct"] / 100, 4)
        out["goodput_lib_finite"] = round(lib_finite["goodput_pct"] / 100, 4)
        out["goodput_lib_badput_pct"] = lib["badput_pct"]
        if system.name == "titan":
            ev = goodput_adapter.calculate(goodput_adapter.records_from_titan(res.job.dir / "runs" / "run"))
            out["goodput_lib_from_titan_events"] = round(ev["goodput_pct"] / 100, 4)
    except (RuntimeError, ValueError) as e:
        out["goodput_lib_error"] = str(e)[:500]
    return out
