"""In-process faults that stop, slow or crash a rank: ``hang``, ``slow``, ``exception``,
``poison_sample`` — plus the step gate that lets a drill place OS-level faults exactly.

Used by :class:`titan.chaos.worker.WorkerFaults` (which owns the numeric kinds). Every fault
of a plan fires **once per job**: a marker file ``<run>/chaos/fired.<id>.r<rank>`` (created with
``O_EXCL``) survives the restart, so a recomputed step after a restart is clean — a transient
does not come back when the step is redone. Each firing writes ``inject.<kind>``.

* ``hang where=collective`` sleeps inside the DDP comm hook of the step's last bucket (the
  peers wait in the all-reduce); ``where=data`` sleeps where the batch is fetched;
  ``where=gil`` runs one long C-level loop that never releases the GIL (no Python thread of
  the process runs; only an outside watcher can see it).
* ``slow factor=F steps=N`` sleeps ``(F-1) ×`` this rank's own median step time at the start
  of each of the N steps, inside the ``forward`` phase (a straggler's compute).
* ``exception what=cuda|comm`` raises a CUDA-like ``RuntimeError`` or a
  ``torch.distributed.DistNetworkError`` at the start of the step.
* OS-level faults (``kill``, ``preempt``, ``disk``, ``stress``, ``net``): the rank(s) wait at
  the start of the planned step until the drill driver has injected and touched
  ``<run>/chaos/go.<id>`` (at most ``GATE_TIMEOUT_S``), so the fault lands at that step.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from titan.chaos.plan import IN_PROCESS_KINDS, FaultSpec, Plan
from titan.settings.env import TITAN_CHAOS_SKIP_STEPS

if TYPE_CHECKING:
    from titan.worker.context import WorkerContext

__all__ = ["planned_skips", "RuntimeFaults", "fault_id", "chaos_dir", "noop", "GATE_TIMEOUT_S", "CUDA_MESSAGE", "COMM_MESSAGE"]

log = logging.getLogger(__name__)

GATE_TIMEOUT_S = 60.0
CUDA_MESSAGE = "CUDA error: the launch timed out and was terminated (injected by titan.chaos)"
COMM_MESSAGE = "Connection reset by peer (injected by titan.chaos)"
#: Gated OS-level kinds where only the target rank waits (the others run into the collective).
_RANK_GATED = frozenset({"kill"})


def noop(env: dict[str, str] | None = None) -> bool:
    """True when the faults are switched off (``TITAN_CHAOS_NOOP=1``): injectors write their
    ``inject.*`` events and change nothing."""
    from titan.settings.env import TITAN_CHAOS_NOOP

    return (os.environ if env is None else env).get(TITAN_CHAOS_NOOP, "") not in ("", "0")


def planned_skips(env: Any = None) -> dict[int, str]:
    """``TITAN_CHAOS_SKIP_STEPS`` (``"4,13:loss_spike"``): step → the verdict kind to skip it as
    (``nonfinite`` unless named), for a drill's clean reference run."""
    raw = (os.environ if env is None else env).get(TITAN_CHAOS_SKIP_STEPS, "").replace(" ", "")
    out: dict[int, str] = {}
    for item in filter(None, raw.split(",")):
        step, _, kind = item.partition(":")
        out[int(step)] = kind or "nonfinite"
    return out


def fault_id(index: int, f: FaultSpec) -> str:
    """Stable name of the ``index``-th fault of a plan (marker files, events)."""
    return f"{index:02d}-{f.kind}-s{f.step}" + (f"-r{f.rank}" if f.rank is not None else "")


def chaos_dir(run_dir: Path) -> Path:
    d = Path(run_dir) / "chaos"
    d.mkdir(parents=True, exist_ok=True)
    return d


def _claim(marker: Path) -> bool:
    """True exactly once per job for ``marker`` (atomic create)."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        return True
    except FileExistsError:
        return False


def hold_gil(seconds: float) -> None:
    """Spin for ``seconds`` without ever letting another thread of this process run: the
    switch interval is raised so the holder never offers the GIL, and the work is C calls.
    (A calibrated single ``sum(range(n))`` was tried first: its length was off by 16x.)"""
    import sys

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e6)
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            sum(range(200_000))
    finally:
        sys.setswitchinterval(old)


class RuntimeFaults:
    """The stop/slow/crash faults and OS gates of one rank (see the module doc)."""

    def __init__(self, ctx: "WorkerContext", plan: Plan) -> None:
        self.ctx = ctx
        self.noop = noop()
        self.dir = chaos_dir(ctx.run_dir.path)
        mine = lambda f: (f.rank is None or f.rank == ctx.rank) and (f.node is None or f.node == ctx.node)  # noqa: E731
        self.local = [(fault_id(i, f), f) for i, f in enumerate(plan.faults)
                      if f.kind in ("hang", "slow", "exception", "poison_sample") and mine(f)]
        self.gates = [(fault_id(i, f), f) for i, f in enumerate(plan.faults)
                      if f.kind not in IN_PROCESS_KINDS and (f.kind not in _RANK_GATED or mine(f))]
        self.step = 0
        self._t_begin: float | None = None
        self._step_times: list[float] = []
        self._slow_left = 0
        self._slow_factor = 1.0
        self._slow_base: float | None = None
        self._pending_hang: tuple[str, FaultSpec] | None = None
        if any(f.kind == "hang" and f.get("where") == "collective" for _, f in self.local):
            from titan.beacon.hooks import add_comm_hook_wrapper

            add_comm_hook_wrapper(self._wrap_comm_hook)  # before the guard registers its hook

    @property
    def active(self) -> bool:
        return bool(self.local or self.gates)

    def marker(self, fid: str) -> Path:
        """This rank's once-per-job marker of fault ``fid``."""
        return self.dir / f"fired.{fid}.r{self.ctx.rank}"

    def claim(self, fid: str) -> bool:
        return _claim(self.marker(fid))

    def _emit(self, f: FaultSpec, msg: str, **data: Any) -> None:
        self.ctx.events.emit(f"inject.{f.kind}", msg, level="warning", step=self.step,
                             data={"rank": self.ctx.rank, "node": self.ctx.node, "planned_step": f.step,
                                   "noop": self.noop, **data, "injected": True})

    # -- loop hooks --------------------------------------------------------------------
    def begin_step(self, step: int) -> None:
        """Before step ``step``: OS gates, exceptions, data/GIL hangs. May block or raise."""
        now = time.perf_counter()
        if self._t_begin is not None and self.step == step - 1:
            self._step_times.append(now - self._t_begin)
        self.step = step
        for fid, f in self.gates:
            if f.step == step:
                self._gate(fid, f)
        self._t_begin = time.perf_counter()
        self._straggle()
        for fid, f in self.local:
            if f.step != step or not self.claim(fid):
                continue
            if f.kind == "exception":
                self._raise(f)
            elif f.kind == "hang":
                where, secs = f.get("where"), float(f.get("seconds"))
                if where == "collective":
                    self._pending_hang = (fid, f)
                elif where == "gil":
                    from titan import beacon

                    with beacon.phase("forward"):
                        self._emit(f, f"holding the GIL for {secs:g} s", where="gil", seconds=secs, phase="forward")
                        if not self.noop:
                            hold_gil(secs)
                else:
                    from titan import beacon

                    with beacon.phase("data"):
                        self._emit(f, f"asleep in data loading for {secs:g} s", where="data", seconds=secs,
                                   phase="data")
                        if not self.noop:
                            time.sleep(secs)
            elif f.kind == "slow":
                self._slow_left, self._slow_factor = int(f.get("steps")), 1.0 if self.noop else float(f.get("factor"))
                # This rank's own step time *before* the fault: the slowed steps must not feed
                # back into it (a 4x straggler once grew to 20x and tripped the hang watchdog).
                self._slow_base = statistics.median(self._step_times[-20:]) if self._step_times else None
                self._emit(f, f"{self._slow_factor:g}x slower for {self._slow_left} steps",
                           factor=self._slow_factor, steps=self._slow_left)
            elif f.kind == "poison_sample":
                self._emit(f, f"poisoned batch (sample {f.get('index')}) at step {step}", index=f.get("index"))

    def poisoned(self, step: int) -> bool:
        """True while step ``step`` carries a poisoned sample (every pass: replays see it too)."""
        return not self.noop and any(f.kind == "poison_sample" and f.step == step and self.marker(fid).exists()
                   and self._poison_attempt_ok(fid) for fid, f in self.local)

    def _poison_attempt_ok(self, fid: str) -> bool:
        # Poison only in the attempt that claimed it: a recomputed step after a restart is clean.
        mark = self.dir / f"poison.{fid}.r{self.ctx.rank}"
        if _claim(mark):
            mark.write_text(str(self.ctx.attempt))
            return True
        try:
            return int(mark.read_text() or -1) == self.ctx.attempt
        except (OSError, ValueError):
            return False

    def _straggle(self) -> None:
        """A straggler sleeps its extra share inside the step, counted as compute (forward)."""
        if self._slow_left > 0 and self._step_times:
            from titan import beacon

            base = self._slow_base if self._slow_base is not None else statistics.median(self._step_times[-20:])
            with beacon.phase("forward"):
                time.sleep(base * (self._slow_factor - 1.0))
            self._slow_left -= 1

    # -- internals ---------------------------------------------------------------------
    def _raise(self, f: FaultSpec) -> None:
        what = f.get("what")
        self._emit(f, f"raising a {what} error at step {self.step}", what=what, phase="forward")
        if self.noop:
            return
        if what == "comm":
            import torch.distributed as dist

            exc: Exception = dist.DistNetworkError(COMM_MESSAGE)
        else:
            exc = RuntimeError(CUDA_MESSAGE)
        exc.titan_injected = True  # type: ignore[attr-defined] - its worker.fault says injected
        raise exc

    def _gate(self, fid: str, f: FaultSpec) -> None:
        """Wait for the driver in two steps: in phase ``gate`` (its own budget: the driver may
        wait for a checkpoint to land) until it is ready, then back in the step's own phase —
        acknowledged with ``armed.<id>`` — until it has injected (``go.<id>``). A rank stopped
        or killed there is caught in the phase it really was in."""
        from titan.beacon import get_beacon

        go, ready, armed = (self.dir / f"{p}.{fid}" for p in ("go", "ready", "armed"))
        if go.exists():
            return
        b = get_beacon()
        prev = b.current_phase() if b is not None else None
        if b is not None:
            b.set_phase("gate")
        self.ctx.events.emit("chaos.gate", f"rank {self.ctx.rank} waits at step {self.step} for {f.kind}",
                             step=self.step, data={"fault": fid, "kind": f.kind, "rank": self.ctx.rank})
        deadline = time.monotonic() + GATE_TIMEOUT_S
        while not (go.exists() or ready.exists()) and time.monotonic() < deadline:
            time.sleep(0.01)
        if b is not None and prev is not None:
            b.set_phase(prev)
        armed.with_name(f"{armed.name}.r{self.ctx.rank}").touch()
        while not go.exists() and time.monotonic() < deadline:
            time.sleep(0.01)

    def _wrap_comm_hook(self, hook: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        def wrapped(state: Any, bucket: Any) -> Any:
            if self._pending_hang is not None and bucket.is_last():
                _, f = self._pending_hang
                self._pending_hang = None
                secs = float(f.get("seconds"))
                self._emit(f, f"asleep before the all-reduce for {secs:g} s", where="collective", seconds=secs,
                           phase="comm")
                if not self.noop:
                    time.sleep(secs)
            return hook(state, bucket)
        return wrapped
