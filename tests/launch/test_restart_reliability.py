"""Restarts are reliable: a job killed 10 times in a row restarts every time.

Two versions: the launcher's mechanics with torch-free workers (fast, always run), and
real gloo groups formed through torchrun's store in every attempt (the case that was
flaky with torchrun's defaults; ``slow``).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from titan.events import read_run
from titan.exitcodes import ExitCode

from _cli import titan  # tests/launch/_cli.py

# Every attempt forms a real gloo group through torchrun's store and all-reduces; until
# attempt 10 one rank then dies (alternating SIGKILL and exit 1), as a crashed trainer would.
SCRIPT = textwrap.dedent('''
    import os, signal, sys
    import torch, torch.distributed as dist
    from titan.worker import WorkerContext
    ctx = WorkerContext.from_env()
    dist.init_process_group("gloo")
    t = torch.ones(1) * (ctx.rank + 1)
    dist.all_reduce(t)
    ctx.events.emit("test.allreduce", data={"value": float(t.item())})
    if ctx.attempt < 10 and ctx.rank == ctx.attempt % 2:
        if ctx.attempt % 4 < 2:
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(1)
    dist.barrier()
    dist.destroy_process_group()
''')


def _crash_loop_allowed(monkeypatch) -> None:
    for var, value in {"TITAN_WATCHDOG_STRIKE_LIMIT": "1000", "TITAN_WATCHDOG_GIVEUP_RESTARTS": "1000",
                       "TITAN_WATCHDOG_GIVEUP_SAME_FAILURE": "1000", "TITAN_WATCHDOG_RESTART_BACKOFF_S": "0"}.items():
        monkeypatch.setenv(var, value)


@pytest.mark.slow  # ~90 s here: 11 attempts x 2 workers importing torch on 2 shared cores
@pytest.mark.timeout(300)
def test_ten_gloo_restarts_in_a_row_without_a_miss(tmp_path, monkeypatch):
    # Ten crashes of one node would (rightly) exclude it under the node ledger's default
    # limit, and ten attempts without a step would (rightly) make the launcher back off and
    # give up; this test is about the launcher's restarts, so both are lifted.
    _crash_loop_allowed(monkeypatch)
    script = tmp_path / "flaky.py"
    script.write_text(SCRIPT)
    code, out, err = titan(["run", "--nproc-per-node", "2", "--max-restarts", "10", "--json",
                            "--runs-dir", str(tmp_path / "runs"), "--", str(script)], tmp_path)
    res = json.loads(out)
    assert code == ExitCode.SUCCEEDED, f"expected SUCCEEDED after 10 restarts, saw {code!r}: {res}\n{err[-2000:]}"
    evs = read_run(res["run_dir"]).events
    restarts = [e.data["attempt"] for e in evs if e.kind == "launcher.restart"]
    assert restarts == list(range(1, 11)), f"expected exactly one restart into each attempt 1..10, saw {restarts}"
    reduced = sorted((e.attempt, e.rank) for e in evs if e.kind == "test.allreduce" and e.data["value"] == 3.0)
    assert reduced == [(a, r) for a in range(11) for r in (0, 1)], f"all-reduce per (attempt, rank): {reduced}"
    # Causes apart from consequences, as run.json records them (docs/run-directory.md): in
    # every attempt 0..9 the one root cause is the rank that died, SIGKILLed or by its own
    # exit (1, or SIGABRT: torch 2.13's gloo teardown of a process group never destroyed
    # aborts on some ranks); the peer that lost it, if it failed rather than being stopped by
    # the agent, is a consequence (exit 10) caused by that rank — never the other way round.
    meta = json.loads((Path(res["run_dir"]) / "run.json").read_text())
    fails = meta["failures"]
    roots = [(f["attempt"], f["global_rank"], f["signal"] or f["exit_code"]) for f in fails if f["role"] == "root_cause"]
    own = ["SIGKILL" if a % 4 < 2 else "exit" for a in range(10)]
    assert [(a, r) for a, r, _ in roots] == [(a, a % 2) for a in range(10)], f"root causes: {roots}\n{fails}"
    seen = ["SIGKILL" if how == "SIGKILL" else "exit" if how in (1, "SIGABRT") else how for _, _, how in roots]
    assert seen == own, f"each root cause's own death (SIGKILL, or exit 1 / SIGABRT), saw {roots}"
    cons = [(f["attempt"], f["global_rank"], f["exit_code"], f.get("caused_by")) for f in fails
            if f["role"] == "consequence"]
    assert all(c == (c[0], 1 - c[0] % 2, 10, c[0] % 2) for c in cons), f"consequences: {cons}"
    assert meta["root_causes"] == 10 and meta["consequences"] == len(cons), meta
    # The launcher's events say the same: each root cause is a worker.failed of its attempt.
    failed = {(e.data["attempt"], e.data["global_rank"]) for e in evs if e.kind == "worker.failed"}
    assert {(a, a % 2) for a in range(10)} <= failed, sorted(failed)


LIGHT = textwrap.dedent('''
    import os, signal, sys
    from titan.worker import WorkerContext
    ctx = WorkerContext.from_env()  # under titan run: worker.started (with the pid), beacon, fault boundary
    if ctx.attempt < 10 and ctx.rank == ctx.attempt % 2:
        if ctx.attempt % 4 < 2:
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(1)
''')


@pytest.mark.timeout(120)
def test_ten_restarts_in_a_row_without_a_miss(tmp_path, monkeypatch):
    _crash_loop_allowed(monkeypatch)  # see the gloo test
    script = tmp_path / "flaky.py"
    script.write_text(LIGHT)
    code, out, err = titan(["run", "--nproc-per-node", "2", "--max-restarts", "10", "--json",
                            "--runs-dir", str(tmp_path / "runs"), "--", str(script)], tmp_path)
    res = json.loads(out)
    assert code == ExitCode.SUCCEEDED, f"expected SUCCEEDED after 10 restarts, saw {code!r}: {res}"
    evs = read_run(res["run_dir"]).events
    restarts = [e.data["attempt"] for e in evs if e.kind == "launcher.restart"]
    assert restarts == list(range(1, 11)), f"expected one restart into each attempt 1..10, saw {restarts}"
    # The dying rank started in every attempt, both ranks in the last; the other rank of a
    # failing attempt may be stopped before it got as far as announcing itself.
    started = {(e.attempt, e.rank) for e in evs if e.kind == "worker.started"}
    expected = {(a, a % 2) for a in range(10)} | {(10, 0), (10, 1)}
    assert expected <= started, f"workers started: {sorted(started)}, missing {sorted(expected - started)}"
    failed = [(e.data["attempt"], e.data["global_rank"]) for e in evs if e.kind == "worker.failed"]
    assert failed == [(a, a % 2) for a in range(10)], failed
