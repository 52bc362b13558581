"""`titan drill` and `titan report` on the same run directory print the same numbers: the
drill's summary and per-fault RTO / steps lost come from the run's accounting (titan.sla),
the one the report draws — a real quick-plan drill (NaN, spike, kill, hang), field by field.
The same run's events drive the progress bar's phases, and its verdict table is printed at
100 columns."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(400)


def _titan(tmp_path: Path, *argv: str, timeout: float = 360) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "titan", *argv], cwd=tmp_path, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, COLUMNS="200"))


def test_drill_summary_and_report_agree_field_by_field(tmp_path):
    p = _titan(tmp_path, "drill", "--json", "--no-reference", "--runs-dir", str(tmp_path / "runs"),
               "--timeout", "300")
    try:
        drill = json.loads(p.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"titan drill --json printed no JSON (rc {p.returncode}): {p.stderr[-2000:]}")
    assert drill["steps"] == drill["target_steps"], f"the drill did not finish: {drill['problems']}"
    r = _titan(tmp_path, "report", drill["run_dir"], "--json", "--no-triage")
    assert r.returncode == 0, r.stderr[-2000:]
    (rep,) = json.loads(r.stdout)["runs"]
    incidents = {i["index"]: i for i in rep["incidents"]}
    hard = [i for i in rep["incidents"] if i["kind"] in ("restart", "fatal")]
    rtos = [i["rto_s"] for i in hard if i["rto_s"] is not None]

    # The summary: wall, worst RTO, interruptions, restarts, worker failures, steps lost.
    seen = {"wall_s": (drill["wall_s"], rep["wall_s"]),
            "worst RTO": (drill["rto_s"], max(rtos) if rtos else None),
            "interruptions": (drill.get("figures", {}).get("interruptions"), rep["interruptions"]),
            "restarts": (drill["restarts"], rep["counts"]["restarts"]),
            "worker failures": (drill["failures"], rep["counts"]["worker_failures"]),
            "steps lost": (drill.get("figures", {}).get("steps_lost"), sum(i["rpo_steps"] for i in rep["incidents"])),
            "steps lost (per fault)": (sum(f["steps_lost"] or 0 for f in drill["faults"]),
                                       sum(i["rpo_steps"] for i in rep["incidents"]))}
    differ = {k: v for k, v in seen.items() if v[0] != v[1]}
    assert not differ, f"drill vs report (drill, report): {differ}"
    assert drill["restarts"] == 2 and len(hard) == 2, (drill["restarts"], hard)

    # Every fault: the incident it caused has the fault's step and rank, its RTO and RPO.
    assert [f["kind"] for f in drill["faults"]] == ["nan_grad", "spike", "kill", "hang"]
    for f in drill["faults"]:
        assert f["incident"] in incidents, f"fault {f['id']} caused no incident in the report: {rep['incidents']}"
        inc = incidents[f["incident"]]
        pairs = {"step": (f["step"], inc["step"]), "rank": (f["rank"], inc["rank"]),
                 "RTO": (f["rto_s"], inc["rto_s"]),
                 "steps lost": (f["steps_lost"], inc["rpo_steps"]),
                 "steps skipped": (f["steps_skipped"], inc["skipped_steps"])}
        differ = {k: v for k, v in pairs.items() if v[0] != v[1]}
        assert not differ, f"fault {f['id']} (drill, report incident #{inc['index']}): {differ}"
    by = {f["kind"]: f for f in drill["faults"]}
    assert by["kill"]["steps_lost"] >= 1 and by["hang"]["steps_lost"] >= 1, by
    assert by["nan_grad"]["steps_skipped"] == 1 and by["nan_grad"]["steps_lost"] == 0, by["nan_grad"]

    # What a person reads: the report's Markdown has the drill's worst RTO and steps lost.
    from titan.report.summary import fmt_s

    md = (Path(drill["run_dir"]) / "report" / "summary.md").read_text()
    assert f"worst RTO {fmt_s(drill['rto_s'])}" in md and f"steps lost {drill['figures']['steps_lost']}" in md, md[:800]

    # The progress bar's phases over the same events (the driver feeds them live, in order).
    from titan.chaos.progress import DrillPhase
    from titan.events import read_run

    ph, phases = DrillPhase(), []
    for ev in sorted(read_run(drill["run_dir"]).events, key=lambda e: e.t):
        ph.feed(ev)
        if not phases or phases[-1] != ph.text():
            phases.append(ph.text())
    kill, hang = by["kill"], by["hang"]
    want = ["starting", "training", "killed rank 1, detecting", "restarting (detected: worker.failed)",
            "restoring from the checkpoint", f"recomputing {kill['steps_lost']}/{kill['steps_lost']} lost steps",
            "hang on rank 0, detecting", "restarting (detected: hang.detected)",
            f"recomputing {hang['steps_lost']}/{hang['steps_lost']} lost steps"]
    it = iter(phases)
    missing = [w for w in want if not any(p == w for p in it)]
    assert not missing, f"progress phases {missing} not seen in order; seen {phases}"

    # The human table at 100 columns: nothing wider, no word split.
    from titan.chaos.drills import PlanReport
    from titan.chaos.verdict import FaultVerdict
    from titan.cli._drill_plan import _print
    from titan.cli.environment import Environment

    env = Environment.captured(tmp_path, env={"COLUMNS": "100"})
    _print(env, PlanReport(**{**drill, "faults": [FaultVerdict(**f) for f in drill["faults"]]}))
    out = env.stdout.getvalue()
    wide = [ln for ln in out.splitlines() if len(ln) > 100]
    assert not wide, f"lines wider than 100 columns: {wide}"
    flat = " ".join(out.split())  # a word folded across lines is not in here
    for f in drill["faults"]:
        shown = f["detector"].removeprefix("agent.alert ")  # the table names the detector (an alert by its rule)
        for text in (f["attribution"], f["recovery"], shown):
            split = [w for w in text.split() if w not in flat]
            assert not split, f"{split} of {text!r} split or missing in the table:\n{out}"
