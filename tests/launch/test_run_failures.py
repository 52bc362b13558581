"""`titan run` records worker failures as they happen and maps outcomes onto exit codes."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from titan.events import EVENT_FILE_RE, RunDir, read_run
from titan.exitcodes import ExitCode
from titan.launch import request_abort

from _cli import titan  # tests/launch/_cli.py

pytestmark = pytest.mark.timeout(120)


def _run(tmp_path: Path, script: Path, plan: dict, *extra: str) -> tuple[ExitCode, dict, RunDir]:
    code, out, err = titan(["run", "--nproc-per-node", "2", "--runs-dir", str(tmp_path / "runs"), "--json",
                            *extra, "--", str(script), repr(plan)], tmp_path)
    res = json.loads(out)
    return code, res, RunDir(res["run_dir"])


def test_exit1_then_sigkill_are_recorded_and_restarted(tmp_path, worker_script):
    code, res, rd = _run(tmp_path, worker_script, {0: {1: "exit:1"}, 1: {0: "kill"}}, "--max-restarts", "3")
    assert code == ExitCode.SUCCEEDED, f"expected SUCCEEDED after two restarts, saw {code!r}: {res}"
    evs = read_run(rd).events
    failed = [e.data for e in evs if e.kind == "worker.failed"]
    seen = [(f["attempt"], f["global_rank"], f["exit_code"], f["signal"]) for f in failed]
    assert seen == [(0, 1, 1, None), (1, 0, -9, "SIGKILL")], f"worker.failed events: {seen}"
    assert all(f["pid"] > 0 and f["local_rank"] == f["global_rank"] for f in failed)
    restarts = [e.data["attempt"] for e in evs if e.kind == "launcher.restart"]
    assert restarts == [1, 2], f"expected restarts into attempts 1 and 2, saw {restarts}"
    # Event files of both ranks and all three attempts, named node.rank.attempt.pid.
    names = [EVENT_FILE_RE.match(p.name) for p in rd.events_dir.glob("*.rank*.jsonl")]
    have = sorted((int(m["rank"]), int(m["attempt"])) for m in names if m)
    assert have == [(r, a) for r in (0, 1) for a in (0, 1, 2)], f"event files (rank, attempt): {have}"
    meta = rd.read_run_json()
    assert meta["exit_code"] == 0 and meta["torchrun"] == {"outcome": "succeeded", "exit_code": 0}
    # The restart fix: a fresh worker store every round (in the agent, bound to loopback).
    assert meta["restarts"] == 2 and meta["security"]["worker_store"] == "fresh per round", meta["security"]
    assert {"python", "torch", "titan"} <= set(meta["versions"]) and meta["threads"]["omp_num_threads_workers"] == "1"
    assert "last_call_timeout=3" in meta["launcher"]["rdzv_conf"]
    assert set(meta["worker_pids"]) == {"0", "1", "2"}
    # The workers got the run context from the launcher.
    started = [e for e in evs if e.kind == "worker.started"]
    assert {e.run for e in started} == {rd.run_id}


def test_titan_events_shows_the_killed_rank_with_its_signal(tmp_path, worker_script):
    code, res, rd = _run(tmp_path, worker_script, {0: {1: "kill"}}, "--max-restarts", "1")
    assert code == ExitCode.SUCCEEDED, res
    code, out, err = titan(["events", str(rd.path), "--kind", "worker.failed"], tmp_path)
    assert code == ExitCode.SUCCEEDED and "rank 1" in out and "SIGKILL" in out, f"titan events output:\n{out}{err}"
    code, out, _ = titan(["events", str(rd.path), "--kind", "worker.failed", "--json"], tmp_path)
    (line,) = out.splitlines()
    ev = json.loads(line)
    assert ev["data"]["global_rank"] == 1 and ev["data"]["signal"] == "SIGKILL", ev


def test_restarts_exhausted_is_job_failed(tmp_path, worker_script):
    code, res, rd = _run(tmp_path, worker_script, {"default": "exit:1"}, "--max-restarts", "1")
    assert code == ExitCode.JOB_FAILED, f"expected JOB_FAILED, saw {code!r}"
    meta = rd.read_run_json()
    assert meta["torchrun"]["outcome"] == "child_failed" and meta["torchrun"]["exit_code"] == 1
    assert meta["restarts"] == 1 and meta["exit_name"] == "JOB_FAILED"


@pytest.mark.parametrize("worker_code, expected", [(ExitCode.GAVE_UP, ExitCode.GAVE_UP),
                                                   (ExitCode.PREEMPTED, ExitCode.PREEMPTED)])
def test_gave_up_or_preempted_worker_stops_the_job_without_restart(tmp_path, worker_script, worker_code, expected):
    t0 = time.monotonic()
    code, res, rd = _run(tmp_path, worker_script, {0: {0: "sleep", 1: f"exit:{int(worker_code)}"}},
                         "--max-restarts", "3")
    assert code == expected, f"expected {expected!r}, saw {code!r}: {res}"
    evs = read_run(rd).events
    assert not [e for e in evs if e.kind == "launcher.restart"], "the job must not be restarted"
    assert [e.data["reason"] for e in evs if e.kind == "launcher.abort"] == [f"rank 1 exited {expected.name}"]
    assert time.monotonic() - t0 < 60, "the sleeping rank must be stopped, not waited for"


def test_a_recorded_give_up_stands_when_the_worker_then_dies_in_teardown(tmp_path, worker_script):
    # The worker decided (worker.abort, exit 3) and then died of SIGABRT, as torch's gloo
    # teardown does now and then when the peer closed first (CI, the all-corrupt run). The
    # decision is the outcome: no restart, exit 3 — not a failure to restart from.
    code, res, rd = _run(tmp_path, worker_script, {0: {0: "sleep", 1: "gaveup-then-abort"}}, "--max-restarts", "3")
    assert code == ExitCode.GAVE_UP, f"expected GAVE_UP, saw {code!r}: {res}"
    evs = read_run(rd).events
    assert not [e for e in evs if e.kind == "launcher.restart"], "the job must not be restarted"
    (failed,) = [e.data for e in evs if e.kind == "worker.failed"]
    assert failed["global_rank"] == 1 and failed["signal"] == "SIGABRT", failed
    assert [e.data["reason"] for e in evs if e.kind == "launcher.abort"] == [
        "rank 1 recorded GAVE_UP (worker.abort), then died of SIGABRT"]


SHUTDOWN_CRASH = '''
import atexit, os
atexit.register(os.abort)  # runs last (LIFO): after Titan's own exit handlers, as gloo's abort would
from titan.worker import WorkerContext
ctx = WorkerContext.from_env()
ctx.events.emit("test.plan", "finish, then die in the interpreter's shutdown")
'''


def test_a_death_after_the_script_ended_is_marked_and_strikes_no_node(tmp_path):
    # torch's gloo threads can abort a finalizing interpreter (titan.worker.shutdown); three
    # such exits once locked the only host out of the ledger.
    from titan.ledger import Ledger

    script = tmp_path / "shutdown_crash.py"
    script.write_text(SHUTDOWN_CRASH)
    code, res, rd = _run(tmp_path, script, {}, "--max-restarts", "0")
    assert code == ExitCode.JOB_FAILED, res  # the exit status was lost with the process: still a failure
    failed = [e for e in read_run(rd).events if e.kind == "worker.failed"]
    assert failed and all(e.data.get("at_shutdown") is True and e.data["signal"] == "SIGABRT" for e in failed), \
        [e.data for e in failed]
    assert "during interpreter shutdown" in failed[0].msg, failed[0].msg
    strikes = Ledger(tmp_path / "node-ledger.sqlite").strikes(failed[0].node)
    assert not [s for s in strikes if s.kind == "crash"], f"a teardown death struck the node: {strikes}"


def test_request_abort_from_outside_stops_a_running_job(tmp_path, worker_script):
    runs = tmp_path / "runs"

    def abort_when_started() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for rd_path in runs.glob("*"):
                if len(list((rd_path / "events").glob("*.jsonl"))) >= 2:
                    request_abort(rd_path, "watchdog: no progress", by="test")
                    return
            time.sleep(0.05)

    t = threading.Thread(target=abort_when_started, daemon=True)
    t.start()
    t0 = time.monotonic()
    code, res, rd = _run(tmp_path, worker_script, {"default": "sleep"}, "--max-restarts", "3")
    t.join(5)
    assert code == ExitCode.GAVE_UP, f"expected GAVE_UP, saw {code!r}: {res}"
    assert res["abort"]["reason"] == "watchdog: no progress"
    assert time.monotonic() - t0 < 60
    kinds = [e.kind for e in read_run(rd).events]
    assert "launcher.abort" in kinds and "launcher.restart" not in kinds


RECORDED = '''
import os
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    if os.environ["RANK"] == "1":
        raise RuntimeError("boom: loss exploded in rank 1")

main()
'''


def test_record_error_of_a_worker_is_in_its_failure_event(tmp_path):
    script = tmp_path / "recorded.py"
    script.write_text(RECORDED)
    code, res, rd = _run(tmp_path, script, {}, "--max-restarts", "0")
    assert code == ExitCode.JOB_FAILED, res
    (failed,) = [e.data for e in read_run(rd).events if e.kind == "worker.failed"]
    assert failed["global_rank"] == 1 and failed["exit_code"] == 1
    assert "boom: loss exploded in rank 1" in (failed["error"] or ""), failed
    assert failed["error_file"] and "boom" in rd.read_run_json()["torchrun"]["failures"]["1"]["message"]
