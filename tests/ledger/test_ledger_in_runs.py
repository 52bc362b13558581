"""The node ledger under real `titan run`s (issue 15): injected faults never strike; excluding
the only node of a job is a give-up (exit 3) that names the strikes, their runs and how to
clear them; the start line says where the ledger lives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from titan.chaos.plan import Plan
from titan.events import read_run
from titan.ledger import Ledger

TITAN = Path(sys.executable).with_name("titan")
NODE = "ledgernode"


def _run(tmp_path: Path, run_id: str, ledger: Path, *sets: str, plan: Plan | None = None, steps: int = 12):
    env = {**os.environ, "TITAN_WATCHDOG_LEDGER_PATH": str(ledger)}
    env.pop("TITAN_CHAOS_PLAN", None)
    if plan is not None:
        env["TITAN_CHAOS_PLAN"] = str(plan.save(tmp_path / f"{run_id}.toml"))
    cmd = [str(TITAN), "run", "--nproc-per-node", "2", "--max-restarts", "0", "--no-agent", "--node-id", NODE,
           "--runs-dir", str(tmp_path / "runs"), "--run-id", run_id, *sets, "--", "-m", "titan.workloads.tinygpt",
           "--steps", str(steps), "--threads", "1", "--log-every", "0", "--no-ckpt"]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=200,
                          start_new_session=True)


def _nans() -> Plan:
    return Plan().nan_grad(rank=1, step=3).nan_grad(rank=1, step=6).nan_grad(rank=1, step=9)


@pytest.mark.timeout(300)
def test_runs_with_injected_nans_never_strike_and_the_next_launch_starts(tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    p = _run(tmp_path, "nans", ledger, plan=_nans())
    assert p.returncode == 0, f"three injected NaNs must not end the job (exit {p.returncode}):\n{p.stderr[-2500:]}"
    assert f"node ledger {ledger}" in p.stderr.splitlines()[0], p.stderr.splitlines()[:2]
    evs = read_run(tmp_path / "runs" / "nans").events
    assert len([e for e in evs if e.kind == "guard.strike"]) == 3, "the guard must still report its 3 strikes"
    assert len([e for e in evs if e.kind == "node.strike_skipped"]) == 3, [e.msg for e in evs if "strike" in e.kind]
    assert Ledger(ledger).strikes() == [], Ledger(ledger).strikes()
    again = _run(tmp_path, "after", ledger, steps=2)
    assert again.returncode == 0, again.stderr[-2000:]


@pytest.mark.timeout(300)
def test_excluding_the_only_node_during_a_run_is_a_give_up_that_names_strikes_runs_and_the_fix(tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    p = _run(tmp_path, "counted", ledger, "--set", "watchdog.strike_injected=true", plan=_nans(), steps=40)
    assert p.returncode == 3, f"expected exit 3 (GAVE_UP), saw {p.returncode}:\n{p.stderr[-2500:]}"
    final = [ln for ln in p.stderr.splitlines() if ln.startswith("titan run: GAVE_UP")]
    assert final, p.stderr[-2000:]
    for want in ("only node", "3 strike(s)", "guard ×3 in run counted", f"titan nodes --clear {NODE} --ledger {ledger}"):
        assert want in final[0], f"{want!r} missing from the final line: {final[0]}"
    meta = json.loads((tmp_path / "runs" / "counted" / "run.json").read_text())
    assert meta["exit_name"] == "GAVE_UP" and "only node" in meta["abort"]["reason"], meta["abort"]


@pytest.mark.timeout(120)
def test_an_excluded_only_node_gives_up_at_the_start_naming_strikes_runs_and_the_fix(tmp_path):
    ledger = tmp_path / "ledger.sqlite"
    led = Ledger(ledger)
    led.add(NODE, "guard", run="monday", detail="transient nonfinite")
    led.add(NODE, "guard", run="monday", detail="transient nonfinite")
    led.add(NODE, "hang", run="tuesday", detail="rank 1 stuck in comm")
    p = _run(tmp_path, "refused", ledger, steps=2)
    assert p.returncode == 3, f"expected exit 3 (GAVE_UP), saw {p.returncode}:\n{p.stderr[-2000:]}"
    err = [ln for ln in p.stderr.splitlines() if ln.startswith(("titan: error:", "hint:"))]
    assert len(err) == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    for want in ("only node", "guard ×2 in run monday", "hang ×1 in run tuesday"):
        assert want in err[0], f"{want!r} missing: {err[0]}"
    assert f"titan nodes --clear {NODE} --ledger {ledger}" in err[1], err[1]
    rd = tmp_path / "runs" / "refused"
    assert not list((rd / "events").glob(f"{NODE}.rank*.jsonl")), "no worker may start on an excluded node"
    meta = json.loads((rd / "run.json").read_text())
    assert meta["exit_code"] == 3 and meta["status"] == "finished", meta
