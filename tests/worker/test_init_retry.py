"""init_distributed: retries reach a store that comes up late; a store that never comes is named."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from titan.events import read_run

_CHILD = r"""
import sys
from titan.worker import DistInitError, WorkerContext, init_distributed
ctx = WorkerContext.from_env()
try:
    backend = init_distributed(ctx)
except DistInitError as e:
    print("DistInitError:", e, flush=True)
    sys.exit(3)
import torch.distributed as dist
dist.destroy_process_group()
print("OK", backend, flush=True)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(run_dir: Path, port: int, **settings: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TITAN_", "TORCHELASTIC_"))}
    env.update({
        "TITAN_RUN_DIR": str(run_dir), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        # As under torchrun: every rank is a store client; the agent hosts the server.
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    })
    env.update({f"TITAN_DIST_{k.upper()}": v for k, v in settings.items()})
    return subprocess.Popen([sys.executable, "-c", _CHILD], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _finish(proc: subprocess.Popen, timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
        return out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _kinds(run_dir: Path) -> list[tuple[str, dict]]:
    return [(e.kind, e.data) for e in read_run(run_dir).events if e.kind.startswith("dist.")]


def _wait_for_event(run_dir: Path, kind: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if run_dir.joinpath("events").exists() and any(k == kind for k, _ in _kinds(run_dir)):
            return
        if proc.poll() is not None:
            raise AssertionError(f"child exited {proc.returncode} before {kind}: {proc.stdout.read()}")
        time.sleep(0.05)
    raise AssertionError(f"no {kind} event within {timeout} s")


@pytest.mark.timeout(90)
def test_late_store_is_reached_on_a_later_attempt(tmp_path: Path) -> None:
    import torch.distributed as dist

    port, run_dir = _free_port(), tmp_path / "run"
    proc = _spawn(run_dir, port, init_timeout_s="1", init_attempts="8", init_backoff_s="0.5",
                  init_backoff_max_s="1", init_jitter="0")
    server = None
    try:
        # The store comes up only after the client's first attempt timed out (~2 s after it
        # began): TCPStore's client may overrun its timeout by a retry interval, so a fixed
        # delay alone would race with attempt 1.
        _wait_for_event(run_dir, "dist.init_failed", proc, timeout=60)
        time.sleep(0.5)
        server = dist.TCPStore("127.0.0.1", port, world_size=1, is_master=True,
                               timeout=timedelta(seconds=30), wait_for_workers=False)
        out = _finish(proc, timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        del server
    assert proc.returncode == 0, f"child exited {proc.returncode}, expected 0: {out}"
    events = _kinds(run_dir)
    failed = [d for k, d in events if k == "dist.init_failed"]
    ok = [d for k, d in events if k == "dist.init_ok"]
    assert failed, f"expected at least one dist.init_failed before the store came up, saw {events}"
    assert len(ok) == 1 and ok[0]["attempt"] >= 2, f"expected one dist.init_ok on attempt >= 2, saw {ok}"
    assert all(d["endpoint"] == f"127.0.0.1:{port}" for d in failed)


@pytest.mark.timeout(60)
def test_store_that_never_comes_fails_naming_the_endpoint(tmp_path: Path) -> None:
    port, run_dir = _free_port(), tmp_path / "run"
    proc = _spawn(run_dir, port, init_timeout_s="0.5", init_attempts="2", init_backoff_s="0.1",
                  init_backoff_max_s="0.1", init_jitter="0")
    out = _finish(proc, timeout=45)
    assert proc.returncode == 3, f"expected DistInitError (exit 3), got {proc.returncode}: {out}"
    assert f"127.0.0.1:{port}" in out, f"error does not name the endpoint 127.0.0.1:{port}: {out}"
    kinds = [k for k, _ in _kinds(run_dir)]
    assert kinds.count("dist.init_failed") == 2 and "dist.init_gave_up" in kinds, kinds
