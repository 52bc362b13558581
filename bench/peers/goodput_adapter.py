"""Feed ml-goodput-measurement from a run's own events: Titan's run directory or a step log.

Google's calculator (``ml-goodput-measurement`` 0.2.3) reads a timeline of records that a
``GoodputRecorder`` writes: job start/end, the *start* time of every step, and custom badput
intervals. Its lineage rule: a step number recorded again means the job restarted from it,
so the time of the steps at or after it in the previous segment was wasted. This module
turns a run into those records, then runs the calculator in its own environment
(``goodput_calc.py`` under ``.venv-peers/goodput``):

* job-level step executions (every rank's report of ``(attempt, step, occurrence)``, ending
  when the slowest rank reports) — Titan's own grouping, ``titan.sla.steps.step_executions``,
  reused for every system;
* ``record_job_start_time``: the run's first launcher/worker event (then each attempt's
  first event); ``record_job_end_time``: the end of the last step;
* ``record_step_start_time(k)``: the end of the previous execution of the same attempt
  (an attempt's first step: its end minus its own duration) — so the calculator's step
  interval ``[start(k), start(k+1)]`` is the interval Titan's accounting gives step k; an
  attempt that failed also records the step it had started when it died;
* custom badput: steps whose update the guard skipped (``guard_skipped``) and checkpoint
  save stalls (``checkpoint_save``).

No lineage, bucket or goodput figure of Titan's is passed on: only these facts.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Iterable

from titan.events import Event, read_run
from titan.sla.accounting import corrected_events
from titan.sla.steps import step_executions

from peers.venvs import load_config, python_for

__all__ = ["records_from_titan", "records_from_steplog", "records_from_executions", "calculate"]

HERE = Path(__file__).resolve().parent


def records_from_executions(execs: list[Any], *, job_start: float, attempt_starts: dict[int, float],
                            stalls: Iterable[tuple[float, float]], failed_attempts: set[int],
                            job_end: float | None = None, nonfinite_badput: bool = False) -> list[list[Any]]:
    """GoodputRecorder calls (method, kwargs) for executions ordered by completion time.

    ``nonfinite_badput``: a step whose loss was not finite (a model poisoned by a NaN that
    nothing caught) is recorded as custom badput ``nonfinite_loss`` instead of productive.
    """
    recs: list[tuple[float, int, str, dict[str, Any]]] = [(job_start, 0, "record_job_start_time",
                                                          {"start_time": job_start})]
    for a, t in sorted(attempt_starts.items()):
        if t > job_start:
            recs.append((t, 0, "record_job_start_time", {"start_time": t}))
    by_attempt: dict[int, list[Any]] = {}
    for e in execs:
        by_attempt.setdefault(e.attempt, []).append(e)
    for a, xs in by_attempt.items():
        prev_end: float | None = None
        for e in xs:
            start = prev_end if prev_end is not None else e.t_end - e.dur
            recs.append((start, 1, "record_step_start_time", {"step": e.step, "start_time": start}))
            kind = "guard_skipped" if e.skipped else ("nonfinite_loss" if nonfinite_badput and e.loss is None else None)
            if kind:
                recs.append((start, 2, "record_custom_badput_event_start_time",
                             {"start_time": start, "custom_badput_event_type": kind}))
                recs.append((e.t_end, 0, "record_custom_badput_event_end_time",
                             {"end_time": e.t_end, "custom_badput_event_type": kind}))
            prev_end = e.t_end
        if a in failed_attempts and xs:
            # the step the fault cut short had started when the previous one ended
            recs.append((xs[-1].t_end, 1, "record_step_start_time", {"step": xs[-1].step + 1,
                                                                     "start_time": xs[-1].t_end}))
    for t_end, stall in stalls:
        if stall > 0:
            recs.append((t_end - stall, 2, "record_custom_badput_event_start_time",
                         {"start_time": t_end - stall, "custom_badput_event_type": "checkpoint_save"}))
            recs.append((t_end, 0, "record_custom_badput_event_end_time",
                         {"end_time": t_end, "custom_badput_event_type": "checkpoint_save"}))
    if execs:
        last = max(execs, key=lambda e: e.t_end)
        end = last.t_end
        if job_end is not None and job_end > end:
            # The calculator has no shutdown bucket: it would count everything after the last
            # step start as productive. A boundary record at the job's end closes the last
            # step's interval, and the time after the last step is custom badput "shutdown".
            recs.append((end, 2, "record_custom_badput_event_start_time",
                         {"start_time": end, "custom_badput_event_type": "shutdown"}))
            recs.append((job_end, 0, "record_custom_badput_event_end_time",
                         {"end_time": job_end, "custom_badput_event_type": "shutdown"}))
            recs.append((job_end, 1, "record_step_start_time", {"step": last.step + 1, "start_time": job_end}))
            end = job_end
        recs.append((end, 3, "record_job_end_time", {"end_time": end}))
    recs.sort(key=lambda r: (r[0], r[1]))
    return [[m, kw] for _, _, m, kw in recs]


def records_from_titan(run_dir: str | Path) -> list[list[Any]]:
    """Records from a Titan run directory (its events, clock-corrected)."""
    events = corrected_events(read_run(run_dir))
    job = [e for e in events if not e.kind.startswith("agent.")]
    execs = step_executions(events)
    starts: dict[int, float] = {}
    for e in job:
        if e.attempt is not None:
            starts[e.attempt] = min(starts.get(e.attempt, e.t), e.t)
    last = max((x.attempt for x in execs), default=0)
    spans: dict[tuple[int, int], tuple[float, float]] = {}  # one save: the union over ranks
    for e in events:
        if e.kind == "ckpt.saved" and float(e.data.get("stall_s") or 0.0) > 0:
            key = (e.attempt or 0, int(e.data.get("step", e.step) or 0))
            a, b = e.t - float(e.data["stall_s"]), e.t
            spans[key] = (min(a, spans.get(key, (a, b))[0]), max(b, spans.get(key, (a, b))[1]))
    stalls = [(b, b - a) for a, b in spans.values()]
    return records_from_executions(execs, job_start=min(e.t for e in job), attempt_starts=starts, stalls=stalls,
                                   failed_attempts={x.attempt for x in execs if x.attempt != last},
                                   job_end=max(e.t for e in job))


def records_from_steplog(records: list[dict[str, Any]], *, job_start: float, job_end: float | None = None,
                         ranks: str = "all", nonfinite_badput: bool = False) -> list[list[Any]]:
    """Records from the harness's step log (peers). ``ranks="rank0"``: one replica's view
    (torchft restarts replica groups independently, so no job-wide attempt number exists)."""
    rows = [r for r in records if r["kind"] == "step" and (ranks == "all" or r["rank"] == 0)]
    if ranks == "all":
        attempt = lambda r: int(r.get("restart", 0))  # noqa: E731 - torchrun's restart count
    else:
        pids: dict[int, int] = {}
        for r in sorted(rows, key=lambda r: r["t"]):
            pids.setdefault(r["pid"], len(pids))
        attempt = lambda r: pids[r["pid"]]  # noqa: E731
    events = [Event(kind="step", t=r["t"], mono=0.0, run="peers", node="local", rank=r["rank"], attempt=attempt(r),
                    step=r["step"], data={"step_time_s": r["t"] - r["t_start"], "skipped": bool(r.get("skipped")),
                                          "loss": r.get("loss")}) for r in rows]
    execs = step_executions(events)
    starts: dict[int, float] = {}
    for r in records:
        if r["kind"] == "mark" and r["what"] == "start" and (ranks == "all" or r.get("rank") in (0, None)):
            a = int(r.get("restart", 0)) if ranks == "all" else None
            if a is not None:
                starts[a] = min(starts.get(a, r["t"]), r["t"])
    stalls = [(r["t"], float(r.get("stall_s") or 0.0)) for r in records
              if r["kind"] == "mark" and r["what"] == "saved" and r.get("rank") == 0]
    last = max((x.attempt for x in execs), default=0)
    return records_from_executions(execs, job_start=job_start, attempt_starts=starts, stalls=stalls,
                                   failed_attempts={x.attempt for x in execs if x.attempt != last},
                                   job_end=job_end, nonfinite_badput=nonfinite_badput)


def calculate(records: list[list[Any]], job: str = "peers", timeout_s: float = 120) -> dict[str, Any]:
    """Run the calculator in its own environment; ``{"goodput_pct": …, "badput_pct": {…}}``.

    Raises ``RuntimeError`` when the environment is missing or the calculator fails.
    """
    py = python_for(load_config("goodput"))
    if not py.exists():
        raise RuntimeError(f"no ml-goodput-measurement environment at {py.parent.parent} "
                           "(python bench/peers/venvs.py --build goodput)")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(HERE), "NO_GCE_CHECK": "True"}  # nothing that could lead to credentials
    r = subprocess.run([str(py), str(HERE / "goodput_calc.py")], input=json.dumps({"job": job, "records": records}),
                       capture_output=True, text=True, timeout=timeout_s, env=env)
    if r.returncode:
        raise RuntimeError(f"goodput calculator failed: {r.stderr[-1500:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])
