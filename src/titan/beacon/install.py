"""Wire a worker for the watchdog: beacon file, stack dumps on a signal, flight recorder.

Call :func:`install` once, early in the worker and **before** ``init_distributed`` (it sets
``TORCH_FR_BUFFER_SIZE`` so gloo's flight recorder is on for the process group).

Why two dump paths: ``faulthandler``'s C-level signal handler prints every Python thread's
stack even while the main thread is blocked inside gloo or holds the GIL in a tight loop
(a *Python* signal handler would not run then — checked on this machine). The flight
recorder dump needs Python, so a daemon helper thread polls the beacon's dump-request
counter every 0.1 s; a thread gets the GIL even while the main thread waits in C++ (and,
through the interpreter's switch interval, while it spins in Python).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, Callable, Protocol

from titan.beacon.core import Beacon, get_beacon, set_beacon
from titan.beacon.hooks import add_comm_hook_wrapper, wrap_comm_hook


class WorkerLike(Protocol):
    """What :func:`install` reads of a ``titan.worker.WorkerContext`` (the beacon sits below
    the worker package and does not import it)."""

    rank: int
    local_rank: int
    world_size: int
    attempt: int
    node: str
    run_dir: Any
    settings: Any

__all__ = [
    "install", "beacon_path", "beacon_dir", "stacks_path", "comm_hook", "count_collectives", "DUMP_SIGNAL",
    "FR_BUFFER_DEFAULT",
]

log = logging.getLogger(__name__)

#: The signal the watchdog sends for a faulthandler stack dump.
DUMP_SIGNAL = signal.SIGUSR2
FR_BUFFER_DEFAULT = "2000"


def beacon_dir(run_dir: str | os.PathLike[str], configured: str = "") -> Path:
    """Folder of the beacon files: ``watchdog.beacon_dir`` or ``<run_dir>/beacons``."""
    return Path(configured) if configured else Path(run_dir) / "beacons"


def beacon_path(run_dir: str | os.PathLike[str], node: str, local_rank: int, configured: str = "") -> Path:
    """One beacon per (node, local rank); a restarted worker replaces its predecessor's."""
    return beacon_dir(run_dir, configured) / f"{node}.local{local_rank}.bcn"


def stacks_path(stacks_dir: str | os.PathLike[str], node: str, rank: int, attempt: int, pid: int, suffix: str) -> Path:
    """Evidence file of one worker: ``<stacks>/<node>.rank<r>.attempt<a>.pid<p>.<suffix>``."""
    return Path(stacks_dir) / f"{node}.rank{rank}.attempt{attempt}.pid{pid}.{suffix}"


def install(ctx: WorkerLike) -> Beacon | None:
    """Create this worker's beacon and dump machinery; returns the beacon (``None`` if disabled).

    Idempotent: a second call in the same process (the context wired it already) returns the
    beacon in use. Cost: one file create + mmap (~100 µs), one daemon thread waking every
    0.1 s. Never raises for I/O problems (logs and returns ``None``): monitoring must not stop
    training.
    """
    cfg = getattr(ctx.settings, "watchdog", None)
    if cfg is not None and not cfg.enabled:
        return None
    cur = get_beacon()
    if cur is not None and cur.pid == os.getpid() and (cur.rank, cur.attempt, cur.node) == (ctx.rank, ctx.attempt,
                                                                                          ctx.node):
        return cur
    os.environ.setdefault(flight_recorder_var(), FR_BUFFER_DEFAULT)
    try:
        b = Beacon(beacon_path(ctx.run_dir.path, ctx.node, ctx.local_rank, cfg.beacon_dir if cfg else ""),
                   rank=ctx.rank, local_rank=ctx.local_rank, world=ctx.world_size, attempt=ctx.attempt,
                   node=ctx.node)
    except OSError as e:
        log.warning("beacon disabled: %s", e)
        return None
    set_beacon(b)
    add_comm_hook_wrapper(count_collectives)  # whoever registers DDP's hook gets the counters
    pid = os.getpid()
    ctx.run_dir.stacks.mkdir(parents=True, exist_ok=True)
    stacks = stacks_path(ctx.run_dir.stacks, ctx.node, ctx.rank, ctx.attempt, pid, "stacks.txt")
    fr = stacks_path(ctx.run_dir.stacks, ctx.node, ctx.rank, ctx.attempt, pid, "fr.json")
    try:
        fh = open(stacks, "a", buffering=1)  # noqa: SIM115 - must stay open for faulthandler
        if threading.current_thread() is threading.main_thread():
            faulthandler.register(DUMP_SIGNAL, file=fh, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError) as e:
        log.warning("stack dumps on signal disabled: %s", e)
        fh = None
    t = threading.Thread(target=_helper_loop, args=(b, fh, fr), name="titan-beacon-helper", daemon=True)
    t.start()
    return b


def flight_recorder_var() -> str:
    """The environment variable that sizes this torch's flight recorder.

    torch with the generic recorder (``_dump_fr_trace_json``) reads ``TORCH_FR_BUFFER_SIZE``
    and warns, once per rank, that ``TORCH_NCCL_TRACE_BUFFER_SIZE`` is deprecated when that
    one is set; older torch only knows the NCCL name. Cost: one attribute lookup.
    """
    try:
        import torch._C._distributed_c10d as c10d
    except ImportError:  # torch without distributed: nothing reads either name
        return "TORCH_FR_BUFFER_SIZE"
    return "TORCH_FR_BUFFER_SIZE" if hasattr(c10d, "_dump_fr_trace_json") else "TORCH_NCCL_TRACE_BUFFER_SIZE"


def _dump_flight_recorder(path: Path) -> bool:
    try:
        import torch.distributed as dist

        if not dist.is_initialized():
            return False
        import torch._C._distributed_c10d as c10d

        # NCCL builds keep their own recorder (TORCH_NCCL_TRACE_BUFFER_SIZE); gloo and
        # torchcomms use the generic one (TORCH_FR_BUFFER_SIZE). CPU wheels lack the former.
        dump = getattr(c10d, "_dump_nccl_trace_json", None) if dist.get_backend() == "nccl" else None
        raw = (dump or c10d._dump_fr_trace_json)(True, False)
    except Exception as e:  # noqa: BLE001 - evidence is best effort
        log.debug("flight recorder dump failed: %s", e)
        return False
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(raw if isinstance(raw, bytes) else str(raw).encode())
    os.replace(tmp, path)
    return True


def _helper_loop(b: Beacon, fh: Any, fr: Path) -> None:
    served = 0
    while True:
        time.sleep(0.1)
        try:
            req = b.dump_requested()
        except (ValueError, OSError):  # beacon closed
            return
        if req == served or req == 0:
            continue
        served = req
        if fh is not None:
            try:
                fh.write(f"\n=== titan helper-thread dump (request {req}, t={time.time():.3f}) ===\n")
                fh.flush()
                faulthandler.dump_traceback(file=fh, all_threads=True)
            except (OSError, ValueError):
                pass
        _dump_flight_recorder(fr)
        try:
            b.dump_served(req)
        except (ValueError, OSError):
            return


def count_collectives(hook: Callable[[Any, Any], Any], slot: int = 0) -> Callable[[Any, Any], Any]:
    """Wrap a DDP comm hook so each bucket is phase ``comm`` and counted on the beacon.

    *Issued* is counted when ``hook`` returns (the collective is enqueued), *completed* when
    its future completes: a rank asleep inside a hook, before enqueueing, stays behind its
    peers — the per-rank sequence numbers the watchdog compares. Observes only (the
    gradients are untouched). Registered with ``titan.beacon.hooks`` by :func:`install`, so
    whoever owns DDP's one hook (the guard) gets the counters. Cost ≈ 5 µs per bucket.
    """

    # No annotations: DDP rejects any but the exact GradBucket / Future[Tensor] objects.
    def wrapped(state, bucket):  # noqa: ANN001, ANN202
        b = get_beacon()
        if b is None:
            return hook(state, bucket)
        b.enter("comm")
        try:
            fut = hook(state, bucket)
            b.collective_issued(slot)
        finally:
            b.exit()

        def _done(f: Any) -> Any:
            b.collective_done(slot)
            return f.value()

        return fut.then(_done)

    return wrapped


def comm_hook(before: Callable[[Any], None] | None = None) -> Callable[[Any, Any], Any]:
    """A DDP comm hook for loops without the guard: torch's ``allreduce_hook`` (averaging,
    bitwise like DDP without a hook), wrapped by every registered observer — the beacon's
    counters among them. ``ddp.register_comm_hook(None, beacon.comm_hook())``.
    ``before(bucket)`` runs inside the hook before the all-reduce (fault injection in tests).
    """
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    add_comm_hook_wrapper(count_collectives)

    def inner(state, bucket):  # noqa: ANN001, ANN202 - see count_collectives
        if before is not None:
            before(bucket)
        return allreduce_hook(state, bucket)

    return wrap_comm_hook(inner)
