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
