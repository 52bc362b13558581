"""Collect evidence from hung local workers: faulthandler stacks, flight recorder, py-spy.

All of it is best effort and bounded in time: a watchdog that hangs while collecting
evidence would be worse than one with less evidence.

A :class:`Capture` is started when a rank is *suspected* (stalled past its suspicion point,
``watchdog.evidence_lead_s`` before its timeout) or, at the latest, at the verdict; by the
verdict the dumps are usually on disk, so nothing delays the restart once the hang is declared.
py-spy runs ``--native`` on the suspected culprit only (the frames the hang sits in; it
pauses that process while it unwinds, seconds on a busy machine) and ``--nonblocking``
without native frames on the other ranks (no pause; ~30 ms).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterable, Sequence

from titan.beacon import DUMP_SIGNAL, BeaconSnapshot, proc_start_ticks, read_beacon, request_dump, stacks_path

__all__ = ["same_process", "Capture", "start_capture", "add_native", "kill_workers"]

log = logging.getLogger(__name__)


def same_process(snap: BeaconSnapshot) -> bool:
    """True when the beacon's pid is alive and is still the process that wrote it."""
    if snap.pid <= 0:
        return False
    ticks = proc_start_ticks(snap.pid)
    return ticks != 0 and (snap.start_ticks == 0 or ticks == snap.start_ticks)


@dataclasses.dataclass
class _Spy:
    proc: subprocess.Popen[bytes]
    path: Path
    native: bool
    t0: float  # monotonic
    t1: float | None = None  # monotonic, when seen finished


@dataclasses.dataclass
class Capture:
    """Evidence being collected from one attempt's local workers.

    ``marks``: each rank's beacon ``(pid, last_mono_ns)`` when the capture started — the
    capture describes the stall that began then, and is stale once the suspect moves on.
    """

    attempt: int
    t0: float  # monotonic
    why: str  # "suspicion" | "verdict"
    marks: dict[int, tuple[int, int]]
    reqs: dict[str, int]  # beacon path -> dump request number
    spies: dict[int, _Spy]
    paths: dict[int, dict[str, Path]]
    _dumped: bool = False

    @property
    def native(self) -> list[int]:
        """Ranks py-spy unwinds with native frames."""
        return sorted(r for r, s in self.spies.items() if s.native)

    def current(self, snap: BeaconSnapshot) -> bool:
        """True while ``snap`` is the beacon state this capture started from (no progress since)."""
        return self.marks.get(snap.rank) == (snap.pid, snap.last_mono_ns)

    def paused_s(self, rank: int, cap_s: float) -> float:
        """How long a native py-spy may have held ``rank`` stopped (its wall time so far,
        at most ``cap_s``); 0 for ranks without one. An upper bound: py-spy also loads
        symbols before it suspends the process."""
        s = self.spies.get(rank)
        if s is None or not s.native:
            return 0.0
        self._poll()
        return min(cap_s, (s.t1 if s.t1 is not None else time.monotonic()) - s.t0)

    def _poll(self) -> None:
        now = time.monotonic()
        for s in self.spies.values():
            if s.t1 is None and s.proc.poll() is not None:
                s.t1 = now

    def wait_dumps(self, wait_s: float) -> None:
        """Wait until the workers' helper threads served the dump requests, at most until
        ``wait_s`` after the capture started (a blocked or stopped helper never serves)."""
        deadline = self.t0 + wait_s
        pending = dict(self.reqs)
        while pending and time.monotonic() < deadline:
            for path, req in list(pending.items()):
                cur = read_beacon(path)
                if cur is None or cur.dump_done >= req:
                    del pending[path]
            if pending:
                time.sleep(0.02)
        self.reqs = pending

    def wait_spies(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` in total for the py-spy children, kill the rest; returns
        how many finished."""
        deadline = time.monotonic() + timeout_s
        done = 0
        for s in self.spies.values():
            try:
                s.proc.wait(timeout=max(0.0 if s.t1 is not None else 0.05, deadline - time.monotonic()))
                done += 1
            except subprocess.TimeoutExpired:
                s.proc.kill()
                s.proc.wait()
        self._poll()
        return done

    def spies_done(self) -> bool:
        self._poll()
        return all(s.t1 is not None for s in self.spies.values())

    def evidence(self) -> dict[int, dict[str, str]]:
        """rank → {kind: path} for the files that exist and are not empty (py-spy: once started)."""
        out: dict[int, dict[str, str]] = {}
        for rank, kinds in self.paths.items():
            out[rank] = {}
            for kind, p in kinds.items():
                if kind == "py_spy" or (p.is_file() and p.stat().st_size > 0):
                    out[rank][kind] = str(p)
        return out

    def abandon(self) -> list[tuple[subprocess.Popen[bytes], Path]]:
        """The suspect moved on: this capture is not a hang's evidence. Returns its py-spy
        children and their output files, for the caller to reap (a py-spy is not killed
        while it may hold a process stopped) and delete."""
        out = [(s.proc, s.path) for s in self.spies.values()]
        self.spies = {}
        return out

    def summary(self, cap_s: float) -> dict[str, object]:
        """What ``hang.detected`` records about the capture."""
        return {"started": self.why, "lead_s": round(time.monotonic() - self.t0, 3), "native": self.native,
                "paused_s": {str(r): round(self.paused_s(r, cap_s), 3) for r in self.native}}


def start_capture(snaps: Sequence[BeaconSnapshot], stacks_dir: Path, *, attempt: int, py_spy: bool,
                  native: Iterable[int] = (), why: str = "verdict") -> Capture:
    """Ask every local worker for its stacks and flight recorder; start py-spy (returns at once).

    Sends ``DUMP_SIGNAL`` (faulthandler, works while blocked in C++ or holding the GIL) and
    bumps the beacon's dump request (the helper thread adds the flight-recorder dump). py-spy
    is started per rank: ``--native`` for the ranks in ``native``, ``--nonblocking`` for the
    others. Nothing is awaited here: :meth:`Capture.wait_dumps` / :meth:`Capture.wait_spies`.
    """
    stacks_dir.mkdir(parents=True, exist_ok=True)
    native = set(native)
    spy = _py_spy() if py_spy else None
    cap = Capture(attempt=attempt, t0=time.monotonic(), why=why, marks={}, reqs={}, spies={}, paths={})
    for s in snaps:
        cap.paths[s.rank] = {kind: stacks_path(stacks_dir, s.node, s.rank, s.attempt, s.pid, suffix)
                             for kind, suffix in (("stacks", "stacks.txt"), ("flight_recorder", "fr.json"))}
        if not same_process(s):
            continue
        cap.marks[s.rank] = (s.pid, s.last_mono_ns)
        try:
            os.kill(s.pid, DUMP_SIGNAL)
        except OSError as e:
            log.debug("signal to %s failed: %s", s.pid, e)
        try:
            cap.reqs[s.path] = request_dump(s.path)
        except OSError:
            pass
        if spy:
            path = stacks_path(stacks_dir, s.node, s.rank, s.attempt, s.pid, "py-spy.txt")
            cap.spies[s.rank] = _start_spy(spy, s.pid, path, native=s.rank in native)
            cap.paths[s.rank]["py_spy"] = path
    return cap


def add_native(cap: Capture, snap: BeaconSnapshot, stacks_dir: Path, *, py_spy: bool) -> bool:
    """Unwind ``snap``'s rank with native frames too (the verdict named a rank the suspicion
    did not): a second py-spy into the same file once the first is done; True if started."""
    spy = _py_spy() if py_spy else None
    old = cap.spies.get(snap.rank)
    if spy is None or (old is not None and old.native) or not same_process(snap):
        return False
    if old is not None:
        try:
            old.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            old.proc.kill()
            old.proc.wait()
    path = stacks_path(stacks_dir, snap.node, snap.rank, snap.attempt, snap.pid, "py-spy.txt")
    cap.spies[snap.rank] = _start_spy(spy, snap.pid, path, native=True)
    cap.paths.setdefault(snap.rank, {})["py_spy"] = path
    return True


def _start_spy(spy: str, pid: int, path: Path, *, native: bool) -> _Spy:
    with open(path, "wb") as fh:
        proc = subprocess.Popen([spy, "dump", "--native" if native else "--nonblocking", "--pid", str(pid)],
                                stdout=fh, stderr=subprocess.STDOUT)
    return _Spy(proc=proc, path=path, native=native, t0=time.monotonic())


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
