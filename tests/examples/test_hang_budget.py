"""Hang detection of a script wired as the README says, during the watchdog's warm-up.

Issue 18's bound: during warm-up a hang is found within the warm-up timeout (after warm-up
within max(5 s, 3 × p99 step): checked on the drilled examples in test_examples.py). The
script is ``examples/ddp.py`` as it is; the hang comes through the library's injection point
(``TITAN_CHAOS_PLAN``: rank 1 sleeps in the DDP comm hook of step 3, long before the
watchdog has 20 samples of anything), and the watchdog must name rank 1 and phase ``comm``
on the warm-up budget, kill the group, and the restarted job must finish. Slow (make test-slow):
two attempts of a titan run are over CI's test-time budget.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from titan.chaos.plan import Plan
from titan.events import read_run

ROOT = Path(__file__).resolve().parents[2]
TITAN = Path(sys.executable).with_name("titan")
WARMUP_S = 8.0
#: The watchdog polls every 0.1 s and then gathers evidence; a loaded box (load 10+) delays
#: its thread by seconds — generous, but far below the 600 s the rank would sleep.
SLACK_S = 20.0


@pytest.mark.slow  # two attempts of a titan run (49 s at load 7-20 here): over CI's test-time budget
@pytest.mark.timeout(300)
def test_a_hang_during_warm_up_is_found_within_the_warm_up_timeout_with_rank_and_phase(tmp_path):
    plan = Plan(name="warmup-hang").hang(rank=1, step=3, where="collective", seconds=600.0)
    env = dict(os.environ, TITAN_CHAOS_PLAN=str(plan.save(tmp_path / "plan.toml")),
               TITAN_WATCHDOG_LEDGER_PATH=str(tmp_path / "ledger.sqlite"))
    argv = [str(TITAN), "run", "--nproc-per-node", "2", "--runs-dir", str(tmp_path / "runs"), "--run-id", "r",
            "--no-agent", "--set", f"watchdog.warmup_timeout_s={WARMUP_S}", "--",
            str(ROOT / "examples" / "ddp.py"), "--epochs", "1", "--batch-size", "64"]
    p = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        raise AssertionError(f"titan run did not finish within 240 s:\n{out[-3000:]}") from None
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 0, f"expected the job to recover and finish (exit 0), saw {p.returncode}:\n{out[-3000:]}"
    events = read_run(tmp_path / "runs" / "r").events
    assert any(e.kind == "inject.hang" for e in events), "the planned hang was never injected"
    hangs = [e for e in events if e.kind == "hang.detected"]
    assert len(hangs) == 1, f"expected one hang.detected, saw {len(hangs)}:\n{out[-3000:]}"
    d = hangs[0].data
    culprit, trig = d["culprit"], d["trigger"]
    assert (culprit["rank"], culprit["phase"]) == (1, "comm"), f"expected rank 1 in phase comm, saw {culprit}"
    assert trig["basis"] == "warm-up" and trig["timeout_s"] == WARMUP_S, \
        f"expected the warm-up budget ({WARMUP_S} s), saw {json.dumps(trig)}"
    assert trig["stalled_s"] <= WARMUP_S + SLACK_S, f"found after {trig['stalled_s']:.1f} s, budget {WARMUP_S} s"
    caps = [e for e in events if e.kind == "launcher.capabilities"]
    assert caps and caps[0].data["capabilities"]["hang detection"]["live"], caps[0].data if caps else "no report"
