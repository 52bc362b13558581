"""Robust distributed initialisation: retries with exponential backoff and jitter.

The store is reached under ``dist.init_timeout_s`` and the process group is created with
``dist.pg_timeout_s`` for its collectives — two separate budgets. Restarted workers must
never read the dead workers' addresses (measured: the cause of torchrun's flaky restarts
here): ``titan run`` gives every rendezvous round a fresh worker store, hosted by the agent
and bound to the listen address (``TITAN_STORE_PER_ROUND=1``); when workers use a store that
outlives the round (static rendezvous, or the shared store left on), the group's store is a
``PrefixStore`` keyed by the restart count instead.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import random
import time
from typing import TYPE_CHECKING

from titan.errors import TitanError
from titan.settings.env import TITAN_STORE_PER_ROUND

if TYPE_CHECKING:
    from titan.worker.context import WorkerContext

__all__ = ["init_distributed", "backoff_delays", "measure_clock_offsets", "DistInitError", "pick_backend",
           "choose_backend"]

log = logging.getLogger(__name__)


class DistInitError(TitanError):
    """Distributed initialisation failed after every attempt."""


def backoff_delays(attempts: int, base_s: float, max_s: float, jitter: float, rng: random.Random | None = None) -> list[float]:
    """Sleep before attempt k (k >= 1): ``min(max, base * 2**(k-1)) * (1 ± jitter)``."""
    rng = rng or random.Random()
    out = []
    for k in range(1, attempts):
        d = min(max_s, base_s * (2 ** (k - 1)))
        out.append(max(0.0, d * (1 + jitter * rng.uniform(-1, 1))))
    return out


def pick_backend(requested: str) -> str:
    """``auto`` → NCCL when CUDA is available, else gloo."""
    import torch
    import torch.distributed as dist

    if requested != "auto":
        return requested
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def choose_backend(ctx: "WorkerContext", script_choice: str | None) -> str:
    """The backend to use. ``dist.backend`` other than ``auto`` (the default) was set on
    purpose (config file, ``TITAN_DIST_BACKEND``, ``--set``) and wins over the script's own
    choice — and says so (a warning and a ``dist.backend_override`` event). Otherwise the
    script's choice, else ``auto`` (NCCL with CUDA, gloo without)."""
    setting = ctx.settings.dist.backend
    if script_choice and script_choice != "auto" and setting != "auto" and setting != script_choice:
        msg = f"dist.backend={setting!r} (settings) overrides the script's backend {script_choice!r}"
        log.warning("%s", msg)
        ctx.events.emit("dist.backend_override", msg, level="warning", phase="init",
                        data={"script": script_choice, "setting": setting})
        return pick_backend(setting)
    return pick_backend(script_choice if script_choice and setting == "auto" else setting)


def init_distributed(ctx: "WorkerContext", backend: str | None = None) -> str:
    """Create the default process group for ``ctx`` and return the backend used.

    ``backend``: the script's own choice (``"gloo"``, ``"nccl"``…), used unless the
    ``dist.backend`` setting names another (then a warning says which wins, see
    :func:`choose_backend`). A group the script created itself is kept (``dist.init_external``
    event) and only clock offsets are measured. Cost: one store rendezvous and one group
    creation (plus retries); one small all-gather afterwards to measure clock offsets. Raises
    ``DistInitError`` naming the endpoint when every attempt failed.
    """
    import torch
    import torch.distributed as dist

    cfg = ctx.settings.dist
    if dist.is_initialized():
        used = dist.get_backend()
        ctx.events.emit("dist.init_external", f"process group created by the script ({used}); kept", phase="init",
                        data={"backend": used, "world": dist.get_world_size()})
        measure_clock_offsets(ctx)
        return str(used)
    backend = choose_backend(ctx, backend)
    endpoint = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    delays = backoff_delays(cfg.init_attempts, cfg.init_backoff_s, cfg.init_backoff_max_s, cfg.init_jitter)
    device_id = None
    if backend == "nccl":
        torch.cuda.set_device(ctx.local_rank)
        device_id = torch.device("cuda", ctx.local_rank)
    last: BaseException | None = None
    for attempt in range(1, cfg.init_attempts + 1):
        t0 = time.monotonic()
        ctx.events.emit("dist.init_attempt", f"init attempt {attempt} to {endpoint}", phase="init",
                        data={"attempt": attempt, "endpoint": endpoint, "backend": backend})
        try:
            store, rank, world = next(dist.rendezvous(
                "env://", rank=ctx.rank, world_size=ctx.world_size,
                timeout=_dt.timedelta(seconds=cfg.init_timeout_s)))
            if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and os.environ.get(TITAN_STORE_PER_ROUND) != "1":
                # The agent's store outlives the workers (static rendezvous, or torchrun's
                # shared store): keep this attempt's keys apart from the dead workers'. Not
                # with a fresh store per rendezvous round (`titan run`'s default): restart
                # counts differ between nodes after a node-local failure, so a count-keyed
                # prefix would keep the nodes' new workers apart.
                store = dist.PrefixStore(f"titan/attempt{ctx.attempt}", store)
            kwargs = {"device_id": device_id} if device_id is not None else {}
            dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                                    timeout=_dt.timedelta(seconds=cfg.pg_timeout_s), **kwargs)
            ctx.events.emit("dist.init_ok", f"process group up ({backend}, world {world})", phase="init",
                            data={"attempt": attempt, "seconds": time.monotonic() - t0, "backend": backend})
            measure_clock_offsets(ctx)
            return backend
        except (RuntimeError, ValueError, TimeoutError, OSError) as e:  # DistError derives from RuntimeError
            last = e
            if dist.is_initialized():
                dist.destroy_process_group()
            delay = delays[attempt - 1] if attempt <= len(delays) else 0.0
            ctx.events.emit("dist.init_failed", f"init attempt {attempt} to {endpoint} failed: {e}",
                            level="warning", phase="init",
                            data={"attempt": attempt, "endpoint": endpoint, "error": type(e).__name__,
                                  "retry_in_s": delay if attempt < cfg.init_attempts else None})
            if attempt < cfg.init_attempts:
                time.sleep(delay)
    ctx.events.emit("dist.init_gave_up", f"could not reach {endpoint} after {cfg.init_attempts} attempts",
                    level="error", phase="init", data={"endpoint": endpoint})
    raise DistInitError(f"distributed init to {endpoint} failed after {cfg.init_attempts} attempts: {last}")


def measure_clock_offsets(ctx: "WorkerContext") -> dict[str, float]:
    """All-gather wall clocks; rank 0 records each node's offset from its own clock.

    One tiny all-gather; the error is about half the collective's latency (sub-ms here).
    """
    import torch.distributed as dist

    samples: list[tuple[str, float] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(samples, (ctx.node, time.time()))
    ref = samples[0][1] if samples[0] else 0.0
    per_node: dict[str, list[float]] = {}
    for s in samples:
        if s:
            per_node.setdefault(s[0], []).append(s[1] - ref)
    offsets = {n: sorted(v)[len(v) // 2] for n, v in per_node.items()}
    if ctx.rank == 0:
        ctx.events.emit("clock.offset", "clock offsets against rank 0", phase="init",
                        data={"offsets_s": offsets, "reference_node": samples[0][0] if samples[0] else None})
    return offsets
