"""`titan run`'s final line, run.json and events: root causes apart from consequences, the
steps the workers reported, and what a plain torchrun script did not get (issue 15)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from titan.events import read_run

TITAN = Path(sys.executable).with_name("titan")


def test_a_peer_that_lost_the_killed_rank_is_a_consequence_not_a_failure():
    from titan.launch.causes import classify_failures, count_roles

    seen = classify_failures([
        {"attempt": 0, "global_rank": 0, "exit_code": 10, "signal": None, "error": None},  # seen first, same tick
        {"attempt": 0, "global_rank": 1, "exit_code": -9, "signal": "SIGKILL"},
        {"attempt": 1, "global_rank": 0, "exit_code": 1, "signal": None,
         "error": "RuntimeError: [../gloo/transport/tcp/pair.cc:537] Connection closed by peer [127.0.0.1]:1234"},
        {"attempt": 1, "global_rank": 1, "exit_code": 1, "signal": None, "error": "ValueError: bad batch"},
        {"attempt": 2, "global_rank": 1, "exit_code": 10, "signal": None},  # only comm faults: the first is the cause
        {"attempt": 2, "global_rank": 0, "exit_code": 10, "signal": None},
    ])
    assert [(f["attempt"], f["global_rank"], f["role"]) for f in seen] == [
        (0, 0, "consequence"), (0, 1, "root_cause"), (1, 0, "consequence"), (1, 1, "root_cause"),
        (2, 1, "root_cause"), (2, 0, "consequence")], seen
    assert seen[0]["caused_by"] == 1 and count_roles(seen) == (3, 3)


def _wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def _rank_pids(rd: Path, attempt: int) -> dict[int, int]:
    out = {}
    for f in (rd / "events").glob(f"*.attempt{attempt}.pid*.jsonl"):
        rank, pid = int(f.name.split(".rank")[1].split(".")[0]), int(f.name.split(".pid")[1].split(".")[0])
        out[rank] = pid
    return out


def _exited(pid: int) -> bool:
    """True once ``pid`` is gone or a zombie (its parent, the paused launcher, has not reaped it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except (OSError, IndexError):
        return True


def _last_step(rd: Path) -> int:
    try:
        return max((e.step or 0 for e in read_run(rd).events if e.kind == "step"), default=0)
    except Exception:  # noqa: BLE001 - files still being written
        return 0


@pytest.mark.timeout(240)
def test_one_kill_of_rank_1_is_one_root_cause_and_the_peer_a_consequence(tmp_path):
    rd = tmp_path / "runs" / "kill1"
    cmd = [str(TITAN), "run", "--nproc-per-node", "2", "--max-restarts", "1", "--no-agent", "--runs-dir",
           str(tmp_path / "runs"), "--run-id", "kill1", "--", "-m", "titan.workloads.tinygpt", "--steps", "60",
           "--ckpt-every", "10", "--threads", "1", "--log-every", "0"]
    p = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        _wait_for(lambda: _last_step(rd) >= 12, 150, "step 12")
        pids = _rank_pids(rd, 0)
        # The launcher (torchelastic's agent runs in it) is paused while rank 1 dies, so its
        # next look finds the peer gone too: the peer's all-reduce failed ("Connection reset
        # by peer", exit 10) before the agent could stop it, as on a busy machine.
        os.kill(p.pid, signal.SIGSTOP)
        try:
            os.kill(pids[1], signal.SIGKILL)  # the one fault
            _wait_for(lambda: _exited(pids[0]), 60, "rank 0 to exit after losing its peer")
        finally:
            os.kill(p.pid, signal.SIGCONT)
        out, err = p.communicate(timeout=200)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(10)
    assert p.returncode == 0, f"the run must recover from one kill (exit {p.returncode}):\n{err[-3000:]}"
    final = [ln for ln in err.splitlines() if ln.startswith("titan run: SUCCEEDED")]
    assert final, err[-2000:]
    meta = json.loads((rd / "run.json").read_text())
    roots = [f for f in meta["failures"] if f.get("role") == "root_cause"]
    assert [(f["global_rank"], f["signal"]) for f in roots] == [(1, "SIGKILL")], meta["failures"]
    cons = [f for f in meta["failures"] if f.get("role") == "consequence"]
    assert [(f["global_rank"], f["exit_code"], f["caused_by"]) for f in cons] == [(0, 10, 1)], meta["failures"]
    assert meta["root_causes"] == 1 and meta["consequences"] == 1, meta
    assert "1 worker failure(s) + 1 consequence(s)" in final[0], final[0]
    (fin,) = [e for e in read_run(rd).events if e.kind == "launcher.finished"]
    assert fin.data["root_causes"] == 1 and fin.data["consequences"] == meta["consequences"], fin.data
    assert "workers reported" in final[0] and "last step 60" in final[0], final[0]


@pytest.mark.timeout(180)
def test_the_file_the_readme_points_to_trains_and_the_final_line_counts_its_steps(tmp_path):
    import titan.workloads.tinygpt.train as train_mod

    cmd = [str(TITAN), "run", "--nproc-per-node", "2", "--max-restarts", "0", "--no-agent", "--runs-dir",
           str(tmp_path / "runs"), "--run-id", "readme", "--", train_mod.__file__, "--steps", "4", "--threads", "1",
           "--log-every", "0", "--no-ckpt"]
    p = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=170, start_new_session=True)
    assert p.returncode == 0, p.stderr[-3000:]
    steps = sorted({e.step for e in read_run(tmp_path / "runs" / "readme").events if e.kind == "step"})
    assert steps == [1, 2, 3, 4], f"train.py run as a file must train 4 steps; step events: {steps}"
    final = [ln for ln in p.stderr.splitlines() if ln.startswith("titan run: SUCCEEDED")]
    assert final and "workers reported 4 step(s), last step 4" in final[0], p.stderr[-1500:]
    assert "nothing was guarded" not in final[0], final[0]


PLAIN = '''
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
# one write per line: two ranks share the launcher's stdout, and print()'s pieces (unbuffered) interleave
os.write(1, f"plain {os.environ['RANK']} {float(t)}\\n".encode())
dist.destroy_process_group()
'''


@pytest.mark.timeout(180)
def test_a_plain_torchrun_script_succeeds_and_is_told_what_it_did_not_get(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    p = subprocess.run([str(TITAN), "run", "--nproc-per-node", "2", "--max-restarts", "0", "--no-agent",
                        "--runs-dir", str(tmp_path / "runs"), "--run-id", "plain", "--", str(script)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=170, start_new_session=True)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("plain ") == 2 and "2.0" in p.stdout, p.stdout
    final = [ln for ln in p.stderr.splitlines() if ln.startswith("titan run: SUCCEEDED")]
    assert final, p.stderr[-1500:]
    assert "workers reported no steps" in final[0], final[0]
    assert "nothing was guarded, checkpointed or watched" in final[0], final[0]
    meta = json.loads((tmp_path / "runs" / "plain" / "run.json").read_text())
    assert meta["worker_context"] is False and meta["steps_reported"] == 0, meta


# Rank 0 leaves the group first but takes a second to exit (as a gloo worker does in torch's
# teardown after sys.exit(1)); rank 1 notices at once and exits 10 (WORKER_COMM_FAULT).
SLOW_EXIT = '''
import os, sys, time
from pathlib import Path
mark = Path(os.environ["MARK"])
if os.environ["RANK"] == "0":
    mark.write_text("leaving")
    time.sleep(1.0)
    sys.exit(1)
while not mark.exists():
    time.sleep(0.01)
sys.exit(10)
'''


@pytest.mark.timeout(120)
def test_the_rank_that_left_first_is_the_root_cause_even_when_its_peer_exits_first(tmp_path):
    """While every exit seen is a peer's communication fault, the launcher lets the rest of the
    group exit by itself (``run.consequence_grace_s``) instead of stopping it: rank 0's own
    exit 1 is the root cause, rank 1's exit 10 its consequence. (With
    ``TITAN_RUN_CONSEQUENCE_GRACE_S=0`` the agent stops rank 0 and the only failure recorded
    is rank 1's exit 10, as the root cause: this test fails.)"""
    script = tmp_path / "slow_exit.py"
    script.write_text(SLOW_EXIT)
    env = {**os.environ, "MARK": str(tmp_path / "mark")}
    p = subprocess.run([str(TITAN), "run", "--nproc-per-node", "2", "--max-restarts", "0", "--no-agent",
                        "--runs-dir", str(tmp_path / "runs"), "--run-id", "slow", "--", str(script)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=110, start_new_session=True)
    assert p.returncode != 0, p.stderr[-2000:]
    meta = json.loads((tmp_path / "runs" / "slow" / "run.json").read_text())
    seen = [(f["global_rank"], f["exit_code"], f["role"]) for f in meta["failures"]]
    assert sorted(seen) == [(0, 1, "root_cause"), (1, 10, "consequence")], seen
    assert meta["failures"][[f["global_rank"] for f in meta["failures"]].index(1)]["caused_by"] == 0, meta["failures"]
