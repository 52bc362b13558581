"""Collect evidence from hung local workers: faulthandler stacks, flight recorder, py-spy.

All of it is best effort and bounded in time: a watchdog that hangs while collecting
evidence would be worse than one with less evidence.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from titan.beacon import DUMP_SIGNAL, BeaconSnapshot, proc_start_ticks, read_beacon, request_dump, stacks_path

__all__ = ["same_process", "collect", "wait_spies", "kill_workers"]

log = logging.getLogger(__name__)


def same_process(snap: BeaconSnapshot) -> bool:
    """True when the beacon's pid is alive and is still the process that wrote it."""
    if snap.pid <= 0:
        return False
    ticks = proc_start_ticks(snap.pid)
    return ticks != 0 and (snap.start_ticks == 0 or ticks == snap.start_ticks)


def collect(snaps: Sequence[BeaconSnapshot], stacks_dir: Path, *, wait_s: float,
            py_spy: bool) -> tuple[dict[int, dict[str, str]], list[subprocess.Popen[bytes]]]:
    """Dump every local worker's stacks; returns (rank → {kind: path}, running py-spy children).

    Sends ``DUMP_SIGNAL`` (faulthandler, works while blocked in C++ or holding the GIL) and
    bumps the beacon's dump request (the helper thread adds the flight-recorder dump), then
    waits up to ``wait_s`` for the helpers. py-spy (``--native``, slow: seconds on a busy
    machine) is only *started* here; :func:`wait_spies` bounds it before the workers are
    killed, so it delays the restart, not the detection.
    """
    stacks_dir.mkdir(parents=True, exist_ok=True)
    reqs: dict[str, int] = {}
    spies: list[subprocess.Popen[bytes]] = []
    spy = _py_spy() if py_spy else None
    out: dict[int, dict[str, str]] = {s.rank: {} for s in snaps}
    for s in snaps:
        if not same_process(s):
            continue
        try:
            os.kill(s.pid, DUMP_SIGNAL)
        except OSError as e:
            log.debug("signal to %s failed: %s", s.pid, e)
        try:
            reqs[s.path] = request_dump(s.path)
        except OSError:
            pass
        if spy:
            path = stacks_path(stacks_dir, s.node, s.rank, s.attempt, s.pid, "py-spy.txt")
            with open(path, "wb") as fh:
                spies.append(subprocess.Popen([spy, "dump", "--native", "--pid", str(s.pid)], stdout=fh,
                                              stderr=subprocess.STDOUT))
            out[s.rank]["py_spy"] = str(path)
    deadline = time.monotonic() + wait_s
    pending = dict(reqs)
    while pending and time.monotonic() < deadline:
        for path, req in list(pending.items()):
            cur = read_beacon(path)
            if cur is None or cur.dump_done >= req:
                del pending[path]
        time.sleep(0.02)
    for s in snaps:
        for kind, suffix in (("stacks", "stacks.txt"), ("flight_recorder", "fr.json")):
            p = stacks_path(stacks_dir, s.node, s.rank, s.attempt, s.pid, suffix)
            if p.is_file() and p.stat().st_size > 0:
                out[s.rank][kind] = str(p)
    return out, spies


def wait_spies(spies: Sequence[subprocess.Popen[bytes]], timeout_s: float) -> int:
    """Wait up to ``timeout_s`` in total for py-spy children, kill the rest; returns how many finished."""
    deadline = time.monotonic() + timeout_s
    done = 0
    for p in spies:
        try:
            p.wait(timeout=max(0.05, deadline - time.monotonic()))
            done += 1
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return done


def _py_spy() -> str | None:
    """py-spy next to this interpreter (a venv not on PATH), else on PATH, else None."""
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.is_file() and os.access(local, os.X_OK) else shutil.which("py-spy")


def kill_workers(snaps: Sequence[BeaconSnapshot], sig: int = signal.SIGKILL) -> list[int]:
    """Signal every local worker that is still the process of its beacon; returns the pids hit."""
    hit = []
    for s in snaps:
        if same_process(s):
            try:
                os.kill(s.pid, sig)
                hit.append(s.pid)
            except OSError:
                pass
    return hit
