"""The launcher owns the restart decision: backoff, give-up on no progress or on a
deterministic failure, restart storms — decided from the run directory's events alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from titan.events import EventWriter, RunDir
from titan.launch.restarts import RestartPolicy, backoff_s
from titan.settings import load_settings

TITAN = Path(sys.executable).with_name("titan")


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _policy(tmp_path: Path, **sets):
    rd = RunDir.create(tmp_path / "runs", "r")
    emitted: list[tuple[str, dict]] = []
    clock = _Clock()
    cfg = load_settings(env={}, cli={f"watchdog.{k}": v for k, v in sets.items()}).watchdog
    pol = RestartPolicy(rd, cfg, lambda kind, msg="", level="info", data=None: emitted.append((kind, data or {})),
                        clock=clock)
    return rd, pol, emitted, clock


def _worker(rd: RunDir, attempt: int, rank: int = 0) -> EventWriter:
    return EventWriter(rd.event_file("n0", rank, attempt, 1000 + attempt * 10 + rank), run=rd.run_id, node="n0",
                       rank=rank, attempt=attempt)


def _launcher(rd: RunDir, attempt: int) -> EventWriter:
    return EventWriter(rd.path / f"launcher.n0.a{attempt}.jsonl", run=rd.run_id, node="n0", attempt=attempt)


def _attempt(rd: RunDir, attempt: int, *, steps=(), saved=(), fault=None, failed=((0, 1, None),)) -> None:
    """Events of one attempt: step events, checkpoint saves, an optional worker.fault, and the
    launcher's worker.failed records ``(rank, exit_code, signal)``."""
    with _worker(rd, attempt) as w:
        for s in steps:
            w.emit("step", step=s, data={})
        for s in saved:
            w.emit("ckpt.saved", step=s, data={"step": s})
        if fault is not None:
            cls, err, msg, step = fault
            w.emit("worker.fault", msg, level="error", step=step, data={"class": cls, "error": err, "message": msg})
    with _launcher(rd, attempt) as w:
        for rank, code, sig in failed:
            w.emit("worker.failed", level="error", data={"global_rank": rank, "exit_code": code, "signal": sig,
                                                         "attempt": attempt})


def test_backoff_is_zero_after_progress_then_exponential_and_capped():
    assert [backoff_s(n, 1.0, 5.0) for n in range(7)] == [0, 0, 1, 2, 4, 5, 5]


def test_a_progressing_job_restarts_at_once_every_time(tmp_path):
    rd, pol, _, clock = _policy(tmp_path)
    for a in range(5):  # each attempt gets further: a kill now and then, never the same step
        _attempt(rd, a, steps=range(10 * a, 10 * a + 12), saved=[10 * a + 10], failed=[(1, -9, "SIGKILL")])
        clock.t += 5
        dec = pol.before_restart(a + 1)
        assert not dec.give_up and dec.backoff_s == 0, (a, dec)


def test_no_new_step_and_no_new_checkpoint_after_k_restarts_gives_up(tmp_path):
    rd, pol, emitted, clock = _policy(tmp_path, giveup_restarts=3)
    _attempt(rd, 0, steps=range(1, 15), saved=[10], failed=[(1, -9, "SIGKILL")])
    decisions = []
    for a in (1, 2, 3, 4):
        clock.t += 5
        decisions.append(pol.before_restart(a))
        if decisions[-1].give_up:
            break
        # Each later attempt resumes from 10 and dies before step 14, each time another way.
        _attempt(rd, a, steps=range(11, 11 + a), failed=[(a % 2, 1 + a, None)])
    assert [d.give_up for d in decisions] == [False, False, False, True], decisions
    assert [d.backoff_s for d in decisions[:3]] == [0.0, 0.0, 1.0], decisions
    assert decisions[3].reason == ("no progress: 3 restarts in a row reached no new step and no new checkpoint "
                                   "(best so far: step 14, checkpoint 10)"), decisions[3].reason
    kinds = [k for k, _ in emitted]
    assert kinds.count("launcher.restart_decision") == 4, kinds


def test_the_same_exception_at_the_same_step_twice_is_deterministic(tmp_path):
    rd, pol, _, clock = _policy(tmp_path)
    fault = ("other", "ValueError", "bad batch at step 3", 3)
    _attempt(rd, 0, steps=[1, 2], fault=fault)
    clock.t += 2
    first = pol.before_restart(1)
    _attempt(rd, 1, steps=[1, 2], fault=fault)
    clock.t += 2
    second = pol.before_restart(2)
    assert not first.give_up and first.backoff_s == 0, first
    assert second.give_up, second
    assert second.reason.startswith("deterministic failure: 2 attempts in a row failed the same way at step 3"), second
    assert "ValueError: bad batch at step 3" in second.reason, second.reason


def test_the_same_exception_at_another_step_is_not_deterministic(tmp_path):
    rd, pol, _, clock = _policy(tmp_path)
    _attempt(rd, 0, steps=[1, 2], fault=("other", "ValueError", "bad batch", 3))
    clock.t += 2
    pol.before_restart(1)
    _attempt(rd, 1, steps=[1, 2, 3, 4], fault=("other", "ValueError", "bad batch", 5))
    clock.t += 2
    dec = pol.before_restart(2)
    assert not dec.give_up, dec


def test_an_exit_code_alone_needs_one_more_identical_attempt(tmp_path):
    rd, pol, _, clock = _policy(tmp_path)
    out = []
    for a in range(3):  # a plain script: no step, no message, exit 1 each time, quickly
        _attempt(rd, a, failed=[(0, 1, None)])
        clock.t += 3
        out.append(pol.before_restart(a + 1))
    assert [d.give_up for d in out] == [False, False, True], out
    assert out[2].reason == "deterministic failure: 3 attempts in a row failed the same way before any step (exit code 1)"
    assert [d.backoff_s for d in out[:2]] == [0.0, 1.0], out


def test_a_peer_that_saw_the_connection_close_is_a_consequence_not_the_cause(tmp_path):
    rd, pol, emitted, clock = _policy(tmp_path)
    _attempt(rd, 0, steps=[1, 2, 3], fault=("peer_closed", "RuntimeError", "Connection closed by peer", 4),
             failed=[(1, -9, "SIGKILL"), (0, 10, None)])
    clock.t += 2
    pol.before_restart(1)
    (kind, data), = [e for e in emitted if e[0] == "launcher.restart_decision"]
    assert data["failed_attempt"]["cause_text"] == "signal SIGKILL", data["failed_attempt"]


def test_many_restarts_in_a_short_window_are_one_storm_event(tmp_path):
    rd, pol, emitted, clock = _policy(tmp_path, storm_restarts=3, storm_window_s=30, giveup_restarts=50,
                                      giveup_same_failure=50)
    for a in range(6):
        _attempt(rd, a, steps=[a + 1], failed=[(0, -9, "SIGKILL")])  # progress each time: never gives up
        clock.t += 2
        pol.before_restart(a + 1)
    storms = [d for k, d in emitted if k == "launcher.restart_storm"]
    assert len(storms) == 1 and storms[0]["restarts"] == 3, storms
    assert pol.summary()["storms"][0]["restarts_total"] == 6, pol.summary()


def test_history_of_an_earlier_submission_is_what_a_new_attempt_must_beat(tmp_path):
    rd = RunDir.create(tmp_path / "runs", "r")
    _attempt(rd, 0, steps=range(1, 31), saved=[30])  # the first submission got to step 30
    cfg = load_settings(env={}, cli={"watchdog.giveup_restarts": 1}).watchdog
    pol = RestartPolicy(rd, cfg, lambda *a, **k: None)
    _attempt(rd, 0, steps=range(31, 33), failed=[(0, -9, "SIGKILL")])  # new attempt 0: progress past 30
    assert not pol.before_restart(1).give_up
    _attempt(rd, 1, steps=range(31, 33), failed=[(0, 1, None)])
    dec = pol.before_restart(2)
    assert dec.give_up and "best so far: step 32, checkpoint 30" in dec.reason, dec


# -- through `titan run` --------------------------------------------------------------------

def _titan_run(tmp_path: Path, script: Path, *extra: str, timeout: float = 180) -> tuple[int, str, float]:
    argv = [str(TITAN), "run", "--runs-dir", str(tmp_path / "runs"), "--run-id", "r", *extra, "--", str(script)]
    env = dict(os.environ, TITAN_WATCHDOG_LEDGER_PATH=str(tmp_path / "ledger.sqlite"))
    t0 = time.monotonic()
    p = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        raise AssertionError(f"titan run did not give up within {timeout:g} s:\n{out[-3000:]}") from None
    return p.returncode, out, time.monotonic() - t0


def _decisions(rd: Path) -> list[dict]:
    out = []
    for f in rd.glob("launcher.*.jsonl"):
        out += [json.loads(x) for x in f.read_text().splitlines() if '"launcher.restart_decision"' in x]
    return sorted(out, key=lambda e: e["t"])


@pytest.mark.timeout(240)
def test_a_plain_script_that_always_fails_gives_up_quickly_with_exit_3(tmp_path):
    """Issue 15: `titan run --max-restarts 1000000 -- fail.py` restarted 958 times in 2 minutes."""
    script = tmp_path / "fail.py"
    script.write_text("raise SystemExit('fail.py: this script always fails')\n")
    code, out, wall = _titan_run(tmp_path, script, "--max-restarts", "1000000", "--no-agent")
    assert code == 3, f"expected exit 3 (GAVE_UP), saw {code}:\n{out[-3000:]}"
    decisions = _decisions(tmp_path / "runs" / "r")
    assert [d["data"]["give_up"] for d in decisions] == [False, False, True], decisions
    reasons = [line for line in out.splitlines() if "deterministic failure" in line]
    assert len(reasons) == 1 and "3 attempts in a row failed the same way before any step (exit code 1)" in reasons[0], out
    assert wall < 120, f"giving up took {wall:.0f} s"


@pytest.mark.timeout(240)
def test_a_titan_script_failing_at_the_same_step_gives_up_after_one_restart(tmp_path):
    script = tmp_path / "bad_step.py"
    script.write_text(textwrap.dedent("""
        from titan.worker import WorkerContext
        from titan.worker.errors import fault_boundary

        ctx = WorkerContext.from_env()
        with fault_boundary(ctx):
            for step in range(1, 10):
                ctx.step = step
                if step == 3:
                    raise ValueError("bad batch at step 3")
                ctx.events.emit("step", step=step, data={})
    """))
    code, out, _ = _titan_run(tmp_path, script, "--max-restarts", "1000000", "--no-agent")
    assert code == 3, f"expected exit 3 (GAVE_UP), saw {code}:\n{out[-3000:]}"
    decisions = _decisions(tmp_path / "runs" / "r")
    assert [d["data"]["give_up"] for d in decisions] == [False, True], decisions
    assert "deterministic failure: 2 attempts in a row failed the same way at step 3 " \
           "(ValueError: bad batch at step 3)" in out, out


@pytest.mark.timeout(240)
def test_a_restart_storm_is_an_event_a_summary_line_and_a_report_line(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text("raise SystemExit('fail.py: this script always fails')\n")
    code, out, _ = _titan_run(tmp_path, script, "--max-restarts", "10", "--no-agent", "--set", "watchdog.storm_restarts=2",
                              "--set", "watchdog.restart_backoff_s=0")
    assert code == 3, out[-2000:]
    storms = [line for line in out.splitlines() if line.startswith("restart storm:")]
    assert len(storms) == 1 and "2 restarts within 60 s" in storms[0], out[-2000:]
    rd = tmp_path / "runs" / "r"
    evs = [json.loads(x) for f in rd.glob("launcher.*.jsonl") for x in f.read_text().splitlines()]
    assert [e["kind"] for e in evs].count("launcher.restart_storm") == 1
    rep = subprocess.run([str(TITAN), "report", str(rd)], capture_output=True, text=True, timeout=180)
    md = (rd / "report" / "summary.md").read_text() if (rd / "report" / "summary.md").exists() else ""
    assert "- restart storm: 2 restarts within 60" in md, f"exit {rep.returncode}; summary.md:\n{md}\n{rep.stderr[-1500:]}"
