"""Titan: keep large distributed training alive through transient faults.

The in-process library is what a training script imports — in one line, ``import titan``:

* ``titan.WorkerContext`` (``titan.worker``): rank, attempt, run directory, events; under
  ``titan run`` it wires the progress beacon and the fault boundary by itself;
* ``titan.init_distributed``: the process group with retries and two timeouts;
* ``titan.StepGuard`` (``titan.guard``): NaN/spike check before the all-reduce, one decision
  on every rank, the update; drives the beacon's phases and the ``step`` event;
* ``titan.Checkpointer`` (``titan.checkpoint``): complete, atomic, checksummed DCP state;
* ``titan.ResumableSampler`` (``titan.data``): the data position a checkpoint saves.

The CLI (``titan VERB``) launches, watches, drills and reports. Everything meets in one run
directory (``titan.events``). The names above are loaded on first use: ``import titan``
costs no torch import.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

#: The public in-process names and the module each comes from (loaded on first use).
_LAZY = {
    "WorkerContext": "titan.worker", "init_distributed": "titan.worker", "StepGuard": "titan.guard",
    "Checkpointer": "titan.checkpoint", "ResumableSampler": "titan.data",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'titan' has no attribute {name!r}")
