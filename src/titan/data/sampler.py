"""A resumable, world-size-independent sampler: the data position a checkpoint saves.

The sample order is one global stream: the concatenation of per-epoch orders of the
dataset (a permutation drawn from ``(seed, epoch)``, or ``0..N-1`` without shuffling). The
loop consumes it in global batches of ``world_size × batch_size`` samples; rank r reads
the r-th slice of each global batch. The state is ``(seed, epoch, offset, consumed)`` —
where the training loop stands in the stream, the same on every rank. Because the position
is counted in global samples, resuming with another world size re-splits the rest of the
stream: no sample is dropped or read twice, and no padding duplicates are added (unlike
``DistributedSampler``).

Two ways the position moves (``commit``):

* ``"draw"`` (default): when the DataLoader draws a batch of indices. Exact when the loader
  does not draw ahead of the loop — ``num_workers=0``, the DataLoader default. A running
  iterator follows :meth:`load_state_dict` at the next batch, so a restore or a guard
  rollback rewinds the ``for`` loop's data without rebuilding the loader.
* ``"advance"``: only when the loop calls :meth:`advance` after its optimizer step; a
  loader that prefetches (``num_workers > 0``) then never moves the saved position.
  ``iter()`` starts at the committed position: create the iterator after a restore.

Epochs: a loop that calls :meth:`set_epoch` (as with ``DistributedSampler``) gets one epoch
per ``iter()`` — the rest of epoch ``e`` from the saved offset, nothing for an epoch a
resumed run already finished — so ``for epoch in range(E): sampler.set_epoch(epoch); for
batch in loader: …`` resumes mid-epoch unchanged. Without ``set_epoch`` the stream is
endless (a step-counted loop ends it). The last ``N mod global batch`` samples of an epoch
are dropped in epoch mode (``drop_last``).
"""

from __future__ import annotations

import os
from typing import Any, Iterator, Sized

import numpy as np
import torch
from torch.utils.data import Sampler

__all__ = ["ResumableSampler", "step_batches"]


def _mark_data() -> None:
    """Phase ``data`` on the progress beacon from this draw to the next forward (the hang
    watchdog then names a stuck data pipeline); no-op without a beacon."""
    from titan.beacon import get_beacon

    b = get_beacon()
    if b is not None:
        if b.on_data is not None:
            b.on_data()  # the step guard begins the step this batch feeds
        b.set_phase("data")


def _world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


class ResumableSampler(Sampler[int]):
    """Yields this rank's dataset indices from the saved position (see the module doc).

    ``dataset``: the dataset (its ``len``) or the number of samples. ``rank`` and
    ``world_size`` default to the process group's (or ``RANK`` / ``WORLD_SIZE``).
    Put it in the checkpointed state (``{"sampler": sampler, …}``): ``state_dict`` holds the
    position. Cost: one ``randperm(N)`` per epoch touched (the last two are cached).
    Raises ``ValueError`` for a bad size, rank or mode.
    """

    def __init__(self, dataset: Sized | int, batch_size: int, *, seed: int = 0, shuffle: bool = True,
                 rank: int | None = None, world_size: int | None = None, commit: str = "draw") -> None:
        num_samples = dataset if isinstance(dataset, int) else len(dataset)
        if num_samples < 1 or batch_size < 1:
            raise ValueError("the dataset and batch_size must have at least one sample")
        if rank is None or world_size is None:
            r, w = _world()
            rank = r if rank is None else rank
            world_size = w if world_size is None else world_size
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        if commit not in ("draw", "advance"):
            raise ValueError(f"commit must be 'draw' or 'advance', not {commit!r}")
        self.num_samples, self.batch_size = num_samples, batch_size
        self.seed, self.shuffle, self.rank, self.world_size = seed, shuffle, rank, world_size
        self.commit = commit
        self.epoch = 0
        self.offset = 0      # position inside the current epoch's order
        self.consumed = 0    # global samples consumed since the start of training
        self._requested: int | None = None  # set_epoch(); None: one endless stream
        self._perms: dict[int, torch.Tensor] = {}
        #: Bumped by every ``load_state_dict`` (a restore, a rollback): an iterator started
        #: before it reads from a position that is no longer the loop's (``step_batches``).
        self.generation = 0

    @property
    def global_batch(self) -> int:
        """Samples one micro-step takes from the stream across all ranks."""
        return self.world_size * self.batch_size

    def permutation(self, epoch: int) -> torch.Tensor:
        """The order of epoch ``epoch``; the same on every rank, for any world size."""
        if not self.shuffle:
            return torch.arange(self.num_samples)
        if epoch not in self._perms:
            if len(self._perms) >= 2:  # a stream crosses at most one epoch boundary at a time
                del self._perms[min(self._perms)]
            s = int(np.random.SeedSequence([self.seed, epoch]).generate_state(1, np.uint64)[0] >> 1)
            self._perms[epoch] = torch.randperm(self.num_samples, generator=torch.Generator().manual_seed(s))
        return self._perms[epoch]

    def stream(self, start: int, count: int) -> list[int]:
        """``count`` dataset indices of the global stream from ``start`` samples after the
        current position (across epoch boundaries)."""
        out: list[int] = []
        pos = self.offset + start
        epoch = self.epoch + pos // self.num_samples
        pos %= self.num_samples
        while len(out) < count:
            take = min(count - len(out), self.num_samples - pos)
            out.extend(self.permutation(epoch)[pos:pos + take].tolist())
            epoch, pos = epoch + 1, 0
        return out

    def set_epoch(self, epoch: int) -> None:
        """Iterate epoch ``epoch`` next (``DistributedSampler``'s call): from the saved offset
        when it is the saved epoch, nothing when a resumed run already finished it."""
        self._requested = int(epoch)

    def __iter__(self) -> Iterator[int]:
        if self.commit == "advance":
            yield from self._iter_committed()
            return
        if self._requested is not None:
            if self._requested < self.epoch:
                return  # finished before the restart
            if self._requested > self.epoch:
                self.epoch, self.offset = self._requested, 0
            epoch = self.epoch
            while self.epoch == epoch and self.offset + self.global_batch <= self.num_samples:
                yield from self._draw()
            if self.epoch == epoch:  # the epoch's tail, shorter than a global batch, is dropped
                self.consumed += self.num_samples - self.offset
                self.epoch, self.offset = epoch + 1, 0
            return
        while True:
            yield from self._draw()

    def _draw(self) -> list[int]:
        # Read the live position: a load_state_dict (restore, rollback) is followed at once.
        _mark_data()
        idx = self.stream(self.rank * self.batch_size, self.batch_size)
        self.advance(self.global_batch)
        return idx

    def _iter_committed(self) -> Iterator[int]:
        # A snapshot: later advance() calls do not disturb an iterator already running.
        snap = ResumableSampler(self.num_samples, self.batch_size, seed=self.seed, shuffle=self.shuffle,
                                rank=self.rank, world_size=self.world_size)
        snap.epoch, snap.offset = self.epoch, self.offset
        k = 0
        while True:
            _mark_data()
            yield from snap.stream(k * snap.global_batch + snap.rank * snap.batch_size, snap.batch_size)
            k += 1

    def __len__(self) -> int:
        """This rank's indices in one epoch (``len(loader)`` is then the batches per epoch, as
        with ``DistributedSampler``); after ``set_epoch``, those left in that epoch."""
        if self._requested is None or self.commit == "advance":
            return self.num_samples // self.global_batch * self.batch_size
        if self._requested < self.epoch:
            return 0
        offset = self.offset if self._requested == self.epoch else 0
        return (self.num_samples - offset) // self.global_batch * self.batch_size

    def advance(self, global_samples: int) -> None:
        """Move the position by ``global_samples`` (``commit="advance"``: call it after the
        optimizer step with what the step consumed across all ranks)."""
        if global_samples < 0:
            raise ValueError("global_samples must be >= 0")
        self.consumed += global_samples
        pos = self.offset + global_samples
        self.epoch += pos // self.num_samples
        self.offset = pos % self.num_samples

    def state_dict(self) -> dict[str, Any]:
        """The position in the stream; independent of rank, world size and batch size."""
        return {"seed": self.seed, "num_samples": self.num_samples, "epoch": self.epoch,
                "offset": self.offset, "consumed": self.consumed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at ``state``'s position. Raises ``ValueError`` for another dataset size or seed."""
        if int(state["seed"]) != self.seed or int(state["num_samples"]) != self.num_samples:
            raise ValueError(
                f"sampler state is for seed {state['seed']} / {state['num_samples']} samples, "
                f"this run has seed {self.seed} / {self.num_samples} samples")
        self.epoch, self.offset, self.consumed = int(state["epoch"]), int(state["offset"]), int(state["consumed"])
        self.generation += 1


def step_batches(loader: Any, per_step: int = 1, *, to: Any = None) -> Iterator[list[Any]]:
    """The batches of each optimizer step, endlessly: ``per_step`` batches of ``loader`` (whose
    sampler is a :class:`ResumableSampler`) at a time, each passed through ``to`` (e.g. a move
    to the device). The list is what a guard's replay needs again. When the sampler's position
    was loaded since the loader's iterator started (a restore, a guard or SDC rollback), the
    iterator is rebuilt from the new position first — the batches it prefetched belong to
    steps that no longer happen. So a ``for micro_batches in step_batches(loader, accum):``
    loop keeps its shape through rollbacks. Cost: a new DataLoader iterator after each load.
    """
    sampler = getattr(loader, "sampler", None)
    if not isinstance(sampler, ResumableSampler):
        raise ValueError("step_batches needs a DataLoader whose sampler is a titan.data.ResumableSampler")
    while True:
        gen = sampler.generation
        it = iter(loader)
        try:
            while sampler.generation == gen:
                batch = [next(it) for _ in range(per_step)]
                yield [to(b) for b in batch] if to is not None else batch
        finally:
            del it  # shuts DataLoader workers down
