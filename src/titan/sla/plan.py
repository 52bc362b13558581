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
    "LIMITS", "PlanInput", "PlanResult", "plan", "mtbi_s", "young_interval", "daly_interval",
    "expected_segment_time", "goodput_exact", "goodput_first_order", "optimal_interval_numeric",
]


#: The inputs ``plan`` accepts: (lo, hi) per input (``titan plan``'s flags use the same
#: bounds). Beyond them the model says nothing useful and the arithmetic overflows.
LIMITS: dict[str, tuple[float, float]] = {
    "gpus": (1, 10_000_000),
    "mtbi_h": (0.001, 1_000_000.0),  # job MTBI in hours (3.6 s … 114 years)
    "rate_per_gpu_hour": (1e-12, 3600.0),  # up to one a GPU-second: a soak drill's rate is far above a fleet's
    "job_mtbi_s": (1.0, 1e13),  # the job MTBI the two above give at --gpus
    "ckpt_stall_s": (0.0, 86400.0),
    "restart_s": (0.0, 86400.0),
    "interval_s": (1e-3, 365 * 86400.0),
    "replicas": (1, 10_000),
    "horizon_days": (0.001, 3650.0),
}


def _within(name: str, value: float, what: str, hint_unit: str = "") -> None:
    lo, hi = LIMITS[name]
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and lo <= value <= hi):
        raise UserError(f"{what} must be within {lo:g} … {hi:g}{hint_unit}, got {value!r}",
                        f"give {what} within {lo:g} … {hi:g}{hint_unit}")


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


def _log_segment_time(interval_s: float, ckpt_s: float, restart_s: float, mtbi: float) -> float:
    x = (interval_s + ckpt_s) / mtbi
    log_expm1 = x + math.log1p(-math.exp(-x)) if x > 1e-3 else math.log(math.expm1(x))
    return math.log(mtbi) + restart_s / mtbi + log_expm1


def expected_segment_time(interval_s: float, ckpt_s: float, restart_s: float, mtbi: float) -> float:
    """Daly's expected wall time to complete one segment of work plus its checkpoint
    (``inf`` when it exceeds a float: interruptions far more frequent than a segment)."""
    log_t = _log_segment_time(interval_s, ckpt_s, restart_s, mtbi)
    return math.exp(log_t) if log_t < 709.0 else math.inf


def goodput_exact(interval_s: float, ckpt_s: float, restart_s: float, mtbi: float) -> float:
    """Expected fraction of wall time spent on work that is kept (exponential failures);
    computed in log space, so it underflows to 0 instead of overflowing."""
    return math.exp(math.log(interval_s) - _log_segment_time(interval_s, ckpt_s, restart_s, mtbi))


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
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int):
            raise UserError(f"--gpus must be a whole number, got {self.gpus!r}", "pass the number of GPUs of the job")
        _within("gpus", self.gpus, "--gpus")
        _within("rate_per_gpu_hour", self.rate_per_gpu_hour, "the failure rate per GPU-hour")
        m = mtbi_s(self.rate_per_gpu_hour, self.gpus)
        lo, hi = LIMITS["job_mtbi_s"]
        if not lo <= m <= hi:
            raise UserError(f"at {self.gpus:,} GPUs that rate means an interruption every {m:.3g} s",
                            f"the model needs a job MTBI within {lo:g} … {hi:g} s: check --gpus, --mtbi-h or "
                            "--rate-per-gpu-hour")
        _within("ckpt_stall_s", self.ckpt_stall_s, "the checkpoint stall (--ckpt-stall-s)", " s")
        _within("restart_s", self.restart_s, "the restart cost (--restart-s)", " s")
        if self.interval_s is not None:
            _within("interval_s", self.interval_s, "--interval-s", " s")


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
    segments in Python (about ``replicas × horizon/τ`` iterations, bounded at 3 M draws:
    a few seconds at most). Raises ``UserError`` for ``replicas``/``horizon_days`` out of
    ``LIMITS``.
    """
    if simulate:
        if isinstance(replicas, bool) or not isinstance(replicas, int):
            raise UserError(f"--replicas must be a whole number, got {replicas!r}", "e.g. --replicas 16")
        _within("replicas", replicas, "--replicas")
        _within("horizon_days", horizon_days, "--horizon-days", " days")
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
