"""A real drill's run directory: ``titan drill`` kills a worker of a real 2-rank tinygpt
job under ``titan run``. Its buckets must reconcile with the launcher's recorded wall time
within 1 %, its RTO/RPO must match what the drill measured, and its report must render in
headless Chromium without errors (screenshot kept in the run directory)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from titan.sla.accounting import BUCKETS, account_run

pytestmark = pytest.mark.timeout(300)


def test_drill_run_dir_reconciles_and_its_report_renders(tmp_path, chromium_page):
    titan = Path(sys.executable).with_name("titan")
    env = dict(os.environ, TITAN_WATCHDOG_LEDGER_PATH=str(tmp_path / "ledger.sqlite"))
    # --lost-steps selects the foundation kill drill (one SIGKILL after a checkpoint).
    p = subprocess.run([str(titan), "drill", "--json", "--lost-steps", "2", "--steps", "20", "--ckpt-every", "5", "--runs-dir",
                        str(tmp_path / "runs"), "--timeout", "240"], capture_output=True, text=True, timeout=280,
                       cwd=tmp_path, env=env)
    try:
        drill = json.loads(p.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"titan drill --json printed no JSON (rc {p.returncode}): {p.stderr[-2000:]}")
    if not drill.get("steps"):
        pytest.skip(f"the drill ran no training step (rc {p.returncode}, problems {drill.get('problems')}); "
                    "nothing to account")
    acc = account_run(drill["run_dir"])
    rec = acc.reconciliation
    assert rec["reference"].startswith("run.json"), f"expected the launcher's recorded wall time, seen {rec}"
    assert rec["error_fraction"] <= 0.01, f"buckets {acc.buckets} sum {rec['sum_s']:.3f} s vs {rec}"
    assert set(acc.buckets) == set(BUCKETS)
    # Compare with what the drill measured itself, where it measured it (a drill can fail a
    # check of its own, e.g. the launcher's exit status, and still have killed and resumed).
    recovered = drill.get("kill") and drill.get("rto_s") is not None and drill.get("steps_lost") is not None
    if recovered:
        restarts = [i for i in acc.incidents if i.kind == "restart"]
        assert len(restarts) == drill["restarts"], f"drill saw {drill['restarts']} restarts; incidents {acc.incidents}"
        kills = [i for i in restarts if i.onset_source == "inject.kill"]
        assert len(kills) == 1, f"expected the injected kill as one incident, seen {acc.incidents}"
        inc = kills[0]
        assert inc.rank == drill["kill"]["rank"]
        assert inc.rpo_steps == drill["steps_lost"], f"RPO steps {inc.rpo_steps} vs drill's {drill['steps_lost']}"
        assert inc.resumed_from == drill["resumed_from"]
        # One computation (titan.sla): the drill prints the report's RTO and wall time.
        assert inc.rto_s == pytest.approx(drill["rto_s"], abs=1e-3), f"RTO {inc.rto_s} vs drill's {drill['rto_s']}"
        assert acc.wall_s == pytest.approx(drill["wall_s"], abs=0.01), f"wall {acc.wall_s} vs drill's {drill['wall_s']}"
        assert acc.buckets["goodput"] > 0 and acc.buckets["recompute"] > 0 and acc.buckets["restart"] > 0

    from titan.report import write_report

    rep = write_report(drill["run_dir"])
    page = chromium_page(rep.html)
    page.screenshot(Path(drill["run_dir"]) / "report" / "screenshot.png")
    assert page.ready == "1" and page.console_errors == [], f"ready {page.ready}, errors {page.console_errors}"
    assert page.external_requests == []
    rows = page.evaluate("document.getElementById('fig-timeline').layout.yaxis.categoryarray")
    assert {"rank 0", "rank 1"} <= set(rows), rows
    if recovered:
        lost = page.evaluate("document.getElementById('fig-loss').data.find(t => t.name.startsWith('lost')).x")
        assert len(lost) == drill["steps_lost"], f"the loss curve marks {lost} as lost; drill lost {drill['steps_lost']}"
