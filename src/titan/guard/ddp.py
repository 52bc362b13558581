"""DDP: a communication hook that flags each bucket before its all-reduce, and carries the
guard's step vector alongside the gradients.

Per bucket and call, the hook

1. reads the bucket's *local* gradients once (``foreach_norm`` over views of the flat
   buffer) and keeps the per-parameter norms **as a tensor** — no ``.item()``, no host
   sync; a NaN/Inf anywhere makes the norm non-finite;
2. at the last bucket (DDP launches buckets in index order, so every bucket's local norms
   are known by then) asks the guard for this rank's step vector (its loss and local norm,
   :func:`titan.guard.decision.step_vector`) and launches its all-reduce *before* the
   bucket's own: the verdict's exchange rides the gradients' synchronisation instead of
   adding a second one after the backward — by the time DDP has waited for its last
   bucket, the vector is summed too;
3. averages and all-reduces the bucket exactly as torch's default ``allreduce_hook``
   (divide by the world size, ``SUM``), so the reduced gradients are bitwise those of that
   hook.

At world 1 there is nothing to reduce: the hook returns the bucket as it is (after a
drill's fault) and the check reads nothing before the backward ends — the local gradients
are the final ones, checked as without a wrapper (``LocalCheck``).

The global norm of the reduced gradients (for clipping and the gradient-spike check) is
the one the loop noted (``note_norm``: the framework's clipping norm), else read from the
gradients once when the guard asks for it after the backward.

Parameters are mapped from ``bucket.parameters()`` on every call, because DDP rebuilds
its buckets after the first iteration (one bucket first, then several in reverse order).
A NaN/Inf survives the all-reduce on every rank; only then does the guard all-gather
per-parameter details to name ranks and parameters.
"""

import logging
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from titan.guard.checks import GradCheck, _foreach_norms, index_tensor, local_norms
from titan.beacon.hooks import wrap_comm_hook

__all__ = ["DDPCheck"]

log = logging.getLogger(__name__)


class DDPCheck(GradCheck):
    """Guard check for ``DistributedDataParallel`` (registers the comm hook).

    Raises ``UserError`` when the model already has a comm hook (DDP allows one).
    """

    mode = "ddp"

    def __init__(self, ddp: nn.Module, process_group: Any | None = None) -> None:
        super().__init__(ddp)
        self._pg = process_group
        self._world = dist.get_world_size(process_group) if dist.is_available() and dist.is_initialized() else 1
        self._active = True
        self._pre: dict[int, tuple[list[int], torch.Tensor]] = {}
        self._fallback: tuple[torch.Tensor, torch.Tensor] | None = None
        self._reduced: tuple[torch.Tensor, torch.Tensor] | None = None
        self._ride: tuple[torch.Tensor, Any] | None = None
        #: Called with each bucket's flat local gradients before they are read and reduced
        #: (a drill's gradient faults; ``titan.guard.progress``).
        self.before_reduce: Any = None
        #: Called at the last bucket: this rank's step vector to all-reduce with the
        #: gradients, or None (the guard then exchanges it after the backward).
        self.ride: Callable[[], torch.Tensor | None] | None = None
        try:
            # Observers (tracing, beacon counters) wrap the one hook DDP allows.
            ddp.register_comm_hook(self, wrap_comm_hook(_guard_hook))  # type: ignore[operator]
        except RuntimeError as e:
            from titan.errors import UserError

            raise UserError(f"cannot install the guard's DDP comm hook: {e}",
                            "the guard needs DDP's one comm hook; remove your own register_comm_hook") from None

    def begin_step(self) -> None:
        super().begin_step()
        self._pre.clear()
        self._fallback = None
        self._reduced = None
        self._ride = None

    def _covered(self) -> bool:
        return sum(len(idx) for idx, _ in self._pre.values()) == len(self.params)

    def _direct(self) -> tuple[torch.Tensor, torch.Tensor]:
        # The hook did not run this step (backward outside DDP, or no_sync on the last
        # micro-batch): read the gradients directly, as the no-wrapper path does.
        if self._fallback is None:
            if self._world > 1:
                log.warning("DDP comm hook did not cover every parameter this step; reading grads directly")
            self._fallback = local_norms(self.params, self.device())
        return self._fallback

    def local_norm(self) -> torch.Tensor:
        if self._world == 1 and self._noted is not None and self._fallback is None:
            return self._noted  # nothing was reduced: the final gradients are this rank's
        return torch.linalg.vector_norm(self.local_unit_norms())

    def local_unit_norms(self) -> torch.Tensor:
        if not self._covered():
            return self._direct()[0]
        out = torch.zeros(len(self.params), dtype=torch.float32, device=self.device())
        for idx, norms in self._pre.values():
            out[index_tensor(tuple(idx), out.device)] = norms
        return out

    def norm_slot(self) -> torch.Tensor:
        """The global norm of the reduced gradients: one ``foreach_norm`` read of them, in
        model order as ``get_total_norm`` stacks them (the clip coefficient is bitwise the
        one ``clip_grad_norm_`` computes on the same gradients). Computed once per step."""
        if self._noted is not None:
            return self._noted
        if self._world == 1 or not self._covered():
            return self._direct()[1]
        if self._reduced is None:
            self._reduced = local_norms(self.params, self.device())
        return self._reduced[1]

    def take_ride(self) -> torch.Tensor | None:
        """The step vector summed with the gradients this step (waits for its all-reduce,
        normally complete since DDP waited for the last bucket), or None if none rode."""
        ride, self._ride = self._ride, None
        if ride is None:
            return None
        vec, work = ride
        if work is not None:
            work.wait()
        return vec

    def unit_groups(self) -> list[str]:
        groups = ["-"] * len(self.params)
        for b, (idx, _) in self._pre.items():
            for i in idx:
                groups[i] = f"bucket{b}"
        return groups

    def close(self) -> None:
        # DDP cannot unregister a comm hook; the hook then behaves as allreduce_hook.
        self._active = False
        self.ride = None

    # -- inside the hook -------------------------------------------------------------------
    def _launch_ride(self) -> None:
        if self.ride is None or self._world == 1 or not self._covered():
            return
        vec = self.ride()
        if vec is None:
            return
        work = dist.all_reduce(vec, group=self._pg, async_op=True) if self._world > 1 else None
        self._ride = (vec, work)

    def _reduce(self, buf: torch.Tensor) -> "torch.futures.Future[torch.Tensor]":
        if self._world == 1:  # dividing by 1 and summing over one rank change nothing
            fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
            fut.set_result(buf)
            return fut
        # torch's allreduce_hook, inlined: the same division and SUM, hence the same bits.
        buf.div_(self._world)
        work = dist.all_reduce(buf, group=self._pg, async_op=True)
        return work.get_future().then(_first)


def _first(fut: "torch.futures.Future[list[torch.Tensor]]") -> torch.Tensor:
    return fut.value()[0]


# No ``from __future__ import annotations`` here: DDP checks the hook's annotations at runtime.
def _guard_hook(state: DDPCheck, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    if not state._active:
        return allreduce_hook(state._pg, bucket)
    buf = bucket.buffer()
    if state.before_reduce is not None:
        state.before_reduce(buf)
    if state._world == 1:
        return state._reduce(buf)  # the check reads the final gradients after the backward
    params = bucket.parameters()  # re-read every call: buckets are rebuilt after step 1
    idx = [state.index[id(p)] for p in params]
    views = list(buf.split([p.numel() for p in params]))
    low = buf.dtype in (torch.float16, torch.bfloat16)
    pre = torch._foreach_norm(views, 2.0, dtype=torch.float32) if low else _foreach_norms(views)
    state._pre[bucket.index()] = (idx, torch.stack(list(pre)).to(torch.float32))
    if bucket.is_last():
        state._launch_ride()  # before the bucket's own all-reduce: queued first, done first
    return state._reduce(buf)
