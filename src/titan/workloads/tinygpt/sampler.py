"""A resumable, world-size-independent sampler.

The sample order is one global stream: the concatenation of per-epoch permutations of
the dataset, each drawn from ``(seed, epoch)``. The training loop consumes it in global
batches of ``world_size x batch_size`` samples; rank r reads the r-th slice of each
global batch. The state is ``(seed, epoch, offset, consumed)`` — where the *training
loop* stands in the stream, identical on every rank — and advances only when the loop
calls :meth:`ResumableSampler.advance` after an optimizer step. A DataLoader may prefetch
ahead (``num_workers > 0``) without moving it. Because the position is counted in global
samples, resuming with another world size re-splits the rest of the stream: no sample is
dropped or read twice, and no padding duplicates are added (unlike DistributedSampler).
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import Sampler

__all__ = ["ResumableSampler"]


class ResumableSampler(Sampler[int]):
    """Yields this rank's dataset indices, forever, from the committed position.

    ``iter()`` snapshots the committed position: create the DataLoader iterator *after*
    ``load_state_dict``. Cost: one ``randperm(num_samples)`` per epoch touched (cached).
    """

    def __init__(self, num_samples: int, batch_size: int, *, seed: int = 0, rank: int = 0,
                 world_size: int = 1) -> None:
        if num_samples < 1 or batch_size < 1:
            raise ValueError("num_samples and batch_size must be >= 1")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        self.num_samples, self.batch_size = num_samples, batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.epoch = 0
        self.offset = 0      # position inside the current epoch's permutation
        self.consumed = 0    # global samples consumed since the start of training
        self._perms: dict[int, torch.Tensor] = {}

    @property
    def global_batch(self) -> int:
        """Samples one micro-step takes from the stream across all ranks."""
        return self.world_size * self.batch_size

    def permutation(self, epoch: int) -> torch.Tensor:
        """The order of epoch ``epoch``; the same on every rank, for any world size."""
        if epoch not in self._perms:
            if len(self._perms) >= 2:  # a stream crosses at most one epoch boundary at a time
                del self._perms[min(self._perms)]
            s = int(np.random.SeedSequence([self.seed, epoch]).generate_state(1, np.uint64)[0] >> 1)
            self._perms[epoch] = torch.randperm(self.num_samples, generator=torch.Generator().manual_seed(s))
        return self._perms[epoch]

    def stream(self, start: int, count: int) -> list[int]:
        """``count`` dataset indices of the global stream from ``start`` samples after the
        committed position (across epoch boundaries)."""
        out: list[int] = []
        pos = self.offset + start
        epoch = self.epoch + pos // self.num_samples
        pos %= self.num_samples
        while len(out) < count:
            take = min(count - len(out), self.num_samples - pos)
            out.extend(self.permutation(epoch)[pos:pos + take].tolist())
            epoch, pos = epoch + 1, 0
        return out

    def __iter__(self) -> Iterator[int]:
        # Snapshot: later advance() calls do not disturb an iterator already running.
        snap = ResumableSampler(self.num_samples, self.batch_size, seed=self.seed, rank=self.rank,
                                world_size=self.world_size)
        snap.epoch, snap.offset = self.epoch, self.offset
        k = 0
        while True:
            yield from snap.stream(k * snap.global_batch + snap.rank * snap.batch_size, snap.batch_size)
            k += 1

    def advance(self, global_samples: int) -> None:
        """Commit ``global_samples`` consumed by the training loop (call after the optimizer step)."""
        if global_samples < 0:
            raise ValueError("global_samples must be >= 0")
        self.consumed += global_samples
        pos = self.offset + global_samples
        self.epoch += pos // self.num_samples
        self.offset = pos % self.num_samples

    def state_dict(self) -> dict[str, Any]:
        """Position in the stream; independent of rank, world size and batch size."""
        return {"seed": self.seed, "num_samples": self.num_samples, "epoch": self.epoch,
                "offset": self.offset, "consumed": self.consumed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state``'s position. Raises ``ValueError`` for another corpus or seed."""
        if int(state["seed"]) != self.seed or int(state["num_samples"]) != self.num_samples:
            raise ValueError(
                f"sampler state is for seed {state['seed']} / {state['num_samples']} samples, "
                f"this run has seed {self.seed} / {self.num_samples} samples")
        self.epoch, self.offset, self.consumed = int(state["epoch"]), int(state["offset"]), int(state["consumed"])
