"""The drills' built-in fault plans: ``quick``, ``full``, ``cover`` (CI's subset), ``net`` and
``loss1`` (``--nodes 2``), ``soak``.

Each returns ``(plan, steps, ckpt_every)``. Fault steps are placed so that no fault falls
inside the steps another fault's restart throws away (each verdict stays about one fault).
"""

from __future__ import annotations

import random

from titan.chaos.plan import Plan
from titan.errors import UserError

__all__ = ["BUILTIN", "builtin_plan", "soak_plan"]


def quick() -> tuple[Plan, int, int]:
    """Numeric faults, a kill and a collective hang: the guard, the launcher and the watchdog."""
    plan = (Plan(name="quick")
            .nan_grad(rank=1, step=4)
            .spike(rank=0, step=13, factor=50.0)
            .kill(rank=1, step=18)
            .hang(rank=0, step=24, where="collective", seconds=120.0))
    return plan, 30, 5


def full() -> tuple[Plan, int, int]:
    """Every in-process, disk, preempt and stress kind on 2 local ranks."""
    plan = (Plan(name="full")
            .nan_grad(rank=1, step=3)
            .inf_loss(rank=0, step=5)
            .poison_sample(step=7)
            .spike(rank=1, step=12, factor=50.0)
            .add("bitflip", rank=1, step=14, target="param", tensor="", index=3, bit=30)
            .slow(rank=1, step=16, factor=4.0, steps=14)
            .add("disk", step=24, what="slow_fsync", seconds=0.5)
            .add("disk", step=32, what="enospc", seconds=2.0)
            .kill(rank=0, step=38)
            .hang(rank=1, step=44, where="data", seconds=120.0)
            .hang(rank=0, step=52, where="gil", seconds=60.0)
            .exception(rank=1, step=58, what="cuda")
            .exception(rank=0, step=64, what="comm")
            .add("disk", step=68, what="corrupt")
            .preempt(step=76)
            .add("stress", step=80, what="cpu", workers=2, seconds=4.0)
            .add("disk", step=84, what="truncate"))
    return plan, 90, 5


def cover() -> tuple[Plan, int, int]:
    """CI's subset: with ``quick`` (nan_grad, spike, kill, hang) every other local kind once."""
    plan = (Plan(name="cover")
            .inf_loss(rank=0, step=3)
            .poison_sample(step=5)
            .add("bitflip", rank=1, step=10, target="param", tensor="", index=3, bit=30)
            .slow(rank=1, step=11, factor=4.0, steps=12)
            .add("disk", step=24, what="enospc", seconds=1.5)
            .exception(rank=1, step=27, what="cuda")
            .preempt(step=31)
            .add("stress", step=33, what="cpu", workers=2, seconds=2.0))
    return plan, 36, 5


def net() -> tuple[Plan, int, int]:
    """Link faults between two namespace nodes (``--nodes 2``)."""
    plan = (Plan(name="net")
            .add("net", step=5, what="loss", percent=1.0, seconds=4.0)
            .add("net", step=12, what="bandwidth", rate="4mbit", seconds=3.0)
            .add("net", step=18, what="delay", delay_ms=50.0, seconds=3.0)
            .add("net", step=24, what="partition", seconds=1.0))
    return plan, 30, 5


def loss1() -> tuple[Plan, int, int]:
    """1 % random loss on the link for most of a short run (CI's netns case)."""
    return Plan(name="loss1").add("net", step=2, what="loss", percent=1.0, seconds=60.0), 12, 5


def soak_plan(duration_s: float, every_s: float, *, seed: int = 0, steps_per_s: float = 4.0) -> tuple[Plan, int, int]:
    """Random faults every ``every_s`` seconds for ``duration_s`` (steps estimated at
    ``steps_per_s``), drawn from kinds that each recover on their own."""
    if every_s <= 0 or duration_s < every_s:
        raise UserError("soak needs 0 < --every <= --duration", "e.g. --duration 120 --every 20")
    rng = random.Random(seed)
    steps = max(20, int(duration_s * steps_per_s))
    gap = max(8, int(every_s * steps_per_s))
    plan = Plan(name="soak")
    for s in range(gap, steps - 6, gap):
        kind = rng.choice(["nan_grad", "spike", "kill", "inf_loss", "slow"])
        r = rng.randrange(2)
        if kind == "spike":
            plan.spike(rank=r, step=max(s, 12), factor=50.0)
        elif kind == "slow":
            plan.slow(rank=r, step=s, factor=3.0, steps=min(gap - 2, 10))
        else:
            plan.add(kind, rank=r, step=s)
    return plan, steps, 5


BUILTIN = {"quick": quick, "full": full, "cover": cover, "net": net, "loss1": loss1}


def builtin_plan(name: str) -> tuple[Plan, int, int]:
    """The built-in plan ``name``; ``UserError`` naming the choices otherwise."""
    if name not in BUILTIN:
        raise UserError(f"no built-in plan {name!r}", f"built-in plans: {', '.join(sorted(BUILTIN))}, soak; "
                        "or --plan FILE")
    return BUILTIN[name]()
