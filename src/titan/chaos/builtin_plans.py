"""The drills' built-in fault plans: ``quick``, ``full``, ``net`` and ``loss1`` (``--nodes 2``), ``node-loss``
(``--nodes 2 --node-local``);
``soak`` lives in :mod:`titan.chaos.soak` — and, for a user's script (``titan drill -- train.py``),
``quick`` and ``full`` placed along the steps the script runs (:func:`script_placer`).

Each returns ``(plan, steps, ckpt_every)``. Fault steps are placed so that no fault falls
inside the steps another fault's restart throws away (each verdict stays about one fault).
"""

from __future__ import annotations

import random

from titan.chaos.plan import Plan
from titan.chaos.soak import soak_plan  # kept importable from here
from titan.errors import UserError

__all__ = ["BUILTIN", "SCRIPT_PLANS", "builtin_plan", "script_placer", "soak_plan"]


def quick() -> tuple[Plan, int, int]:
    """Numeric faults, a kill and a collective hang: the guard, the launcher and the watchdog."""
    plan = (Plan(name="quick")
            .nan_grad(rank=1, step=4)
            .spike(rank=0, step=13, factor=50.0)
            .kill(rank=1, step=18)
            .hang(rank=0, step=24, where="collective", seconds=120.0))
    return plan, 30, 5


def full(seed: int = 0) -> tuple[Plan, int, int]:
    """Every in-process, disk, preempt and stress kind on 2 local ranks.

    Steps 1–100 run in one attempt (no restart): the kinds whose detectors learn a baseline
    first (stress, slow fsync), then a sign-bit flip at a random step between the SDC rounds
    at 50 and 100 (the default cadence), caught at 100. The restarting kinds follow."""
    rng = random.Random(seed)
    flip_step = rng.choice([s for s in range(51, 100) if s not in (65, 88)])
    plan = (Plan(name="full")
            .nan_grad(rank=1, step=3)
            .inf_loss(rank=0, step=5)
            .poison_sample(step=7)
            .spike(rank=1, step=12, factor=50.0)
            .add("stress", step=40, what="cpu", workers=0, seconds=4.0)
            .add("disk", step=65, what="slow_fsync", seconds=0.5)
            .add("disk", step=88, what="enospc", seconds=2.0)
            .bitflip(rank=1, step=flip_step, target="param", tensor="*", index=-1, bit=31, seed=rng.randrange(1 << 30))
            .slow(rank=1, step=105, factor=4.0, steps=14)
            .kill(rank=0, step=124)
            .hang(rank=1, step=129, where="data", seconds=120.0)
            .hang(rank=0, step=134, where="gil", seconds=60.0)
            .exception(rank=1, step=139, what="cuda")
            .exception(rank=0, step=143, what="comm")
            .add("disk", step=147, what="corrupt")
            .preempt(step=152)
            .add("disk", step=157, what="truncate"))
    plan.faults.sort(key=lambda f: f.step)
    return plan, 165, 5


def net() -> tuple[Plan, int, int]:
    """Link faults between two namespace nodes (``--nodes 2``), each healed (and its detector
    calm again) before the next: at ~3–6 steps/s, 25+ steps apart. The first comes after the
    detectors' baselines are learned (~30 steps); the partition stays short of the hang
    timeout (a 2 s cut stalls TCP for > 4 s: its retransmissions back off)."""
    plan = (Plan(name="net")
            .add("net", step=30, what="loss", percent=10.0, seconds=4.0)
            .add("net", step=80, what="bandwidth", rate="4mbit", seconds=3.0)
            .add("net", step=105, what="delay", delay_ms=50.0, seconds=4.0)
            .add("net", step=140, what="partition", seconds=1.0))
    return plan, 165, 5


def loss1() -> tuple[Plan, int, int]:
    """1 % random loss on the link for most of a short run (CI's netns case): the job must
    ride it out. Survive-only: 1 % is below ``net_link_loss``'s visible size, and the static
    ``net_probe_loss`` sees it only once a probe is hit — at 5 probes a second, ~20 s on
    average, while the 12 steps take 5 s on an idle machine (CI: one of two drills missed
    it). Detection of link loss is the ``net`` plan's 10 %."""
    return Plan(name="loss1").add("net", step=2, what="loss", percent=1.0, seconds=60.0, survive_only=(
        "1 % loss is below net_link_loss's size; net_probe_loss sees it only when a probe is hit "
        "(~20 s on average)")), 12, 5


def node_loss() -> tuple[Plan, int, int]:
    """Lose node1 whole — launcher, workers, node agent and its node-local folder — three steps
    after the checkpoint of step 10; a replacement node joins with an empty folder and takes
    node1's shards from node0's buddy copy."""
    return Plan(name="node-loss").node_loss(step=13, node="node1"), 24, 5


BUILTIN = {"quick": quick, "full": full, "net": net, "loss1": loss1, "node-loss": node_loss}


def builtin_plan(name: str, *, seed: int = 0) -> tuple[Plan, int, int]:
    """The built-in plan ``name`` (``seed`` draws its random parts, e.g. the full plan's flip);
    ``UserError`` naming the choices otherwise."""
    if name not in BUILTIN:
        raise UserError(f"no built-in plan {name!r}", f"built-in plans: {', '.join(sorted(BUILTIN))}, soak; "
                        "or --plan FILE")
    return BUILTIN[name](seed) if name == "full" else BUILTIN[name]()


def _at(steps: int, frac: float, low: int) -> int:
    return max(low, round(steps * frac))


def _mid(step: int, every: int) -> int:
    """The step at or after ``step`` whose start lies mid-way between two checkpoints (a kill
    there loses ``every // 2`` steps, which the restart must recompute)."""
    while every > 1 and (step - 1) % every != every // 2:
        step += 1
    return step


def script_quick(steps: int, world: int, every: int = 5) -> Plan:
    """Any script: a NaN gradient on one rank, a SIGKILL, and a SIGSTOP hang — the guard,
    the launcher and the watchdog; placed at 15 %, 40 % and 75 % of the script's steps (the
    hang late enough that the watchdog has learned the step's phases again after the kill)."""
    if steps < 30:
        raise UserError(f"the script runs {steps} steps; the quick plan needs at least 30",
                        "give the script more steps (e.g. more epochs) or pass --plan FILE with explicit steps")
    other = 1 % world
    return (Plan(name="quick")
            .nan_grad(rank=other, step=_at(steps, 0.15, 3))
            .kill(rank=other, step=_mid(_at(steps, 0.4, 10), every))
            .stop(rank=0, step=_at(steps, 0.75, 22)))


def script_full(steps: int, world: int, every: int = 5) -> Plan:
    """Any script: every fault that needs no workload-specific wiring (no SDC), each in its
    own stretch of the script's steps."""
    if steps < 80:
        raise UserError(f"the script runs {steps} steps; the full plan needs at least 80",
                        "give the script more steps or pass --plan FILE with explicit steps")
    other = 1 % world
    return (Plan(name="full")
            .nan_grad(rank=other, step=_at(steps, 0.06, 3))
            .inf_loss(rank=0, step=_at(steps, 0.11, 6))
            .spike(rank=other, step=_at(steps, 0.18, 12), factor=50.0)
            .kill(rank=0, step=_mid(_at(steps, 0.28, 16), every))
            .stop(rank=other, step=_at(steps, 0.42, 28))
            .hang(rank=0, step=_at(steps, 0.55, 38), where="collective", seconds=120.0)
            .exception(rank=other, step=_at(steps, 0.68, 48), what="cuda")
            .preempt(step=_at(steps, 0.8, 58))
            .add("stress", step=_at(steps, 0.9, 66), what="cpu", workers=2, seconds=2.0))


SCRIPT_PLANS = {"quick": script_quick, "full": script_full}


def script_placer(name: str):  # noqa: ANN201 - Callable[[int, int], Plan]
    """The placer of built-in script plan ``name``; ``UserError`` naming the choices otherwise."""
    if name not in SCRIPT_PLANS:
        raise UserError(f"no built-in plan {name!r} for a script", f"for a script: {', '.join(sorted(SCRIPT_PLANS))}; "
                        "or --plan FILE")
    return SCRIPT_PLANS[name]
