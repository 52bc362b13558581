"""In-worker context: identity, event writer and robust distributed init."""

from __future__ import annotations

from titan.worker.context import RankLogFilter, WorkerContext
from titan.beacon.hooks import add_comm_hook_wrapper, remove_comm_hook_wrapper, wrap_comm_hook
from titan.worker.dist import DistInitError, backoff_delays, init_distributed, measure_clock_offsets, pick_backend

__all__ = [
    "DistInitError", "RankLogFilter", "WorkerContext", "add_comm_hook_wrapper", "remove_comm_hook_wrapper", "wrap_comm_hook", "backoff_delays", "init_distributed",
    "measure_clock_offsets", "pick_backend",
]
