"""Helpers for launcher tests: tiny worker scripts (no torch import unless needed)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest


#: A worker that announces itself (``worker.started``: the context wires itself under
#: ``titan run``), then behaves as ``PLAN[attempt][rank]`` says: "ok", "exit:N", "kill"
#: (SIGKILL itself), "sleep" (until stopped), "gaveup-then-abort" (records a give-up the way
#: the fault boundary does, then dies of SIGABRT as gloo's teardown can).
WORKER = textwrap.dedent('''
    import os, signal, sys, time
    from titan.worker import WorkerContext
    ctx = WorkerContext.from_env()
    plan = eval(sys.argv[1])
    what = plan.get(ctx.attempt, {}).get(ctx.rank, plan.get("default", "ok"))
    ctx.events.emit("test.plan", what)
    if what != "ok":  # let every rank of this attempt announce itself before anyone dies
        t0 = time.monotonic()
        while (len(list(ctx.run_dir.events_dir.glob(f"*.attempt{ctx.attempt}.*.jsonl"))) < ctx.world_size
               and time.monotonic() - t0 < 20):
            time.sleep(0.05)
    if what.startswith("exit:"):
        sys.exit(int(what[5:]))
    if what == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if what == "sleep":
        time.sleep(120)
    if what == "gaveup-then-abort":
        from titan.errors import TitanAbort
        from titan.worker.errors import conclude
        conclude(ctx, TitanAbort("every checkpoint is unusable", 3))
        os.abort()
''')


@pytest.fixture
def worker_script(tmp_path: Path) -> Path:
    p = tmp_path / "worker.py"
    p.write_text(WORKER)
    return p
