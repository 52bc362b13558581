"""`titan drill`: a worker SIGKILLed after a checkpoint; the job resumes and recomputes exactly."""

from __future__ import annotations

import json

import pytest

from titan.cli.environment import Environment
from titan.cli.main import run as cli_run
from titan.events import read_run
from titan.exitcodes import ExitCode


@pytest.mark.timeout(240)
def test_drill_passes_and_recomputes_exactly_the_lost_steps(tmp_path):
    env = Environment.captured(tmp_path)
    code = cli_run(["drill", "--json", "--steps", "24", "--ckpt-every", "8", "--lost-steps", "3",
                    "--timeout", "200"], env)
    rep = json.loads(env.stdout.getvalue())
    if not (code == ExitCode.SUCCEEDED and rep["passed"]):
        notes = [f"{e.kind} r{e.rank} a{e.attempt}: {e.msg}" for e in read_run(rep["run_dir"]).events
                 if e.level in ("warning", "error", "critical")]
        raise AssertionError(f"drill failed (exit {code!r}): {json.dumps(rep, indent=1)}\nwarnings/errors:\n  "
                             + "\n  ".join(notes[-20:]))
    assert rep["steps"] == 24 and rep["restarts"] >= 1 and rep["failures"] >= 1
    assert rep["steps_lost"] >= 3 and rep["steps_recomputed"] == rep["steps_lost"], rep
    assert rep["resumed_from"] == 8 and rep["rto_s"] > 0
    evs = read_run(rep["run_dir"]).events
    (kill,) = [e for e in evs if e.kind == "inject.kill"]
    # The victim's failure is recorded with its pid and signal (its peer may fail too, e.g.
    # exiting WORKER_COMM_FAULT on the broken connection, in the same monitor tick).
    failed = {e.data["pid"]: e.data for e in evs if e.kind == "worker.failed"}
    assert failed.get(kill.data["pid"], {}).get("signal") == "SIGKILL", (kill.data, failed)
    # Both ranks wrote events in both attempts.
    assert {(e.rank, e.attempt) for e in evs if e.kind == "step"} == {(0, 0), (1, 0), (0, 1), (1, 1)}
