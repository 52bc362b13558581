"""Plan-driven drills end to end: real `titan run` jobs, real faults, verdicts that can fail.

CI runs the quick plan (through the CLI, as `make demo` does), the defence-off case, plan
mistakes and a kill on one of two namespace nodes; the full plan, the link faults and the
switched-off plan are in test_acceptance.py; the 1 % loss ride-through, a 20 s partition and
the soak are `slow` (`make test-slow`).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from titan.chaos.builtin_plans import builtin_plan
from titan.chaos.drills import PlanDrill, run_plan_drill
from titan.chaos.netns import netns_unavailable_reason
from titan.chaos.plan import Plan
from titan.cli.environment import Environment
from titan.cli.main import run as cli_run
from titan.exitcodes import ExitCode

_NETNS = netns_unavailable_reason() or (None if shutil.which("nft") else "nftables (nft) is not installed")


def _failed(rep: dict) -> str:
    rows = [{k: f[k] for k in ("id", "detected_by", "attribution", "recovery", "checks")} for f in rep["faults"]]
    return json.dumps({"problems": rep["problems"], "faults": rows, "run_dir": rep["run_dir"],
                       "final_state_equal": rep["final_state_equal"], "launcher_exit": rep["launcher_exit"]}, indent=1)


def _drill(tmp: Path, plan: Plan, steps: int, *, nodes: int = 1, sets: tuple[str, ...] = (),
           reference: bool = True, timeout: float = 280.0, prefix: str = "tcd"):
    cfg = PlanDrill(plan=plan, steps=steps, ckpt_every=5, nodes=nodes, runs_dir=tmp / "runs", timeout_s=timeout,
                    sets=sets, reference=reference, netns_prefix=prefix)
    return run_plan_drill(cfg, cwd=tmp, env=dict(os.environ)).to_dict()


@pytest.mark.timeout(330)
def test_titan_drill_default_quick_plan_passes_every_fault_with_bitwise_equal_final_model(tmp_path):
    env = Environment.captured(tmp_path)
    code = cli_run(["drill", "--json", "--timeout", "300"], env)
    rep = json.loads(env.stdout.getvalue())
    assert code == ExitCode.SUCCEEDED and rep["passed"], _failed(rep)
    kinds = [f["kind"] for f in rep["faults"]]
    assert kinds == ["nan_grad", "spike", "kill", "hang"], kinds
    by = {f["kind"]: f for f in rep["faults"]}
    assert by["nan_grad"]["detected_by"].startswith("guard") and by["spike"]["detected_by"].startswith("guard")
    assert by["kill"]["detected_by"].startswith("launcher") and by["kill"]["steps_lost"] == 2
    assert by["hang"]["detected_by"].startswith("watchdog") and "phase comm" in by["hang"]["attribution"]
    assert rep["final_state_equal"] is True and rep["skipped_steps"] == [4, 13] and rep["restarts"] >= 2
    for f in rep["faults"]:
        for key in ("kind", "rank", "node", "step", "expected", "detected", "detected_by", "detection_s",
                    "attributed_ok", "recovered", "recovery", "rto_s", "steps_lost", "final_state_equal"):
            assert key in f, key
    assert json.loads((Path(rep["run_dir"]) / "chaos" / "verdict.json").read_text())["passed"] is True


@pytest.mark.parametrize("argv, message", [
    (["--plan", "no-such-plan"], "no built-in plan and no file"),
    (["--plan", "net"], "add --nodes 2"),
    (["--plan", "quick", "--steps", "10"], "ends before the plan's last fault"),
])
def test_plan_mistakes_get_one_line_and_exit_2(tmp_path, argv, message):
    env = Environment.captured(tmp_path)
    code = cli_run(["drill", *argv], env)
    err = env.stderr.getvalue()
    assert code == ExitCode.USER_ERROR and message in err and "Traceback" not in err, err
    assert not (tmp_path / "runs").exists(), "a rejected drill must not create a run directory"


@pytest.mark.timeout(200)
def test_a_fault_whose_defence_is_switched_off_fails_the_drill(tmp_path):
    env = Environment.captured(tmp_path)
    plan = Plan(name="guard-off").nan_grad(rank=1, step=3)
    plan.save(tmp_path / "p.toml")
    code = cli_run(["drill", "--json", "--plan", str(tmp_path / "p.toml"), "--steps", "6", "--no-reference",
                    "--set", "guard.enabled=false", "--timeout", "180"], env)
    rep = json.loads(env.stdout.getvalue())
    assert code == ExitCode.DRILL_FAILED and not rep["passed"], _failed(rep)
    (f,) = rep["faults"]
    assert f["injected"] and not f["detected"] and f["checks"]["detected"] is False, _failed(rep)


@pytest.mark.slow
@pytest.mark.netns
@pytest.mark.skipif(_NETNS is not None, reason=str(_NETNS))
@pytest.mark.timeout(150)
def test_two_namespace_nodes_ride_out_one_percent_loss_without_a_restart(tmp_path):
    plan, steps, _ = builtin_plan("loss1")
    rep = _drill(tmp_path, plan, steps, nodes=2, timeout=120, prefix="tcl")
    assert rep["passed"], _failed(rep)
    assert rep["restarts"] == 0 and rep["final_state_equal"] is True and rep["wall_s"] <= 60, rep["wall_s"]


@pytest.mark.netns
@pytest.mark.skipif(_NETNS is not None, reason=str(_NETNS))
@pytest.mark.timeout(330)
def test_a_kill_on_one_of_two_nodes_restarts_both_and_they_meet_again(tmp_path):
    # A node-local failure leaves the two agents with different restart counts; the new
    # workers must still meet (they once did not: a restart-count-keyed store prefix).
    rep = _drill(tmp_path, Plan().kill(rank=1, step=12), 24, nodes=2, timeout=300, prefix="tck")
    assert rep["passed"], _failed(rep)
    (f,) = rep["faults"]
    assert f["recovered"] and f["final_state_equal"] and f["steps_lost"] >= 1, (f, _failed(rep))


@pytest.mark.slow
@pytest.mark.netns
@pytest.mark.skipif(_NETNS is not None, reason=str(_NETNS))
@pytest.mark.timeout(400)
def test_long_partition_is_a_comm_hang_blamed_on_the_link_and_recovered_after_it_heals(tmp_path):
    plan = Plan(name="partition-long").add("net", step=12, what="partition_long", seconds=12.0)
    rep = _drill(tmp_path, plan, 24, nodes=2, timeout=360, prefix="tcp")
    (f,) = rep["faults"]
    assert rep["passed"], _failed(rep)
    # The probe sees the link go down within seconds; the watchdog's hang verdict follows.
    assert f["detector"] == "agent.alert net_link_down" and f["culprit"].startswith("link node0<->node1"), f
    assert f["recovery"].startswith("restart"), f
    hangs = [json.loads(ln) for p in (Path(rep["run_dir"]) / "events").glob("watchdog.*.jsonl")
             for ln in p.read_text().splitlines() if '"hang.detected"' in ln]
    assert hangs and hangs[0]["data"]["culprit"]["phase"] in ("comm", "backward"), hangs
