"""The data position, public: what a checkpoint saves so that a resumed run reads on where
the interrupted one stopped.

* ``ResumableSampler``: a drop-in for ``DistributedSampler`` (``set_epoch`` included) whose
  position is saved with the app state and followed by a running ``for`` loop after a
  restore or rollback; world-size independent.
* ``step_batches(loader, accum)``: the micro-batches of each step for a loop over a
  prefetching loader, rebuilt after a restore or rollback (the guard's replay reuses them).
* Batches drawn at random (``torch.randint`` indices, a random crop): nothing to add — the
  checkpoint saves and restores each rank's RNG streams (Python, NumPy, torch CPU/CUDA),
  so the resumed run draws the same batches (``titan.checkpoint``, docs/integrate.md).
"""

from __future__ import annotations

from titan.data.sampler import ResumableSampler, step_batches

__all__ = ["ResumableSampler", "step_batches"]
