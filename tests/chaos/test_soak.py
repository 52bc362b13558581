"""The soak (`make test-slow`): 20 minutes of training under faults drawn from every kind,
about one every 2 minutes — every fault survived and detected, nothing lost — and `titan
plan`, fed the soak's measured fault rate, restart cost and checkpoint stall, predicts its
goodput within 2 points. The result is printed (docs/sla.md keeps the last one)."""

from __future__ import annotations

import json
import os

import pytest

from titan.chaos.soak import SOAK_KINDS, parse_duration, soak_plan
from titan.cli.environment import Environment
from titan.cli.main import run as cli_run
from titan.errors import UserError
from titan.exitcodes import ExitCode


@pytest.mark.parametrize("text, seconds", [("90", 90.0), ("90s", 90.0), ("20m", 1200.0), ("2h", 7200.0),
                                           ("1.5h", 5400.0), ("1d", 86400.0)])
def test_durations_take_units(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "2x", "-5m", "0", "h", "1 2m"])
def test_a_duration_without_a_number_and_unit_is_refused(text):
    with pytest.raises(UserError):
        parse_duration(text)


def test_the_soak_plan_draws_from_every_kind_and_keeps_each_verdict_about_one_fault():
    plan, steps, every = soak_plan(7200, 120, steps_per_s=10.0, seed=3)
    kinds = {(f.kind, f.params.get("what") or f.params.get("where") or f.params.get("target")) for f in plan.faults}
    want = {(k, p.get("what") or p.get("where") or p.get("target")) for k, p in SOAK_KINDS}
    assert kinds == want, f"a 2 h soak meets every kind: missing {want - kinds}"
    gaps = [b.step - a.step for a, b in zip(plan.faults, plan.faults[1:])]
    assert min(gaps) >= 120 and abs(len(plan.faults) - 7200 / 120) <= 2, (min(gaps), len(plan.faults))
    for f in plan.faults:
        if f.kind == "bitflip":
            assert f.step % 50, "a flip lands between two SDC rounds"
    assert steps == 72000 and every == 5


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="disk faults mount a tmpfs and a FUSE file system: needs root")
@pytest.mark.timeout(4800)
def test_twenty_minute_soak_survives_every_fault_and_the_planner_predicts_its_goodput(tmp_path):
    env = Environment.captured(tmp_path)
    code = cli_run(["drill", "--plan", "soak", "--duration", "20m", "--every", "2m", "--no-reference", "--json",
                    "--seed", "21"], env)
    rep = json.loads(env.stdout.getvalue())
    soak = rep["soak"]
    print("SOAK", json.dumps({k: soak[k] for k in soak if k != "faults_by_kind"}, default=str))
    print("SOAK faults", json.dumps(soak["faults_by_kind"]))
    bad = [{k: f[k] for k in ("id", "detector", "culprit", "reasons")} for f in rep["faults"] if not f["passed"]]
    assert code == ExitCode.SUCCEEDED and rep["passed"], json.dumps({"failed": bad, "problems": rep["problems"]})
    assert soak["faults"] >= 8 and soak["faults_survived"] == soak["faults"]
    assert soak["detection_latency_s"]["all"]["n"] == soak["faults"], "every fault detected"
    assert soak["lost"]["nothing_lost"], soak["lost"]
    p = soak["planner"]
    assert p["predicted_goodput"] is not None, p
    # The same prediction from the command line.
    env2 = Environment.captured(tmp_path)
    assert cli_run(p["command"].split()[1:], env2) == ExitCode.SUCCEEDED
    assert abs(json.loads(env2.stdout.getvalue())["expected_goodput"] - p["predicted_goodput"]) < 1e-3
    assert abs(p["predicted_goodput"] - p["measured_goodput"]) <= 0.02, \
        f"titan plan predicted {p['predicted_goodput']:.3f}, the soak measured {p['measured_goodput']:.3f}: {p}"


def test_the_planner_check_counts_every_interruption_kind_at_its_measured_cost(tmp_path):
    # A preemption whose resubmitted job stepped again 7 s after the old one's last step, then
    # a kill (onset -> first step of the next attempt: detection 2 + restart 3). The
    # model's inputs are the run's own: 2 interruptions over its steady state, mean cost of
    # the two, the stall after every 5 steps.
    from types import SimpleNamespace

    from titan.chaos.soak import planner_check
    from titan.sla.synthetic import SynthRun

    r = SynthRun(world=2).startup(5).steps(10, ckpt_every=5, stall=0.5).end(1, exit_code=9)
    r.attempt = 0  # the resubmitted job numbers its attempts from 0 again
    r.emit("launcher.started", rank=None, data={"world": 2})
    r.startup(6)
    for rank in range(2):
        r.emit("ckpt.loaded", rank=rank, step=10, data={"step": 10})
    r.steps(7, ckpt_every=5, stall=0.5).fault("inject.kill", rank=1, after=0.4).detect(2)
    rd = r.restart(3, resume_from=15).steps(10, ckpt_every=5, stall=0.5).end(1).write(tmp_path)
    p = planner_check(SimpleNamespace(run_dir=str(rd.path)), ckpt_every=5)
    assert p["interruptions_by_kind"] == {"restart": 1, "resubmission": 1, "rollback": 0}, p
    assert p["cost_s_by_kind"]["restart"] == pytest.approx(5.0, abs=1e-3), p  # onset -> next attempt's first step
    assert p["cost_s_by_kind"]["resubmission"] == pytest.approx(7.0, abs=1e-3), p
    assert p["ckpt_stall_s"] == pytest.approx(0.5, abs=1e-6) and p["interval_s"] == pytest.approx(5.0, abs=1e-3), p
    assert p["predicted_goodput"] is not None and "--restart-s 6 " in p["command"], p
