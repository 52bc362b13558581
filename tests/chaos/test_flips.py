"""The bit-flip harness (``titan.chaos.flips``): bits by class, flips between SDC rounds, and
how a run's events become per-flip outcomes and a detection rate."""

from __future__ import annotations

import math
import struct

import pytest
import torch

from titan.chaos.flips import (BIT_CLASSES, TENSOR_KINDS, FlipSpec, bit_class, bit_range, flip_bit, flip_outcomes, flip_plan,
                               pick_element, random_flips, summarize)
from titan.events import Event


def test_bit_classes_partition_every_float_format():
    for dtype, width in ((torch.float32, 32), (torch.float16, 16), (torch.bfloat16, 16), (torch.float64, 64)):
        bits = sorted(b for c in BIT_CLASSES for b in bit_range(c, dtype))
        assert bits == list(range(width)), dtype
    assert bit_class(31) == "sign" and bit_class(30) == "exponent" and bit_class(0) == "mantissa"


def test_flip_bit_changes_exactly_one_bit_and_reports_the_raw_bits():
    t = torch.tensor([1.5, -2.0, 0.25])
    f = flip_bit(t, 1, 31)
    assert (f.before, f.after, t[1].item()) == (-2.0, 2.0, 2.0)
    assert f.before_bits ^ f.after_bits == 1 << 31
    assert f.after_bits == struct.unpack("<I", struct.pack("<f", 2.0))[0]
    g = flip_bit(t, 0, 30)  # the exponent's top bit: 1.5 (exponent 127) -> exponent 255 with a mantissa: NaN
    assert math.isnan(g.after) and bin(g.before_bits ^ g.after_bits).count("1") == 1
    h = flip_bit(t, 2, 30)  # 0.25 (exponent 125) -> exponent 253: 0.25 * 2**128, finite and huge
    assert h.after == 0.25 * 2.0 ** 128
    with pytest.raises(IndexError):
        flip_bit(t, 3, 0)
    with pytest.raises(IndexError):
        flip_bit(t, 0, 32)


def test_random_flips_land_strictly_between_checks_one_per_interval():
    params = {"a.weight": 1000, "b.bias": 10}
    flips = random_flips(60, params=params, every=50, seed=7)
    assert len(flips) == 60
    for i, f in enumerate(flips):
        assert i * 50 < f.step < (i + 1) * 50, f  # never a checked step (a multiple of 50)
        assert f.bit in bit_range(f.bit_class) and 0 <= f.index < params[f.tensor]
    assert {f.kind for f in flips} == set(TENSOR_KINDS) and {f.bit_class for f in flips} == set(BIT_CLASSES)
    # weighted by size: the 1000-element tensor is hit far more often than the 10-element one
    assert sum(f.tensor == "a.weight" for f in flips) > 45
    assert random_flips(5, params=params, every=50, seed=7) == flips[:5], "a seed gives the same flips"
    plan = flip_plan(flips[:3])
    assert [(p.kind, p.step, p.get("target")) for p in plan.faults] == [("bitflip", f.step, f.kind) for f in flips[:3]]


def test_an_element_drawn_in_the_rank_is_weighted_by_size_and_seeded():
    tensors = {"big": torch.zeros(990), "small": torch.zeros(10)}
    picks = [pick_element(tensors, s) for s in range(200)]
    assert sum(name == "big" for name, _ in picks) > 180
    assert pick_element(tensors, 5) == pick_element(tensors, 5)
    assert all(0 <= i < tensors[n].numel() for n, i in picks)


def _ev(kind: str, t: float, step: int | None, **data) -> Event:
    return Event.from_obj({"v": 1, "kind": kind, "t": t, "mono": t, "run": "r", "node": "n", "rank": 0,
                           "step": step, "level": "info", "msg": "", "data": data, "pid": 1, "seq": 0})


def test_outcomes_name_the_detector_the_latency_and_why_a_flip_went_unseen():
    flips = [FlipSpec(step=17, rank=1, kind="param", tensor="w", index=3, bit=31, bit_class="sign"),
             FlipSpec(step=81, rank=0, kind="grad", tensor="w", index=4, bit=2, bit_class="mantissa"),
             FlipSpec(step=133, rank=1, kind="exp_avg", tensor="w", index=5, bit=30, bit_class="exponent")]
    plan = flip_plan(flips)
    a, b, c = flips
    evs = [_ev("inject.bitflip", 1.0, a.step, rank=a.rank, tensor="param.w", index=a.index, before=1.0, after=-1.0),
           _ev("sdc.mismatch", 3.0, 50, diverged=["param.w"]),
           _ev("inject.bitflip", 5.0, b.step, rank=b.rank, tensor="grad.w", index=b.index, before=0.1, after=0.1000001),
           _ev("sdc.round", 7.0, 100, agree=True)]
    o = flip_outcomes(plan, evs, every=50)
    assert o[0].detected and o[0].detector == "sdc (sdc.mismatch)" and o[0].latency_steps == 50 - a.step
    assert o[0].latency_s == pytest.approx(2.0)
    assert not o[1].detected and o[1].why_not.startswith("gradient flip"), o[1]
    assert not o[2].injected and o[2].why_not == "not injected"
    s = summarize(o)
    assert s["overall"] == {"flips": 2, "detected": 1, "rate": 0.5} and s["not_injected"] == 1
    assert s["by_kind"]["param"]["rate"] == 1.0 and s["latency_steps"]["median"] == 50 - a.step


def test_bf16_flips_use_bf16_bits_and_the_plan_carries_the_dtype():
    """bf16 is 1 sign, 8 exponent, 7 mantissa bits: a flip drawn for it stays inside 16 bits,
    its class is bf16's, and the plan tells the worker which dtype it expects."""
    flips = random_flips(60, every=50, seed=3, dtype=torch.bfloat16)
    assert all(f.dtype == "bfloat16" and 0 <= f.bit < 16 and bit_class(f.bit, "bfloat16") == f.bit_class
               for f in flips)
    assert {f.bit_class for f in flips} == set(BIT_CLASSES)
    assert {f.bit for f in flips if f.bit_class == "exponent"} <= set(range(7, 15))
    assert [p.get("dtype") for p in flip_plan(flips[:2]).faults] == ["bfloat16", "bfloat16"]
    with pytest.raises(ValueError):  # bit 20 is no bf16 bit; bit 14 is bf16's exponent, not mantissa
        FlipSpec(step=3, rank=0, kind="param", tensor="*", index=-1, bit=20, bit_class="mantissa", dtype="bfloat16")
    with pytest.raises(ValueError):
        FlipSpec(step=3, rank=0, kind="param", tensor="*", index=-1, bit=14, bit_class="mantissa", dtype="bfloat16")
    t = torch.tensor([1.5, 0.25], dtype=torch.bfloat16)
    f = flip_bit(t, 0, 15)
    assert (f.before, f.after) == (1.5, -1.5) and f.before_bits ^ f.after_bits == 1 << 15
    assert math.isnan(flip_bit(t, 0, 14).after)  # 1.5's exponent 127 -> 255 with a mantissa: NaN, as in fp32


def test_outcomes_class_a_bit_by_the_dtype_the_worker_found():
    (spec,) = [FlipSpec(step=17, rank=1, kind="param", tensor="w", index=3, bit=14, bit_class="exponent",
                        dtype="bfloat16")]
    evs = [_ev("inject.bitflip", 1.0, 17, rank=1, tensor="param.w", index=3, before=0.5, after=1e38,
               dtype="bfloat16"), _ev("sdc.mismatch", 3.0, 50)]
    (o,) = flip_outcomes(flip_plan([spec]), evs, every=50)
    assert o.dtype == "bfloat16" and o.bit_class == "exponent" and o.detected, o  # in fp32 bit 14 is mantissa


def test_the_worker_refuses_a_flip_planned_for_another_dtype(tmp_path):
    """A bf16 flip must not land in an fp32 tensor (its bit would be counted in the wrong class)."""
    from titan.chaos.plan import Plan
    from titan.chaos.worker import WorkerFaults
    from titan.events import RunDir, read_run
    from titan.worker import WorkerContext

    rd = RunDir.create(tmp_path / "runs", "r")
    ctx = WorkerContext.from_env(run_dir=rd.path, env={"RANK": "0", "TITAN_NODE_ID": "n0"})
    model = torch.nn.Linear(2, 1)
    plan = Plan().bitflip(rank=0, step=1, target="param", tensor="weight", index=0, bit=14, dtype="bfloat16")
    env = {"TITAN_CHAOS_PLAN": str(plan.save(tmp_path / "plan.json"))}
    before = model.weight.detach().clone()
    with pytest.raises(ValueError, match="planned for bfloat16"):
        WorkerFaults.from_env(ctx, env).after_step(1, model, None)
    assert torch.equal(model.weight, before)
    model.to(torch.bfloat16)
    WorkerFaults.from_env(ctx, env).after_step(1, model, None)
    (ev,) = [e for e in read_run(rd.path).events if e.kind == "inject.bitflip"]
    assert ev.data["dtype"] == "bfloat16" and ev.data["before_bits"] ^ ev.data["after_bits"] == 1 << 14
