"""Progress beacons: a memory-mapped record per rank that the watchdog reads from outside.

In a training loop::

    import titan.beacon as beacon
    b = beacon.install(ctx)                 # before init_distributed
    ddp.register_comm_hook(None, beacon.comm_hook())
    for step in ...:
        b.step_begin(step)
        with beacon.phase("data"): batch = next(it)
        with beacon.phase("forward"): loss = model(batch)
        ...
        b.step_end(step)

Cheap to import (no torch at import time). Sits below ``titan.worker`` (it imports no other
Titan package); ``hooks.py`` is the one DDP comm-hook registry (the guard owns the hook,
observers — these counters, tracing, fault injection — wrap it).
"""

from __future__ import annotations

from titan.beacon.core import DEFAULT_COMPUTE_PHASES, Beacon, done, get_beacon, phase, proc_start_ticks, set_beacon
from titan.beacon.install import (
    DUMP_SIGNAL, beacon_dir, beacon_path, comm_hook, count_collectives, install, stacks_path,
)
from titan.beacon.hooks import add_comm_hook_wrapper, remove_comm_hook_wrapper, wrap_comm_hook
from titan.beacon.layout import BeaconSnapshot, decode
from titan.beacon.reader import read_beacon, request_dump, scan_beacons

__all__ = [
    "Beacon", "BeaconSnapshot", "add_comm_hook_wrapper", "remove_comm_hook_wrapper", "wrap_comm_hook", "DEFAULT_COMPUTE_PHASES", "DUMP_SIGNAL", "beacon_dir", "beacon_path", "comm_hook",
    "count_collectives", "decode", "done", "get_beacon", "install", "phase", "proc_start_ticks", "read_beacon",
    "request_dump", "scan_beacons", "set_beacon", "stacks_path",
]
