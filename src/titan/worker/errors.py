"""In-loop fault handling: the one place that classifies, records and exits.

On gloo a failed collective is a plain ``RuntimeError`` ("Timed out waiting …",
"Connection closed by peer", "Connection reset by peer"); NCCL and the store raise
``DistBackendError`` / ``DistNetworkError`` / ``DistStoreError``; CUDA raises
``torch.AcceleratorError`` (or ``RuntimeError: CUDA error: …``). :func:`classify` names
the class by type first, message second; :func:`fault_boundary` records a
``worker.fault`` event (rank, step, phase, class, message) and ends the process with the
class's exit code so torchrun restarts the group from the latest checkpoint. Nothing is
swallowed: every exception leaves the boundary as ``SystemExit``.

In-process process-group re-creation is **not** done (docs/failure-model.md says why).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import sys
import traceback
from typing import TYPE_CHECKING, Any, Iterator

from titan.errors import TitanAbort
from titan.exitcodes import ExitCode

if TYPE_CHECKING:
    from titan.worker.context import WorkerContext

__all__ = ["Fault", "classify", "conclude", "record_fault", "fault_boundary", "install_fault_boundary"]

log = logging.getLogger(__name__)

_STICKY = re.compile(r"illegal memory access|illegal instruction|misaligned address|unspecified launch failure|"
                     r"device-side assert|uncorrectable ECC|Xid|device not ready|GPU is lost|unrecoverable", re.I)
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("comm_timeout", re.compile(r"Timed out waiting|timed out|Watchdog caught collective operation timeout|"
                                r"DeadlineExceeded|Socket Timeout", re.I)),
    ("peer_closed", re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|"
                               r"ECONNRESET|EPIPE|Connection refused|remote process exited", re.I)),
    ("comm_backend", re.compile(r"NCCL error|ncclInternalError|ncclSystemError|ncclRemoteError|"
                                r"ProcessGroup.*(abort|destroyed)|Gloo", re.I)),
]


@dataclasses.dataclass(frozen=True)
class Fault:
    """A classified exception: ``kind``, whether a restart may help, the exit code."""

    kind: str  # comm_timeout | peer_closed | comm_backend | comm_network | store | cuda_sticky | cuda | oom | other
    transient: bool
    exit_code: ExitCode
    error: str
    message: str


def classify(exc: BaseException) -> Fault:
    """Classify ``exc`` by type, then message. Cost: a few regex searches; no torch import
    unless torch is already loaded."""
    name = type(exc).__name__
    msg = str(exc).strip().splitlines()[0][:500] if str(exc).strip() else name
    full = str(exc)
    torch = sys.modules.get("torch")
    dist_mod = sys.modules.get("torch.distributed")
    types: dict[str, type] = {}
    if dist_mod is not None:
        for t in ("DistStoreError", "DistNetworkError", "DistBackendError"):
            if hasattr(dist_mod, t):
                types[t] = getattr(dist_mod, t)
    if torch is not None:
        for t in ("OutOfMemoryError", "AcceleratorError"):
            if hasattr(torch, t):
                types[t] = getattr(torch, t)

    def f(kind: str, transient: bool, code: ExitCode) -> Fault:
        return Fault(kind, transient, code, name, msg)

    if "OutOfMemoryError" in types and isinstance(exc, types["OutOfMemoryError"]):
        return f("oom", True, ExitCode.WORKER_CUDA_FAULT)
    if ("AcceleratorError" in types and isinstance(exc, types["AcceleratorError"])) or \
            (isinstance(exc, RuntimeError) and re.search(r"CUDA error|cudaError|CUBLAS_STATUS|CUDNN_STATUS", full)):
        sticky = bool(_STICKY.search(full))
        return f("cuda_sticky" if sticky else "cuda", True, ExitCode.WORKER_CUDA_FAULT)
    if "DistStoreError" in types and isinstance(exc, types["DistStoreError"]):
        return f("store", True, ExitCode.WORKER_COMM_FAULT)
    if "DistNetworkError" in types and isinstance(exc, types["DistNetworkError"]):
        return f("comm_network", True, ExitCode.WORKER_COMM_FAULT)
    if "DistBackendError" in types and isinstance(exc, types["DistBackendError"]):
        for kind, pat in _PATTERNS[:2]:
            if pat.search(full):
                return f(kind, True, ExitCode.WORKER_COMM_FAULT)
        return f("comm_backend", True, ExitCode.WORKER_COMM_FAULT)
    if isinstance(exc, (RuntimeError, ConnectionError, TimeoutError)):
        for kind, pat in _PATTERNS:
            if pat.search(full):
                return f(kind, True, ExitCode.WORKER_COMM_FAULT)
    return f("other", False, ExitCode.JOB_FAILED)


def record_fault(ctx: "WorkerContext", exc: BaseException, *, step: int | None = None,
                 phase: str | None = None) -> Fault:
    """Emit ``worker.fault`` for ``exc`` (rank, step, phase, class, first traceback lines)."""
    fault = classify(exc)
    if phase is None:
        from titan.beacon import get_beacon, read_beacon

        b = get_beacon()
        snap = read_beacon(b.path) if b is not None else None
        phase = snap.phase if snap is not None else None
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=8))[-4000:]
    ctx.events.emit("worker.fault", f"rank {ctx.rank}: {fault.kind} in {phase or '?'} at step {step}: {fault.message}",
                    level="error", step=step, phase=phase,
                    data={"class": fault.kind, "transient": fault.transient, "error": fault.error,
                          "message": fault.message, "exit_code": int(fault.exit_code), "traceback": tb,
                          **({"injected": True} if getattr(exc, "titan_injected", False) else {})})
    return fault


def conclude(ctx: "WorkerContext", exc: BaseException) -> int | None:
    """Record why the worker ends on ``exc`` and return its exit code (``None``: not ours to
    decide — ``SystemExit``, ``KeyboardInterrupt``). ``TitanAbort`` (give up, guard stop)
    keeps its own code; anything else is classified (``worker.fault``). Closes the events."""
    if isinstance(exc, TitanAbort):
        ctx.events.emit("worker.abort", exc.message, level="error", step=ctx.step,
                        data={"exit_code": int(exc.exit_code)})
        code = int(exc.exit_code)
    elif isinstance(exc, (SystemExit, KeyboardInterrupt)):
        return None
    else:
        fault = record_fault(ctx, exc, step=ctx.step)
        log.error("rank %s: %s (%s); exiting %d", ctx.rank, fault.kind, fault.message, int(fault.exit_code))
        code = int(fault.exit_code)
    try:
        ctx.events.close()
    except Exception:  # noqa: BLE001 - the exit code matters more than the last event
        pass
    return code


@contextlib.contextmanager
def fault_boundary(ctx: "WorkerContext") -> Iterator[None]:
    """Wrap the training loop: classify and record any exception, exit with its code.

    ``TitanAbort`` (give up, guard stop) exits with its own code; ``SystemExit`` and
    ``KeyboardInterrupt`` pass through unchanged. Uses ``ctx.step`` as the step. The
    context manager form of :func:`install_fault_boundary` (which ``WorkerContext.from_env``
    installs under ``titan run``).
    """
    try:
        yield
    except BaseException as e:  # noqa: BLE001 - classified, recorded and turned into an exit
        code = conclude(ctx, e)
        if code is None:
            raise
        raise SystemExit(code) from (None if isinstance(e, TitanAbort) else e)


def install_fault_boundary(ctx: "WorkerContext") -> None:
    """Make an exception that ends the script's main thread a classified exit: it is recorded
    (``worker.fault``, or ``worker.abort`` for a ``TitanAbort``), the usual traceback is
    printed, exit handlers run, and the process exits with the class's code (10 comm/store,
    11 CUDA, 3 give-up, 1 other) — what ``titan run`` and triage read. Replaces
    ``sys.excepthook`` (the previous hook prints the traceback); idempotent per context.
    Cost: nothing until an exception escapes.
    """
    prev = sys.excepthook
    if getattr(prev, "titan_ctx", None) is ctx:
        return

    def _titan_fault_boundary(tp: type[BaseException], exc: BaseException, tb: Any) -> None:
        code = conclude(ctx, exc)
        prev(tp, exc, tb)
        if code is not None:
            _exit_now(code)

    _titan_fault_boundary.titan_ctx = ctx  # type: ignore[attr-defined]
    sys.excepthook = _titan_fault_boundary


def _exit_now(code: int) -> None:
    """Exit with ``code`` from inside ``sys.excepthook`` (where ``SystemExit`` is ignored):
    run the ``atexit`` handlers first (DataLoader workers, flushes), as a normal exit would."""
    import atexit
    import os

    from titan.worker.shutdown import skip_drain

    skip_drain()  # os._exit below: no finalization, so no collective thread to wait for
    run = getattr(atexit, "_run_exitfuncs", None)
    if run is not None:
        try:
            run()
        except BaseException:  # noqa: BLE001 - the exit code must still come out
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(code)
