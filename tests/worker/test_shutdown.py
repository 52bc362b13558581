"""Workers end without torch's collective threads aborting the interpreter's shutdown
(``titan.worker.shutdown``): the race a core dump showed, and the drain that closes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TITAN = Path(sys.executable).with_name("titan")

# Every all-reduce waited; the script drops the tensors and ends at once, so gloo's work loop
# may still owe a Python decref when the interpreter finalizes. Without the drain 5 of 16
# launches here died of SIGABRT ("terminate called without an active exception"); with it 0
# of 16 (2026-12-05).
EXIT_RACE = textwrap.dedent('''
    import torch, torch.distributed as dist
    from titan.worker import WorkerContext
    ctx = WorkerContext.from_env()
    dist.init_process_group("gloo")
    for _ in range(3):
        t = torch.ones(1 << 16)
        w = dist.all_reduce(t, async_op=True)
    w.wait()
    del t, w
''')

GLOO_THREADS = textwrap.dedent('''
    import os, sys, torch, torch.distributed as dist
    from titan.worker.shutdown import collective_threads, drain_collective_threads
    assert collective_threads() == 0 and not drain_collective_threads()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
    dist.init_process_group("gloo", rank=0, world_size=1)
    dist.all_reduce(torch.ones(4))
    alive = collective_threads()
    waited = drain_collective_threads()
    dist.destroy_process_group()
    print(alive, waited, collective_threads())
''')


def test_the_collective_threads_are_seen_and_drained_only_while_they_live(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.run([sys.executable, "-c", GLOO_THREADS, str(port)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    alive, waited, after = p.stdout.split()
    assert int(alive) >= 1 and waited == "True" and int(after) == 0, p.stdout


@pytest.mark.timeout(240)
def test_workers_that_end_right_after_their_last_collective_exit_zero(tmp_path):
    script = tmp_path / "exit_race.py"
    script.write_text(EXIT_RACE)
    env = {**os.environ, "TITAN_WATCHDOG_LEDGER_PATH": str(tmp_path / "ledger.sqlite")}
    for i in range(4):
        p = subprocess.run([str(TITAN), "run", "--nproc-per-node", "2", "--max-restarts", "0", "--no-agent",
                            "--runs-dir", str(tmp_path / "runs"), "--run-id", f"race{i}", "--json", "--",
                            str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=50,
                           start_new_session=True)
        assert p.returncode == 0, f"launch {i}: exit {p.returncode}\n{p.stderr[-2500:]}"
        assert json.loads(p.stdout)["exit_code"] == 0
