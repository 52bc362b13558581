"""Warm workers: a restarted worker is a fork of a process that already imported everything.

A cold worker pays for Python and ``import torch`` (3.7 s of a 6.3 s restart on an idle
2-core machine, more on a loaded one) before it does anything. ``titan run`` starts one
*zygote* per node (:mod:`titan.warm.zygote`) that imports torch, Titan's in-process library
and the script's own imports once, before any CUDA initialisation; torchrun's agent keeps
starting one process per worker, but that process is a tiny stub (:mod:`titan.warm.stub`)
that has the zygote fork the worker and then stands in for it (signals in, exit status
out). Every failure of this path falls back to the cold spawn and says so
(``worker.started`` ``spawn``, ``launcher.warm`` events). ``docs/launch.md`` ("Warm workers").
"""

from __future__ import annotations

from titan.warm.pool import STUB_PATH, WarmPool, stub_entrypoint

__all__ = ["WarmPool", "stub_entrypoint", "STUB_PATH"]
