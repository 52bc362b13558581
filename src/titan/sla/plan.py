"""``titan plan``: expected interruptions, optimal checkpoint interval and goodput at scale.

The model (``docs/sla.md``): interruptions arrive as a Poisson process whose rate grows
linearly with the GPU count (``rate_per_gpu_hour × gpus``), so the job's mean time between
interruptions is ``M = 1 / (rate × gpus)``. Work is cut into segments of ``τ`` seconds,
each followed by a checkpoint stall ``δ``; an interruption loses the segment in progress
and costs a restart ``R`` (which can itself be interrupted). Daly's exact expectation for
this process gives the wall time per segment::

    E[T_seg] = M · e^{R/M} · (e^{(τ+δ)/M} − 1)        goodput = τ / E[T_seg]

Young (1974) and Daly (2006) give the interval that maximises it; a Monte-Carlo
simulation of the same process (``titan.sla.simulate``) cross-checks the closed form.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from titan.errors import UserError
from titan.sla.fleetdata import DAY_S, HOUR_S, FleetData

__all__ = [
    "PlanInput", "PlanResult", "plan", "mtbi_s", "young_interval", "daly_interval",
    "expected_segment_time", "goodput_exact", "goodput_first_order", "optimal_interval_numeric",
]


def mtbi_s(rate_per_gpu_hour: float, gpus: int) -> float:
    """Job mean time between interruptions (s) for independent per-GPU failures."""
    return HOUR_S / (rate_per_gpu_hour * gpus)


def young_interval(ckpt_s: float, mtbi: float) -> float:
    """Young's first-order optimum ``sqrt(2 δ M)`` (CACM 17(9), 1974)."""
    return math.sqrt(2.0 * ckpt_s * mtbi)


def daly_interval(ckpt_s: float, mtbi: float) -> float:
    """Daly's higher-order optimum (FGCS 22(3), 2006), ``M`` when ``δ ≥ 2M``."""
    if ckpt_s >= 2.0 * mtbi:
        return mtbi
    x = ckpt_s / (2.0 * mtbi)
    return math.sqrt(2.0 * ckpt_s * mtbi) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - ckpt_s


def expected_segment_time(interval_s: float, ckpt_s: float, restart_s: float, mtbi: float) -> float:
    """Daly's expected wall time to complete one segment of work plus its checkpoint."""
    return mtbi * math.exp(restart_s / mtbi) * math.expm1((interval_s + ckpt_s) / mtbi)


def goodput_exact(interval_s: float, ckpt_s: float, restart_s: float, mtbi: float) -> float:
    """Expected fraction of wall time spent on work that is kept (exponential failures)."""
    return interval_s / expected_segment_time(interval_s, ckpt_s, restart_s, mtbi)


def goodput_first_order(interval_s: float, ckpt_s: float, restart_s: float, mtbi: float) -> float:
    """First-order waste model ``1 − δ/τ − (τ+δ)/(2M) − R/M`` (valid when τ, δ, R ≪ M)."""
    return 1.0 - ckpt_s / interval_s - (interval_s + ckpt_s) / (2.0 * mtbi) - restart_s / mtbi


def optimal_interval_numeric(ckpt_s: float, restart_s: float, mtbi: float) -> float:
    """Maximise ``goodput_exact`` over τ by golden-section search on log τ (cost: ~100 evals)."""
    lo, hi = math.log(1e-3), math.log(max(10.0 * mtbi, 1.0))
    g = (math.sqrt(5.0) - 1.0) / 2.0

    def f(u: float) -> float:
        return -goodput_exact(math.exp(u), ckpt_s, restart_s, mtbi)

    a, b = lo, hi
    c, d = b - g * (b - a), a + g * (b - a)
    for _ in range(120):
        if f(c) < f(d):
            b = d
        else:
            a = c
        c, d = b - g * (b - a), a + g * (b - a)
    return math.exp((a + b) / 2.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanInput:
    """What ``plan`` needs. ``interval_s`` None means: use Daly's optimum."""

    gpus: int
    rate_per_gpu_hour: float
    ckpt_stall_s: float
    restart_s: float
    interval_s: float | None = None
    fleet: FleetData | None = None
    cost_source: str = "assumption"

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise UserError(f"--gpus must be at least 1, got {self.gpus}", "pass the number of GPUs of the job")
        if not self.rate_per_gpu_hour > 0:
            raise UserError(f"failure rate must be > 0 per GPU-hour, got {self.rate_per_gpu_hour}",
                            "pass --mtbi-h or --rate-per-gpu-hour with a positive value")
        if self.ckpt_stall_s < 0 or self.restart_s < 0:
            raise UserError("checkpoint stall and restart cost must be >= 0 seconds",
                            "pass --ckpt-stall-s and --restart-s as non-negative numbers")
        if self.interval_s is not None and not self.interval_s > 0:
            raise UserError(f"--interval-s must be > 0, got {self.interval_s}", "omit it to use the optimum")


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanResult:
    """The answers; ``mc`` holds the Monte-Carlo cross-check when it was run."""

    input: PlanInput
    mtbi_s: float
    interruptions_per_day: float
    young_interval_s: float
    daly_interval_s: float
    interval_s: float
    goodput: float
    goodput_first_order: float
    goodput_at_young: float
    mc: Any = None  # titan.sla.simulate.SimResult

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict (``titan plan --json``)."""
        i = self.input
        d: dict[str, Any] = {
            "gpus": i.gpus, "rate_per_gpu_hour": i.rate_per_gpu_hour, "ckpt_stall_s": i.ckpt_stall_s,
            "restart_s": i.restart_s, "cost_source": i.cost_source,
            "mtbi_s": self.mtbi_s, "mtbi_h": self.mtbi_s / HOUR_S,
            "interruptions_per_day": self.interruptions_per_day,
            "young_interval_s": self.young_interval_s, "daly_interval_s": self.daly_interval_s,
            "interval_s": self.interval_s, "interval_source": "given" if i.interval_s else "daly",
            "expected_goodput": self.goodput, "expected_goodput_first_order": self.goodput_first_order,
            "expected_goodput_at_young": self.goodput_at_young,
        }
        if i.fleet is not None:
            f = i.fleet
            d["fleet"] = {"name": f.name, "gpus": f.gpus, "interruptions": f.interruptions,
                          "period_days": f.period_s / DAY_S, "job_mtbi_h": f.job_mtbi_s / HOUR_S,
                          "source": f.source, "note": f.note}
        if self.mc is not None:
            d["monte_carlo"] = self.mc.to_dict()
        return d


def plan(inp: PlanInput, *, simulate: bool = True, replicas: int = 16, horizon_days: float = 30.0,
         seed: int = 0) -> PlanResult:
    """Evaluate the model; with ``simulate`` also run the Monte-Carlo cross-check.

    Cost: microseconds for the closed form; the simulation loops over checkpoint
    segments in Python (about ``replicas × horizon/τ`` iterations, typically < 1 s).
    """
    m = mtbi_s(inp.rate_per_gpu_hour, inp.gpus)
    young = young_interval(inp.ckpt_stall_s, m) if inp.ckpt_stall_s > 0 else m
    daly = daly_interval(inp.ckpt_stall_s, m) if inp.ckpt_stall_s > 0 else m
    tau = inp.interval_s or daly
    mc = None
    if simulate:
        from titan.sla.simulate import simulate_goodput

        mc = simulate_goodput(interval_s=tau, ckpt_s=inp.ckpt_stall_s, restart_s=inp.restart_s, mtbi=m,
                              horizon_s=horizon_days * DAY_S, replicas=replicas, seed=seed)
    return PlanResult(
        input=inp, mtbi_s=m, interruptions_per_day=DAY_S / m, young_interval_s=young, daly_interval_s=daly,
        interval_s=tau, goodput=goodput_exact(tau, inp.ckpt_stall_s, inp.restart_s, m),
        goodput_first_order=goodput_first_order(tau, inp.ckpt_stall_s, inp.restart_s, m),
        goodput_at_young=goodput_exact(young, inp.ckpt_stall_s, inp.restart_s, m), mc=mc,
    )
