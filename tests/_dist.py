"""How a spawned gloo test worker leaves once its process group is destroyed.

FSDP2's DTensor caches (sharding propagation) keep the mesh's process group alive past
``destroy_process_group`` — its gloo threads (``pt_gloo_runloop``, ``gloo_tcp_loop``) still
run afterwards, measured with torch 2.13 — and the interpreter's teardown then destroys it
in an order that can abort the process: ``terminate called without an active exception``,
exit -6 (CI; 1 in 10 two-rank runs here). A worker that has written its results leaves
without that teardown.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def leave_without_teardown(code: int = 0) -> NoReturn:
    """Flush stdout/stderr and end the process now (``os._exit``): call it after
    ``destroy_process_group`` and after every result is written (a ``SimpleQueue`` or a
    file closed; a ``multiprocessing.Queue``'s feeder thread would be cut off)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
