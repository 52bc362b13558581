"""One exchange per step and one verdict, identical on every rank.

Each rank writes its own slots of a small float32 vector — its loss and its pre-reduce
local gradient norm (NaN/Inf there *is* the non-finite check) — and rank 0 writes the
global gradient norm and the loss scale (FSDP2: every rank adds its partial sum of
squares). One ``SUM`` all-reduce of ``3 + 3·world`` floats later, every rank holds bitwise
the same vector (adding zeros is exact), reads it to the host once, and runs the same pure
function :func:`judge` on it with the same statistics: a rank can never decide alone, and
every float compared to a threshold is an exchanged value.

Under DDP the all-reduce can ride the gradients' own (:mod:`titan.guard.ddp`): the vector
then carries no global norm — each rank computes it from the reduced gradients, bitwise
the same everywhere — and each rank's value travels in the *next* step's vector
(``prev`` slots) before it enters the statistics, so they stay identical on every rank and
a rank that computed another norm is seen.

A passenger (``StepGuard.use_checkpointer``: the checkpointer's SIGTERM / save-due flags)
appends its own slots; each rank adds its values, so a flag raised on any rank arrives as a
count above 0 on every rank, with the vector's one exchange — no second one for it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import torch

from titan.guard.stats import RobustWindow

__all__ = ["Observation", "Verdict", "exchange", "judge", "gather_objects"]


@dataclasses.dataclass(frozen=True)
class Observation:
    """What every rank knows after the step's exchange (host floats + the device norm)."""

    losses: tuple[float, ...]
    codes: tuple[int, ...]
    local_norms: tuple[float, ...]
    grad_norm: float  # of the reduced gradients, divided by the loss scale
    scale: float
    norm_t: torch.Tensor  # device tensor of the (scaled) global norm, for clipping
    verify: bool = False  # some rank asked for a verification replay of this step
    #: False when the vector rode DDP's gradient all-reduce: each rank computed ``grad_norm``
    #: itself from the reduced gradients (bitwise the same on every rank, as DDP's replicas
    #: are); it is then exchanged one step later (``prev_norms``) before it enters the statistics.
    norm_exchanged: bool = True
    raw_norm: float = math.nan  # ``grad_norm`` before the division by the loss scale (float32 exact)
    #: each rank's gradient norm of the previous step when that one was not exchanged (else 0)
    prev_norms: tuple[float, ...] = ()
    #: the passenger's slots summed over ranks (:func:`step_vector` ``extra``)
    extra: tuple[float, ...] = ()

    @property
    def nonfinite(self) -> bool:
        return (any(c > 0 for c in self.codes) or not math.isfinite(self.grad_norm)
                or not all(math.isfinite(x) for x in self.losses))


def _dist_world(group: Any) -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(group), dist.get_world_size(group)
    return 0, 1


def _code(local_norm: float) -> int:
    # The local norm carries the check: NaN if any unit held a NaN, +Inf if any held an
    # Inf (or the norm overflowed float32) and none a NaN.
    return 2 if math.isnan(local_norm) else (1 if math.isinf(local_norm) else 0)


def step_vector(loss: torch.Tensor, local_norm: torch.Tensor, norm_slot: torch.Tensor | None, *,
                partial_sq: bool, scale: torch.Tensor | None, verify: bool, prev_norm: float | None,
                group: Any = None, extra: Sequence[float] = ()) -> torch.Tensor:
    """This rank's contribution to the step vector (summed over ranks by one all-reduce).

    Layout ``[norm, scale, loss_0..loss_{W-1}, local_0..local_{W-1}, verify, prev_0..prev_{W-1},
    extra_0..extra_{K-1}]``:
    rank r writes its slots ``2 + r``, ``2 + W + r`` and ``3 + 2·W + r`` (the gradient norm it
    computed for the previous step when that one was not exchanged, see :class:`Observation`),
    rank 0 the first two (``norm_slot`` None: the slot stays 0 and each rank fills in its own
    norm after the reduction), and every rank that asked for a verification replay adds 1 to
    ``verify``; ``extra`` (a passenger's K small integers, the same K on every rank) is added
    by every rank. Adding zeros and small integers is exact: after the sum every rank holds
    the same bits.
    """
    rank, world = _dist_world(group)
    dev = local_norm.device
    zero = _const(0.0, dev)
    slots = [zero] * (3 + 3 * world)  # one stack below: a single small kernel, no host sync
    if rank == 0 or partial_sq:
        slots[0] = norm_slot.detach().float().reshape(()) if norm_slot is not None else zero
    if rank == 0:
        slots[1] = scale.float().reshape(()) if scale is not None else _const(1.0, dev)
    slots[2 + rank] = loss.detach().float().reshape(())
    slots[2 + world + rank] = local_norm.float().reshape(())
    if verify:
        slots[2 + 2 * world] = _const(1.0, dev)
    if prev_norm is not None:
        slots[3 + 2 * world + rank] = torch.full((), prev_norm, dtype=torch.float32, device=dev)
    slots.extend(_const(float(x), dev) for x in extra)
    return torch.stack(slots)


_CONSTS: dict[tuple[float, str], torch.Tensor] = {}


def _const(x: float, dev: torch.device) -> torch.Tensor:
    """A cached 0-d float32 constant on ``dev`` (read only: stacked, never written)."""
    key = (x, str(dev))
    t = _CONSTS.get(key)
    if t is None:
        t = _CONSTS[key] = torch.full((), x, dtype=torch.float32, device=dev)
    return t


def observe(vec: torch.Tensor, *, partial_sq: bool, norm_t: torch.Tensor | None = None,
            group: Any = None) -> Observation:
    """Read a summed step vector on the host (one transfer) as this step's :class:`Observation`.

    ``norm_t``: the global norm this rank computed itself from the reduced gradients (the
    vector then carried none, :func:`step_vector` with ``norm_slot=None``); it is written into
    the slot before the one host read. Without it the norm is the exchanged one.
    """
    _, world = _dist_world(group)
    if norm_t is not None:
        vec[0] = norm_t.detach().float().reshape(())
        norm_dev = norm_t
    else:
        norm_dev = vec[0].sqrt() if partial_sq else vec[0]
    host = vec.tolist()  # the guard's one host sync per optimizer step
    scale_f = host[1]
    norm = math.sqrt(host[0]) if partial_sq and host[0] >= 0 else host[0]
    locals_ = tuple(host[2 + world:2 + 2 * world])
    return Observation(
        losses=tuple(host[2:2 + world]),
        codes=tuple(_code(x) for x in locals_),
        local_norms=locals_,
        grad_norm=norm / scale_f if scale_f else norm,
        scale=scale_f,
        norm_t=norm_dev,
        verify=host[2 + 2 * world] > 0,
        norm_exchanged=norm_t is None,
        raw_norm=norm,
        prev_norms=tuple(host[3 + 2 * world:3 + 3 * world]),
        extra=tuple(host[3 + 3 * world:]),
    )


def exchange(loss: torch.Tensor, local_norm: torch.Tensor, norm_slot: torch.Tensor,
             *, partial_sq: bool, scale: torch.Tensor | None, verify: bool = False,
             prev_norm: float | None = None, group: Any = None, extra: Sequence[float] = ()) -> Observation:
    """Build and all-reduce the step vector; one host read. Collective when world > 1.

    The separate exchange: used where the vector could not ride the gradients' own
    all-reduce (:mod:`titan.guard.ddp`) — FSDP2, no wrapper, a loop that hands the guard its
    loss only after the backward, a replay. Cost: one ``all_reduce`` of ``3 + 3·world``
    (+ ``len(extra)``) float32 (none at world 1) and one device-to-host copy of the same size.
    """
    import torch.distributed as dist

    vec = step_vector(loss, local_norm, norm_slot, partial_sq=partial_sq, scale=scale, verify=verify,
                      prev_norm=prev_norm, group=group, extra=extra)
    if _dist_world(group)[1] > 1:
        dist.all_reduce(vec, group=group)
    return observe(vec, partial_sq=partial_sq, group=group)


def gather_objects(obj: Any, group: Any = None) -> list[Any]:
    """All-gather one picklable object per rank (fault path only). Collective."""
    import torch.distributed as dist

    _, world = _dist_world(group)
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj, group=group)
    return out


@dataclasses.dataclass(frozen=True)
class Verdict:
    """``kind``: None (clean), nonfinite, overflow, loss_spike or grad_spike."""

    kind: str | None
    ranks: tuple[int, ...] = ()
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def bad(self) -> bool:
        """A fault the guard handles itself (overflow is the scaler's business)."""
        return self.kind is not None and self.kind != "overflow"


def judge(obs: Observation, *, loss_stats: RobustWindow, grad_stats: RobustWindow, spike_z: float,
          loss_spike: bool, grad_spike: bool, scaler: bool) -> Verdict:
    """Classify one step; a pure function of identical inputs on every rank.

    Non-finite: a rank whose loss is non-finite, or whose pre-reduce gradients hold a NaN
    (with a GradScaler) or any NaN/Inf (without), is a culprit. With a scaler, ±Inf-only
    gradients are an *overflow* (the scaler lowers its scale; no strike). A non-finite
    global norm with no culprit means the values appeared in the collective itself.
    """
    if obs.nonfinite:
        bad_loss = [r for r, x in enumerate(obs.losses) if not math.isfinite(x)]
        limit = 2 if scaler else 1
        bad_grad = [r for r, c in enumerate(obs.codes) if c >= limit]
        ranks = tuple(sorted(set(bad_loss) | set(bad_grad)))
        if not ranks and scaler and (any(c == 1 for c in obs.codes) or math.isinf(obs.grad_norm)):
            return Verdict("overflow", (), {"codes": list(obs.codes)})
        where = "local" if ranks else "collective"
        return Verdict("nonfinite", ranks, {"codes": list(obs.codes), "loss_ranks": bad_loss, "origin": where})
    if loss_spike and loss_stats.ready:
        zs = [loss_stats.z(x) for x in obs.losses]
        ranks = tuple(r for r, z in enumerate(zs) if z > spike_z)
        if ranks:
            med, _ = loss_stats.center_scale()
            return Verdict("loss_spike", ranks, {"z": [round(z, 2) for z in zs], "median": med})
    if grad_spike and grad_stats.ready:
        z = grad_stats.z(obs.grad_norm)
        if z > spike_z:
            top = max(range(len(obs.local_norms)), key=lambda r: obs.local_norms[r])
            med, _ = grad_stats.center_scale()
            return Verdict("grad_spike", (top,), {"z": round(z, 2), "median_norm": math.exp(med)})
    return Verdict(None)
