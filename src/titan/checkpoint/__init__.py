"""Checkpoints that never lose work: complete, sharded (DCP), async, atomic, verified, safe.

Three calls in a training loop (``docs/checkpoint.md``)::

    ckpt = Checkpointer(ctx)
    start = ckpt.restore(app_state)          # 0 when there is nothing to resume
    for step in range(start + 1, steps + 1):
        ...                                  # one optimizer step
        ckpt.maybe_save(step, app_state)     # every checkpoint.every_steps; SIGTERM → save + exit 9
    ckpt.close()

Modules: ``checkpointer`` (the API), ``state`` (what is saved, RNG), ``storage`` (DCP
writer with checksums, safe reader/planner), ``manifest`` (layout, manifest, verify),
``commit`` (rename, ``latest``, retention, failure classes), ``restore`` (choice and
fallback), ``snapshot`` (``/dev/shm``), ``staging`` (reused buffers), ``inject`` (crash points).
Heavy imports (torch, DCP) happen inside functions, so importing this package is cheap.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Checkpointer", "Preempted", "CheckpointLoadError", "CheckpointsLost", "ddp_warmup", "verify", "VerifyResult"]


def __getattr__(name: str) -> Any:  # lazy: keep `import titan.checkpoint` cheap
    if name in ("Checkpointer", "Preempted", "CheckpointLoadError", "CheckpointsLost"):
        from titan.checkpoint import checkpointer

        return getattr(checkpointer, name)
    if name == "ddp_warmup":
        from titan.checkpoint.state import ddp_warmup

        return ddp_warmup
    if name in ("verify", "VerifyResult"):
        from titan.checkpoint import manifest

        return getattr(manifest, name)
    raise AttributeError(name)
