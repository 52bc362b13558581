"""The in-worker beacon: a memory-mapped progress record one process outside can read.

Each update is a few ``struct.pack_into`` calls on an ``mmap`` (a few microseconds, no
system call, no collective, no flush): the kernel's page cache makes it visible to the
watchdog immediately on the same node. Phases nest (``with phase("data"):``); the beacon
records each phase's duration in a ring the watchdog learns timeouts from, and per
completed step the compute time (phases in ``compute_phases``) for straggler detection.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import threading
import time
from pathlib import Path
from typing import Any, Iterator

from titan.beacon import layout as L

__all__ = ["Beacon", "phase", "get_beacon", "set_beacon", "done", "DEFAULT_COMPUTE_PHASES", "proc_start_ticks"]

#: Phases whose durations make up a rank's *compute* time, together with the step's unmarked
#: time (no phase open: the user's own code between the marked phases and between steps —
#: a slow data pipeline, logging, a host that is busy elsewhere). ``backward`` is left out on
#: purpose: with DDP the gradient all-reduce wait happens inside it, so a fast rank waiting
#: for a slow one would look slow there; so are the collective phases Titan marks.
DEFAULT_COMPUTE_PHASES = frozenset({"data", "forward", "optimizer"})

_Q = struct.Struct("<q")
_pack_q = _Q.pack_into
_mono = time.monotonic_ns
_wall = time.time_ns


def proc_start_ticks(pid: int) -> int:
    """Start time of ``pid`` in clock ticks since boot (``/proc/<pid>/stat`` field 22); 0 if unknown.

    Readers compare it with the beacon's value before signalling, so a recycled pid is
    never killed by mistake.
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
        return int(raw[raw.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return 0


class Beacon:
    """Writer side of one beacon file. Not thread-safe for phases entered concurrently
    in *different* orders; nested use from a helper thread (a comm hook) is fine because
    phases nest in time.

    Cost: ``set_phase`` / ``phase`` enter+exit ≈ 2–5 µs; ``collective_issued`` ≈ 1 µs.
    """

    def __init__(self, path: str | os.PathLike[str], *, rank: int = 0, local_rank: int = 0, world: int = 1,
                 attempt: int = 0, node: str = "", compute_phases: frozenset[str] = DEFAULT_COMPUTE_PHASES) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp{os.getpid()}")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, L.SIZE)
            # Allocate the pages now: a store into an unbacked page of a full tmpfs/disk is a
            # SIGBUS that kills the worker; this raises ENOSPC here instead (beacon disabled).
            os.posix_fallocate(fd, 0, L.SIZE)
            self._mm = mmap.mmap(fd, L.SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        mm = self._mm
        struct.pack_into("<8sII", mm, L.F.HEAD, L.MAGIC, L.VERSION, L.SIZE)
        struct.pack_into("<qqqqqq32s", mm, L.F.IDENT, os.getpid(), proc_start_ticks(os.getpid()), rank,
                         local_rank, world, attempt, node.encode()[:32])
        self.rank, self.local_rank, self.world, self.attempt, self.node = rank, local_rank, world, attempt, node
        self.pid = os.getpid()
        self.compute_phases = compute_phases
        self._names: dict[str, int] = {}
        self._by_idx: list[str] = []
        self._stack: list[tuple[int, int]] = []  # (phase index, start mono ns)
        self._lock = threading.Lock()
        self._heartbeat = 0
        self._gen = 0
        self._pcount = 0
        self._scount = 0
        self._issued = [0] * L.SLOTS
        self._completed = [0] * L.SLOTS
        self._step_t0 = _mono()
        self._compute_ns = 0
        # Unmarked time since the last step ended: no phase open, or ``idle`` (the step
        # guard's mark for "the user's own code between steps") innermost — nested phases
        # (a checkpoint's collectives inside ``idle``) excluded. ``_idle_since``: when the
        # current unmarked stretch began (None: inside a marked phase, or before the first
        # step). A rank slowed outside every marked phase — a sleep before its forward, a
        # slow iterator the loop does not mark — shows here and only here (bench/peers: a
        # 3x slow rank slept there and no detector saw it).
        self._unmarked_ns = 0
        self._idle_since: int | None = None
        # Until the first step the top level is "setup" (model build, restore: budgeted like
        # init); afterwards the time between marked phases is "idle" (learned).
        self._top = "setup"
        #: Optional observer of phase and step transitions (``titan.tracing.StepTracer``):
        #: one set of phase marks serves the watchdog and tracing.
        self.listener: Any = None
        #: Called when the data pipeline draws a batch (``titan.data``), before the phase
        #: becomes ``data``: the step guard begins the step there, so loading a step's data is
        #: part of that step (``titan.guard.progress``).
        self.on_data: Any = None
        _pack_q(mm, L.F.STATE, L.STATE_RUNNING)
        self._set(self._index("setup"), _mono())
        # Publish under the final name only once the header is complete.
        os.replace(tmp, self.path)

    # -- internals -------------------------------------------------------------------
    def _index(self, name: str) -> int:
        idx = self._names.get(name)
        if idx is None:
            idx = len(self._names)
            if idx >= L.PHASES:  # table full: reuse the last slot for every further name
                idx = L.PHASES - 1
            else:
                raw = name.encode()[:L.NAME_LEN]
                self._mm[L.F.NAMES + idx * L.NAME_LEN:L.F.NAMES + idx * L.NAME_LEN + len(raw)] = raw
                self._by_idx.append(name)
            self._names[name] = idx
        return idx

    def _touch(self, now: int) -> None:
        mm = self._mm
        self._heartbeat += 1
        _pack_q(mm, L.F.HEARTBEAT, self._heartbeat)
        _pack_q(mm, L.F.LAST_MONO, now)
        _pack_q(mm, L.F.LAST_WALL, _wall())

    def _set(self, idx: int, now: int) -> None:
        mm = self._mm
        self._gen += 1
        _pack_q(mm, L.F.GEN, self._gen)  # odd: update in progress
        _pack_q(mm, L.F.PHASE, idx)
        _pack_q(mm, L.F.PHASE_MONO, now)
        _pack_q(mm, L.F.PHASE_WALL, _wall())
        self._touch(now)
        self._gen += 1
        _pack_q(mm, L.F.GEN, self._gen)

    def _record_phase(self, idx: int, dur: int) -> None:
        off = L.F.PRING_OFF + (self._pcount % L.PRING) * 16
        struct.pack_into("<qq", self._mm, off, idx, dur)
        self._pcount += 1
        _pack_q(self._mm, L.F.PCOUNT, self._pcount)

    def _unmarked_pause(self, now: int) -> None:
        """Close the current unmarked stretch (call under the lock, before a transition)."""
        if self._idle_since is not None:
            self._unmarked_ns += now - self._idle_since
            self._idle_since = None

    def _unmarked_resume(self, now: int) -> None:
        """Open an unmarked stretch if the beacon now shows unmarked time (after a transition)."""
        if self._top == "setup":
            return
        inner = self._by_idx[self._stack[-1][0]] if self._stack else self._top
        if inner == "idle":
            self._idle_since = now

    # -- phases ----------------------------------------------------------------------
    def enter(self, name: str) -> None:
        """Enter phase ``name`` (nested in the current one)."""
        now = _mono()
        with self._lock:
            self._unmarked_pause(now)
            idx = self._index(name)
            self._stack.append((idx, now))
            self._set(idx, now)
            self._unmarked_resume(now)
        if self.listener is not None:
            self.listener.phase_enter(name)

    def exit(self) -> None:
        """Leave the innermost phase and go back to the enclosing one (``idle`` at the top)."""
        now = _mono()
        with self._lock:
            if not self._stack:
                return
            idx, t0 = self._stack.pop()
            dur = now - t0
            self._record_phase(idx, dur)
            if self._by_idx[idx] in self.compute_phases:
                self._compute_ns += dur
            self._unmarked_pause(now)
            outer = self._stack[-1][0] if self._stack else self._index(self._top)
            self._set(outer, now)
            self._unmarked_resume(now)
        if self.listener is not None:
            self.listener.phase_exit(self._by_idx[idx])

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """``with beacon.phase("data"): ...`` marks a phase; exceptions pass through."""
        self.enter(name)
        try:
            yield
        finally:
            self.exit()

    def set_phase(self, name: str) -> None:
        """Replace the current top-level phase (no nesting) — for loops that prefer marks."""
        now = _mono()
        old = None
        with self._lock:
            self._unmarked_pause(now)
            if self._stack:
                idx, t0 = self._stack.pop()
                old = self._by_idx[idx]
                dur = now - t0
                self._record_phase(idx, dur)
                if old in self.compute_phases:
                    self._compute_ns += dur
            idx = self._index(name)
            self._stack.append((idx, now))
            self._set(idx, now)
            self._unmarked_resume(now)
        if self.listener is not None:
            if old is not None:
                self.listener.phase_exit(old)
            self.listener.phase_enter(name)

    def current_phase(self) -> str:
        """The phase the beacon shows now (the innermost one)."""
        with self._lock:
            return self._by_idx[self._stack[-1][0]] if self._stack else self._top

    def heartbeat(self) -> None:
        """Show progress without changing phase (e.g. inside a long user loop)."""
        self._touch(_mono())

    # -- steps -----------------------------------------------------------------------
    def step_begin(self, step: int) -> None:
        """Start optimizer step ``step`` (1-based number of the step being computed)."""
        self._step_t0 = _mono()
        with self._lock:
            if self._top == "setup":  # the first step: setup (build, restore) is no step's compute
                self._compute_ns = 0
                self._unmarked_ns = 0
            self._top = "idle"
            if self._idle_since is None:
                self._unmarked_resume(self._step_t0)
        _pack_q(self._mm, L.F.STEP, step)
        self._touch(self._step_t0)
        if self.listener is not None:
            self.listener.step_begin(step)

    def step_end(self, step: int) -> None:
        """Record step ``step`` as completed: its wall time and compute time go to the ring."""
        now = _mono()
        with self._lock:
            self._unmarked_pause(now)
            self._unmarked_resume(now)
            compute = self._compute_ns + self._unmarked_ns
            self._compute_ns = 0  # phases and unmarked time from here on belong to the next step
            self._unmarked_ns = 0
        off = L.F.STEP_RING + (self._scount % L.RING) * 24
        struct.pack_into("<qqq", self._mm, off, step, compute, now - self._step_t0)
        self._scount += 1
        _pack_q(self._mm, L.F.STEP_COUNT, self._scount)
        _pack_q(self._mm, L.F.STEP, step)
        self._touch(now)
        if self.listener is not None:
            self.listener.step_end(step)

    # -- collectives -----------------------------------------------------------------
    def collective_issued(self, slot: int = 0) -> int:
        """Count one collective issued on process-group ``slot``; returns its sequence number."""
        self._issued[slot] += 1
        _pack_q(self._mm, L.F.COLL + slot * 16, self._issued[slot])
        self._touch(_mono())
        return self._issued[slot]

    def collective_done(self, slot: int = 0) -> None:
        """Count one collective of ``slot`` completed (may run on a backend thread)."""
        self._completed[slot] += 1
        _pack_q(self._mm, L.F.COLL + slot * 16 + 8, self._completed[slot])
        self._touch(_mono())

    # -- watchdog requests -------------------------------------------------------------
    def dump_requested(self) -> int:
        """The watchdog's dump request counter (compare with the last one served)."""
        return _Q.unpack_from(self._mm, L.F.DUMP_REQ)[0]

    def dump_served(self, req: int) -> None:
        _pack_q(self._mm, L.F.DUMP_DONE, req)

    def close(self, done: bool = True, *, unmap: bool = False) -> None:
        """Mark the beacon finished (``done``: the watchdog stops watching it).

        The mapping stays open unless ``unmap`` (a late comm-hook callback may still count);
        the process's exit releases it.
        """
        try:
            if done:
                _pack_q(self._mm, L.F.STATE, L.STATE_DONE)
                self._touch(_mono())
            if unmap:
                self._mm.close()
        except (ValueError, OSError):
            pass


_CURRENT: Beacon | None = None


def set_beacon(b: Beacon | None) -> None:
    """Make ``b`` the process's beacon (what ``phase()`` and the hooks use)."""
    global _CURRENT
    _CURRENT = b


def get_beacon() -> Beacon | None:
    """The process's beacon, or ``None`` outside a Titan run."""
    return _CURRENT


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Mark a phase of the training loop on this process's beacon (no-op without one).

    ``with titan.beacon.phase("eval"): evaluate()`` — the watchdog learns this phase's
    normal duration separately, so a long evaluation is not mistaken for a hang.
    """
    b = _CURRENT
    if b is None:
        yield
        return
    b.enter(name)
    try:
        yield
    finally:
        b.exit()


def done() -> None:
    """Mark this process's beacon finished (the watchdog stops watching it); no-op without one.

    Call it when the training loop is over, before slow teardown (final save, group
    destruction), so the teardown is not mistaken for a hang.
    """
    global _CURRENT
    b = _CURRENT
    if b is not None:
        b.close(done=True)
        _CURRENT = None
