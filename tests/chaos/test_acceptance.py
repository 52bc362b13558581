"""The acceptance drills `make test` runs (issue 21): the full plan on 2 ranks — every fault
detected by a named detector, blamed on the right target, recovered, bits equal — with the
hang evidence (py-spy stacks, flight recorder) asserted; the link faults across two network
namespaces; a plan whose faults are switched off fails ("no measurable effect"); random bit
flips between SDC rounds at the default cadence are caught at the next round.

(The quick plan runs in test_plan_drills.py, the kill-at-random-steps resume in
tests/checkpoint/test_resume_distributed.py; longer runs — the soak, ten random kills, the
three-hang drill — are `slow`, under `make test-slow`.)
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
from titan.settings.env import TITAN_CHAOS_NOOP

_NETNS = netns_unavailable_reason() or (None if shutil.which("nft") else "nftables (nft) is not installed")
_ROOT = None if os.geteuid() == 0 else "disk faults mount a tmpfs and a FUSE file system: needs root"


def _why(rep: dict) -> str:
    rows = [{k: f.get(k) for k in ("id", "detector", "culprit", "detection_s", "recovery", "reasons", "effect")}
            for f in rep["faults"]]
    return json.dumps({"problems": rep["problems"], "faults": rows, "run_dir": rep["run_dir"],
                       "final_state_equal": rep["final_state_equal"], "launcher_exit": rep["launcher_exit"]},
                      indent=1, default=str)


def _drill(tmp: Path, plan: Plan, steps: int, **kw) -> dict:
    cfg = PlanDrill(plan=plan, steps=steps, ckpt_every=5, runs_dir=tmp / "runs", **kw)
    return run_plan_drill(cfg, cwd=tmp, env=dict(os.environ)).to_dict()


@pytest.mark.skipif(_ROOT is not None, reason=str(_ROOT))
@pytest.mark.timeout(1000)
def test_full_plan_every_fault_detected_by_name_blamed_recovered_and_bits_equal(tmp_path):
    plan, steps, _ = builtin_plan("full")
    rep = _drill(tmp_path, plan, steps, timeout_s=950)
    assert rep["passed"], _why(rep)
    assert {f["kind"] for f in rep["faults"]} >= {"nan_grad", "inf_loss", "spike", "poison_sample", "bitflip",
                                                  "slow", "disk", "stress", "kill", "hang", "exception", "preempt"}
    for f in rep["faults"]:
        assert f["detector"] and f["culprit"] and f["detection_s"] is not None, f"{f['id']}: {_why(rep)}"
        assert f["effect"]["bit"], f"{f['id']}: the fault had no measurable effect: {f['effect']}"
        assert f["survive_only"] is None, "the full plan marks nothing survive-only"
    by = {f["id"]: f for f in rep["faults"]}
    disk = next(f for f in rep["faults"] if f["kind"] == "disk" and f["what"] == "slow_fsync")
    assert disk["detector"] == "ckpt.slow" and "checkpoints" in disk["culprit"], disk
    stress = next(f for f in rep["faults"] if f["kind"] == "stress")
    assert stress["detector"] == "agent.alert host_pressure" and stress["culprit"].startswith("node node0"), stress
    flip = next(f for f in rep["faults"] if f["kind"] == "bitflip")
    assert flip["step"] % 50 and flip["detector"] == "sdc.mismatch", "a flip between rounds, caught at the next one"
    # The hang evidence: py-spy's native stacks and the flight recorder of the hung rank.
    rd = Path(rep["run_dir"])
    hangs = [json.loads(ln) for p in (rd / "events").glob("watchdog.*.jsonl") for ln in p.read_text().splitlines()
             if '"hang.detected"' in ln]
    data_hang = next(h for h in hangs if h["data"]["culprit"]["phase"] == "data")
    ev = data_hang["data"]["evidence"][str(data_hang["data"]["culprit"]["rank"])]
    spy = Path(ev["py_spy"]).read_text()
    # py-spy --native: the C frame the rank sleeps in under the Python frame of the data hang
    assert "time_sleep" in spy and "RuntimeFaults.begin_step" in spy, f"py-spy stacks of the hung rank: {spy[:900]}"
    fr = json.loads(Path(ev["flight_recorder"]).read_text())
    assert fr.get("entries") and all("gloo" in e.get("profiling_name", "") for e in fr["entries"]), \
        f"the flight recorder dump {ev['flight_recorder']} holds no gloo collective: {str(fr)[:400]}"
    assert by and rep["final_state_equal"] is True


@pytest.mark.netns
@pytest.mark.skipif(_NETNS is not None, reason=str(_NETNS))
@pytest.mark.timeout(420)
def test_link_faults_across_two_namespaces_are_each_detected_and_blamed_on_the_link(tmp_path):
    plan, steps, _ = builtin_plan("net")
    rep = _drill(tmp_path, plan, steps, nodes=2, timeout_s=380, netns_prefix="tca")
    assert rep["passed"] and rep["restarts"] == 0, _why(rep)
    want = {"loss": ("net_link_loss", "net_probe_loss"), "bandwidth": ("net_link_slow", "net_link_loss"), "delay": ("net_link_slow",),
            "partition": ("net_link_down", "net_link_loss")}
    for f in rep["faults"]:
        assert f["detector"] in {f"agent.alert {r}" for r in want[f["what"]]}, _why(rep)
        assert f["culprit"].startswith("link node0<->node1"), f


@pytest.mark.timeout(300)
def test_a_plan_whose_faults_are_switched_off_fails_with_no_measurable_effect(tmp_path):
    plan = (Plan(name="off").nan_grad(rank=1, step=4).slow(rank=0, step=8, factor=4.0, steps=6)
            .add("stress", step=16, what="cpu", workers=0, seconds=2.0).kill(rank=1, step=22))
    plan.save(tmp_path / "off.toml")
    env = Environment.captured(tmp_path, env={**os.environ, TITAN_CHAOS_NOOP: "1"})
    code = cli_run(["drill", "--json", "--plan", str(tmp_path / "off.toml"), "--steps", "28", "--no-reference",
                    "--timeout", "280"], env)
    rep = json.loads(env.stdout.getvalue())
    assert code == ExitCode.DRILL_FAILED and not rep["passed"], _why(rep)
    for f in rep["faults"]:
        assert f["injected"], f"{f['id']}: the switched-off injector must still write its inject.* event"
        assert f["checks"]["measurable effect"] is False, f"{f['id']}: {f['effect']}"
        assert f["reasons"][0].startswith("no measurable effect"), f["reasons"]
    assert rep["restarts"] == 0, "a kill that was switched off must not have killed anything"


@pytest.mark.timeout(420)
def test_random_flips_between_rounds_are_caught_at_the_next_round_at_the_default_cadence(tmp_path):
    from titan.chaos.flips import random_flips, run_flips

    # Flips that persist by design (docs/sdc.md): sign and exponent bits of parameters and of
    # AdamW's second moment; their element, step and rank are random.
    flips = random_flips(3, every=50, seed=int.from_bytes(os.urandom(2), "little"), kinds=("param", "exp_avg_sq"),
                         classes=("sign", "exponent"))
    run = run_flips(flips, every=50, cwd=tmp_path, runs_dir=tmp_path / "runs", env=dict(os.environ), timeout_s=400,
                    workload_args=("--seq-len", "32", "--batch-size", "4"))  # small steps: CI's time budget
    detail = json.dumps(run.to_dict(), indent=1, default=str)[:4000]
    assert all(o.injected for o in run.outcomes), detail
    for o in run.outcomes:
        assert o.detected, f"flip {o.kind} bit {o.bit} at step {o.step} went unseen: {detail}"
        nxt = (o.step // 50 + 1) * 50
        assert o.latency_steps is not None and 0 <= o.latency_steps <= nxt - o.step, \
            f"expected detection by the round at {nxt}: {o}"
        assert o.latency_s is not None and o.latency_s >= 0
    assert run.summary["overall"]["rate"] == 1.0
