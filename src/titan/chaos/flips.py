"""The bit-flip harness: silent data corruption on purpose, and how fast it is caught.

One flip is a :class:`FlipSpec` — which tensor kind (a parameter, its local gradient before
the all-reduce, or an optimizer-state tensor such as AdamW's ``exp_avg``/``exp_avg_sq``),
which element, which bit (by class: ``sign``, ``exponent``, ``mantissa`` of the dtype —
fp32's 1/8/23 bits or bf16's 1/8/7, :data:`DTYPES`), on which rank, after which optimizer
step. The harness

* draws flips at random (:func:`random_flips`): one per SDC check interval, at a random step
  strictly **between** two checks (never on a checked step), bit class and tensor kind drawn
  uniformly, element and bit uniformly within them, bits in the layout of the state's dtype
  (``dtype=torch.bfloat16`` for a bf16 run: the worker refuses a flip whose tensor holds
  another dtype, so a bit is never counted in the wrong class);
* turns them into a drill plan (:func:`flip_plan`): ``bitflip`` faults the ranks apply
  themselves (``titan.chaos.worker``), once per job, as silent hardware would;
* flips one bit in place (:func:`flip_bit`, also used by the workers) and reports the value
  and the raw bits before and after;
* reads a finished run back (:func:`flip_outcomes`): per flip, the first detection after it
  — the SDC fingerprint round (``sdc.mismatch``) or the guard (``guard.nonfinite`` /
  ``guard.spike``: a flip that makes a value huge or non-finite is seen by the next step's
  checks) — with the latency in steps and seconds, or why it went unseen; and
  :func:`summarize` gives the detection rate per tensor kind and bit class.

Used by the SDC drills (``titan drill``), by ``bench/sdc_flips.py`` (the ≥ 50-flip run of
docs/sdc.md) and by the peers harness. Cheap to import (torch only).
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from typing import Any, Iterable, Mapping, Sequence

import torch

from titan.chaos.plan import Plan
from titan.events import Event

__all__ = ["BIT_CLASSES", "DTYPES", "TENSOR_KINDS", "Flip", "FlipSpec", "FlipOutcome", "FlipRun", "bit_range",
           "bit_class", "dtype_name", "flip_bit", "pick_element", "random_flips", "flip_plan", "flip_outcomes",
           "summarize", "run_flips"]

BIT_CLASSES = ("sign", "exponent", "mantissa")
#: ``grad`` is the rank's local gradient before the all-reduce; the rest are AdamW state keys.
TENSOR_KINDS = ("param", "grad", "exp_avg", "exp_avg_sq")
#: (exponent bits, mantissa bits) per floating dtype width / kind.
_LAYOUT = {torch.float32: (8, 23), torch.float64: (11, 52), torch.float16: (5, 10), torch.bfloat16: (8, 7)}
#: The dtypes a flip can name, by the name plans and events carry (``str(dtype)`` without ``torch.``).
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                                  "float64": torch.float64}
#: Events that count as catching a flip, and the component each belongs to.
DETECTORS = {"sdc.mismatch": "sdc", "sdc.canary": "sdc", "guard.nonfinite": "guard", "guard.spike": "guard"}


def dtype_name(dtype: torch.dtype | str) -> str:
    """``torch.bfloat16`` (or ``"bfloat16"``, ``"bf16"``) → ``"bfloat16"``; ``ValueError`` for a
    dtype the harness has no bit layout for."""
    name = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp64": "float64"}.get(str(dtype), str(dtype))
    name = name.removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"no bit layout for dtype {dtype!r}: one of {', '.join(DTYPES)}")
    return name


def bit_range(cls: str, dtype: torch.dtype | str = torch.float32) -> range:
    """Bit positions of class ``cls`` (``sign``/``exponent``/``mantissa``) in ``dtype``."""
    e, m = _LAYOUT[DTYPES[dtype_name(dtype)]]
    return {"sign": range(e + m, e + m + 1), "exponent": range(m, m + e), "mantissa": range(0, m)}[cls]


def bit_class(bit: int, dtype: torch.dtype | str = torch.float32) -> str:
    """The class of bit position ``bit`` in ``dtype``."""
    return next(c for c in BIT_CLASSES if bit in bit_range(c, dtype))


@dataclasses.dataclass(frozen=True)
class Flip:
    """One flip done: the element's value and raw bits before and after."""

    before: float
    after: float
    before_bits: int
    after_bits: int


def flip_bit(t: torch.Tensor, index: int, bit: int) -> Flip:
    """Flip bit ``bit`` of element ``index`` of ``t`` in place (no autograd record).

    Cost: one element read and write (a host sync on a device tensor). Raises
    ``IndexError`` for an element or bit outside the tensor.
    """
    flat = t.detach().view(-1)
    if not 0 <= index < flat.numel():
        raise IndexError(f"element {index} outside a tensor of {flat.numel()}")
    size = flat.element_size()
    if not 0 <= bit < 8 * size:
        raise IndexError(f"bit {bit} outside a {8 * size}-bit element")
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[size]
    iv = flat.view(ints)
    mask = (1 << (8 * size)) - 1
    before, bb = float(flat[index]), int(iv[index]) & mask
    with torch.no_grad():
        iv[index] ^= (1 << bit) if bit < 8 * size - 1 else -(1 << (8 * size - 1))
    return Flip(before, float(flat[index]), bb, int(iv[index]) & mask)


@dataclasses.dataclass(frozen=True)
class FlipSpec:
    """One planned flip (see the module doc)."""

    step: int
    rank: int
    kind: str  # one of TENSOR_KINDS
    tensor: str
    index: int
    bit: int
    bit_class: str
    seed: int = 0  # draws the element inside the rank when tensor is "*" / index is -1
    dtype: str = "float32"  # the dtype of the state flipped: sets the bit layout (DTYPES)

    def __post_init__(self) -> None:
        if self.kind not in TENSOR_KINDS:
            raise ValueError(f"tensor kind {self.kind!r} is not one of {', '.join(TENSOR_KINDS)}")
        if self.bit_class not in BIT_CLASSES:
            raise ValueError(f"bit class {self.bit_class!r} is not one of {', '.join(BIT_CLASSES)}")
        width = sum(_LAYOUT[DTYPES[dtype_name(self.dtype)]]) + 1
        if not 0 <= self.bit < width or bit_class(self.bit, self.dtype) != self.bit_class:
            raise ValueError(f"bit {self.bit} is not a {self.bit_class} bit of {self.dtype} ({width} bits)")


def random_flips(n: int, *, every: int, params: Mapping[str, int] | None = None, ranks: int = 2, seed: int = 0,
                 first_interval: int = 0, kinds: Sequence[str] = TENSOR_KINDS,
                 classes: Sequence[str] = BIT_CLASSES, dtype: torch.dtype | str = torch.float32) -> list[FlipSpec]:
    """``n`` random flips, one per SDC check interval of ``every`` steps starting at interval
    ``first_interval``: flip ``i`` lands after a random step strictly between the checks at
    ``(first_interval+i)·every`` and the next one. ``params``: parameter name → element count;
    without it the element is drawn inside the rank at injection (``tensor="*"``, ``index=-1``).
    ``dtype``: the dtype of the trained state (the bit layout the classes are drawn in)."""
    if every < 2:
        raise ValueError("flips between checks need every >= 2")
    rng = random.Random(seed)
    dname = dtype_name(dtype)
    names = sorted(params or {})
    weights = [(params or {})[n] for n in names]  # a random element, as a hardware fault hits one
    out = []
    for i in range(n):
        lo = (first_interval + i) * every
        step = rng.randrange(lo + 1, lo + every)  # never a checked step (multiples of every)
        if names:
            name = rng.choices(names, weights)[0]
            index = rng.randrange((params or {})[name])
        else:
            name, index = "*", -1
        cls = rng.choice(list(classes))
        out.append(FlipSpec(step=step, rank=rng.randrange(ranks), kind=rng.choice(list(kinds)), tensor=name,
                            index=index, bit=rng.choice(list(bit_range(cls, dtype))), bit_class=cls,
                            seed=rng.randrange(1 << 30), dtype=dname))
    return out


def flip_plan(flips: Iterable[FlipSpec], name: str = "flips") -> Plan:
    """A drill plan of ``bitflip`` faults, one per flip (optimizer-state flips need the state
    to exist: place them after step 1); each names its dtype, which the worker checks."""
    plan = Plan(name=name)
    for f in flips:
        plan.add("bitflip", rank=f.rank, step=f.step, target=f.kind, tensor=f.tensor, index=f.index, bit=f.bit,
                 seed=f.seed, dtype=f.dtype)
    return plan


def pick_element(tensors: Mapping[str, torch.Tensor], seed: int) -> tuple[str, int]:
    """A random element of ``tensors`` (weighted by size, as a hardware fault would hit one),
    drawn with ``seed``: what a ``bitflip`` with ``tensor="*"``/``index=-1`` flips."""
    rng = random.Random(seed)
    names = sorted(tensors)
    name = rng.choices(names, [tensors[n].numel() for n in names])[0]
    return name, rng.randrange(tensors[name].numel())


@dataclasses.dataclass
class FlipOutcome:
    """What became of one flip in a run."""

    step: int
    rank: int
    kind: str
    tensor: str
    index: int
    bit: int
    bit_class: str
    injected: bool
    dtype: str = "float32"
    before: float | None = None
    after: float | None = None
    detected: bool = False
    detector: str | None = None
    detected_step: int | None = None
    latency_steps: int | None = None
    latency_s: float | None = None
    why_not: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _why_unseen(o: FlipOutcome) -> str:
    """The documented reason a flip of this kind/class escapes (docs/sdc.md)."""
    if o.kind == "grad":
        return ("gradient flip: the all-reduce hands the same corrupted sum to every replica, so replicas stay "
                "identical; only a non-finite or spiking result is seen (by the guard)")
    if o.bit_class == "mantissa" or (o.before is not None and o.after is not None
                                     and abs(o.after - o.before) <= 1e-6 * max(abs(o.before), 1e-30)):
        return "low-order change absorbed: later updates rounded both replicas to the same bits before the check"
    return "the changed value was overwritten before the check (no persistent replica difference)"


def flip_outcomes(plan: Plan, events: Sequence[Event], *, every: int) -> list[FlipOutcome]:
    """One outcome per ``bitflip`` fault of ``plan`` in a finished run (see the module doc).

    A flip is caught by the first detection event at or after its injection and before the
    next flip's (at the latest at the round ``every`` steps after it). Cost: linear scans."""
    evs = sorted(events, key=lambda e: e.t)
    flips = [f for f in plan.faults if f.kind == "bitflip"]
    injs = [e for e in evs if e.kind == "inject.bitflip"]
    out: list[FlipOutcome] = []
    for f in flips:
        bit = int(f.get("bit"))
        dt = str(f.get("dtype") or "float32")
        o = FlipOutcome(step=f.step, rank=int(f.rank or 0), kind=str(f.get("target")), tensor=str(f.get("tensor")),
                        index=int(f.get("index")), bit=bit, bit_class=bit_class(bit, dt), injected=False, dtype=dt)
        inj = next((e for e in injs if e.step == f.step and e.data.get("rank") == f.rank), None)
        if inj is None:
            o.why_not = "not injected"
            out.append(o)
            continue
        o.injected = True
        if inj.data.get("dtype"):  # what the worker found in the tensor it flipped
            o.dtype = dtype_name(str(inj.data["dtype"]))
            o.bit_class = bit_class(bit, o.dtype)
        o.tensor, o.index = str(inj.data.get("tensor", o.tensor)), int(inj.data.get("index", o.index))
        o.before, o.after = _num(inj.data.get("before")), _num(inj.data.get("after"))
        nxt = min((e.t for e in injs if e.t > inj.t + 1e-6), default=math.inf)
        last_step = (f.step // every + 1) * every
        det = next((e for e in evs if e.kind in DETECTORS and inj.t - 0.01 <= e.t < nxt
                    and (e.step is None or e.step >= f.step) and (e.step is None or e.step <= last_step + every)), None)
        if det is None:
            o.why_not = _why_unseen(o)
        else:
            o.detected, o.detector = True, f"{DETECTORS[det.kind]} ({det.kind})"
            o.detected_step = det.step
            o.latency_steps = (det.step - f.step) if det.step is not None else None
            o.latency_s = round(det.t - inj.t, 4)
        out.append(o)
    return out


def _num(x: Any) -> float | None:
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def summarize(outcomes: Sequence[FlipOutcome]) -> dict[str, Any]:
    """Detection rate overall, per tensor kind and per bit class; latency quantiles of the caught."""
    inj = [o for o in outcomes if o.injected]

    def rate(xs: Sequence[FlipOutcome]) -> dict[str, Any]:
        d = sum(o.detected for o in xs)
        return {"flips": len(xs), "detected": d, "rate": round(d / len(xs), 3) if xs else None}

    lat_s = sorted(o.latency_s for o in inj if o.latency_s is not None)
    lat_n = sorted(o.latency_steps for o in inj if o.latency_steps is not None)

    def q(xs: Sequence[float], p: float) -> float | None:
        return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else None
    return {
        "overall": rate(inj), "not_injected": len(outcomes) - len(inj),
        "by_kind": {k: rate([o for o in inj if o.kind == k]) for k in TENSOR_KINDS if any(o.kind == k for o in inj)},
        "by_class": {c: rate([o for o in inj if o.bit_class == c]) for c in BIT_CLASSES
                     if any(o.bit_class == c for o in inj)},
        "by_kind_class": {f"{k}/{c}": rate(xs) for k in TENSOR_KINDS for c in BIT_CLASSES
                          if (xs := [o for o in inj if o.kind == k and o.bit_class == c])},
        "by_detector": {d: sum(1 for o in inj if o.detector == d) for d in sorted({o.detector for o in inj if o.detector})},
        "latency_steps": {"median": statistics.median(lat_n) if lat_n else None, "p90": q(lat_n, 0.9),
                          "max": lat_n[-1] if lat_n else None},
        "latency_s": {"median": statistics.median(lat_s) if lat_s else None, "p90": q(lat_s, 0.9),
                      "max": lat_s[-1] if lat_s else None},
        "undetected_reasons": _reasons(inj),
    }


def _reasons(inj: Sequence[FlipOutcome]) -> dict[str, int]:
    out: dict[str, int] = {}
    for o in inj:
        if not o.detected and o.why_not:
            out[o.why_not] = out.get(o.why_not, 0) + 1
    return out


@dataclasses.dataclass
class FlipRun:
    """One job that took a series of flips: per-flip outcomes and their summary."""

    run_dir: str
    steps: int
    every: int
    wall_s: float
    outcomes: list[FlipOutcome]
    summary: dict[str, Any]
    launcher_exit: list[int | None]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["outcomes"] = [o.to_dict() for o in self.outcomes]
        return d


def run_flips(flips: Sequence[FlipSpec], *, every: int = 50, cwd: Any, runs_dir: Any, env: Mapping[str, str],
              nproc: int = 2, ckpt_every: int = 50, timeout_s: float = 1800.0, seed: int = 0,
              workload_args: Sequence[str] = ()) -> FlipRun:
    """Train tinygpt under ``titan run`` (the drill engine, no reference run) with SDC at
    ``every`` steps and the given flips, and read every flip's outcome back. Flips drawn for
    bf16 (``FlipSpec.dtype``) train tinygpt with bf16 parameters (``--dtype bf16``: its
    gradients and AdamW moments are bf16 too); all flips of one run share one dtype.

    Checkpoints every ``ckpt_every`` (a multiple of ``every``) are taken right after an SDC
    round, so a restart never loads unverified state; the guard's escalation only rolls
    back (a flip that makes a value non-finite would otherwise end the job). Cost: one job
    of ``(last flip's interval + 2) × every`` steps plus one replay per caught flip."""
    from pathlib import Path

    from titan.chaos.drills import PlanDrill, run_plan_drill
    from titan.events import read_run

    if ckpt_every % every:
        raise ValueError(f"ckpt_every {ckpt_every} must be a multiple of the SDC interval {every}")
    dtypes = {dtype_name(f.dtype) for f in flips}
    if len(dtypes) > 1:
        raise ValueError(f"one run trains in one dtype; the flips name {', '.join(sorted(dtypes))}")
    if dtypes == {"bfloat16"}:
        workload_args = ("--dtype", "bf16", *workload_args)
    elif dtypes - {"float32"}:
        raise ValueError(f"tinygpt trains in fp32 or bf16, not {dtypes.pop()}")
    plan = flip_plan(flips)
    steps = (max(f.step for f in flips) // every + 2) * every
    sets = (f"sdc.every_steps={every}", "guard.escalation=" + ",".join(["rollback"] * 64),
            "guard.max_consecutive_skips=3")
    # Both absolute: the workers run in ``cwd``, a relative run directory would be resolved
    # twice (and the fault plan not found).
    cwd, runs_dir = Path(cwd).resolve(), Path(runs_dir).resolve()
    cfg = PlanDrill(plan=plan, steps=steps, ckpt_every=ckpt_every, nproc=nproc, seed=seed, runs_dir=runs_dir,
                    timeout_s=timeout_s, sets=sets, workload_args=tuple(workload_args), reference=False)
    rep = run_plan_drill(cfg, cwd=cwd, env=dict(env))
    outcomes = flip_outcomes(plan, read_run(rep.run_dir).events, every=every)
    return FlipRun(run_dir=rep.run_dir, steps=rep.steps, every=every, wall_s=rep.wall_s, outcomes=outcomes,
                   summary=summarize(outcomes), launcher_exit=list(rep.launcher_exit))
