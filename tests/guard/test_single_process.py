"""The guard in one process (no wrapper): clean long runs, bitwise skips, policy, stats."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from guard_harness import params, run_world
from titan.errors import UserError
from titan.guard import Observation, RobustWindow, judge
from titan.settings import load_settings
from titan.settings.guard import GuardConfig

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clean_thousand_step_runs_raise_nothing_with_the_default_policy(tmp_path: Path, seed: int) -> None:
    res = run_world(1, [{"name": "clean", "steps": 1000, "seed": seed, "wrap": "none"}], tmp_path)[0]["clean"]
    assert res["raised"] is None, res["raised"]
    flagged = [(s["step"], s["reason"]) for s in res["steps"] if s["reason"] or s["skipped"]]
    assert not flagged, f"seed {seed}: expected no guard decision on a clean run, saw {flagged}"
    assert res["steps"][-1]["loss"] < res["steps"][0]["loss"]


def test_no_wrapper_nan_skip_is_bitwise_a_plain_loop_that_skips_the_batch(tmp_path: Path) -> None:
    scen = [{"name": "g", "steps": 10, "wrap": "none",
             "faults": [{"kind": "nan_grad", "rank": 0, "param": "0.weight", "step": 4}]},
            {"name": "p", "steps": 10, "wrap": "none", "plain": True, "plain_skip": [4]}]
    res = run_world(1, scen, tmp_path)[0]
    skipped = [s["step"] for s in res["g"]["steps"] if s["skipped"]]
    assert skipped == [4], skipped
    assert res["g"]["steps"][3]["culprit"]["params"] == ["0.weight"]
    got, want = params(tmp_path, "g"), params(tmp_path, "p")
    assert all(torch.equal(got[k], want[k]) for k in want), "expected bitwise-equal weights"


def test_guard_state_dict_round_trips_and_keeps_stats(tmp_path: Path) -> None:
    res = run_world(1, [{"name": "s", "steps": 60, "wrap": "none"}], tmp_path)[0]["s"]
    st = res["state"]
    detail = json.loads(st["detail_json"])
    assert st["step_count"] == 60 and detail["loss_stats"]["accepted"] == 60, st.keys()
    assert all(isinstance(v, (int, float, str)) for v in st.values()), "flat, DCP-friendly state"
    from titan.guard import StepGuard

    g = StepGuard(torch.nn.Linear(2, 2), torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1))
    g.load_state_dict(st)
    assert g.state_dict()["detail_json"] == st["detail_json"] and g.step_count == 60


def test_policy_is_a_validated_settings_section() -> None:
    s = load_settings(env={"TITAN_GUARD_SPIKE_Z": "6", "TITAN_GUARD_ESCALATION": "lower_lr,abort"})
    assert s.guard.spike_z == 6.0 and s.guard.escalation == ("lower_lr", "abort")
    with pytest.raises(UserError, match="transient_action"):
        GuardConfig(transient_action="ignore")
    with pytest.raises(UserError, match="unknown escalation"):
        load_settings(env={"TITAN_GUARD_ESCALATION": "reboot"})


def test_robust_window_follows_a_falling_loss_and_still_flags_a_3x_spike() -> None:
    w = RobustWindow(100, 20, rel_floor=0.02)
    for i in range(200):
        w.add([(1.0 + 2.0 * math.exp(-i / 60)) * (1 + 0.03 * math.sin(i))])
    last = 1.0 + 2.0 * math.exp(-199 / 60)
    assert w.z(3 * last) > 8, w.z(3 * last)
    assert w.z(last * 1.05) < 8
    assert w.z(last * 0.5) < 0  # a drop is never a spike


def _obs(losses, codes, norm=1.0) -> Observation:
    return Observation(losses=tuple(losses), codes=tuple(codes), local_norms=(1.0,) * len(losses),
                       grad_norm=norm, scale=1.0, norm_t=torch.tensor(norm))


def test_judge_separates_overflow_from_a_nan_with_a_scaler() -> None:
    w = RobustWindow(100, 50, rel_floor=0.02)
    kw = dict(loss_stats=w, grad_stats=w, spike_z=8.0, loss_spike=True, grad_spike=True)
    assert judge(_obs([1, 1], [1, 1], math.inf), scaler=True, **kw).kind == "overflow"
    v = judge(_obs([1, 1], [1, 2], math.nan), scaler=True, **kw)
    assert (v.kind, v.ranks) == ("nonfinite", (1,))
    v = judge(_obs([1, 1], [1, 0], math.inf), scaler=False, **kw)
    assert (v.kind, v.ranks) == ("nonfinite", (0,))
    v = judge(_obs([1, 1], [0, 0], math.nan), scaler=False, **kw)
    assert (v.kind, v.ranks, v.detail["origin"]) == ("nonfinite", (), "collective")
    v = judge(_obs([math.nan, 1], [0, 0], 1.0), scaler=False, **kw)
    assert (v.kind, v.ranks) == ("nonfinite", (0,))
    assert dataclasses.replace(GuardConfig(), spike_z=4.0).spike_z == 4.0


def test_request_replay_reruns_the_step_and_reports_a_bitwise_match() -> None:
    from titan.chaos.inject import Injector
    from titan.guard import StepGuard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = StepGuard(model, opt, max_norm=1.0)
    x = torch.randn(16, 4)
    Injector(0, step_fn=lambda: guard.step_count + 1).nan_grad(rank=0, param="0.weight", step=2,
                                                                 value=1e3).attach(model)

    def fwd_bwd() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = model(x).pow(2).mean()
        loss.backward()
        return loss.detach()

    guard.request_replay()
    first = guard.step(fwd_bwd)
    assert first.replay_match is True and not first.skipped, first
    guard.request_replay()
    second = guard.step(fwd_bwd)  # a finite one-shot corruption: only the replay can see it
    assert second.replay_match is False, second
    assert guard.step(fwd_bwd).replay_match is None  # one request, one replay


def test_fp16_overflow_that_turns_into_nan_is_an_overflow_not_a_persistent_fault() -> None:
    from titan.guard import StepGuard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 30, growth_interval=1000)
    policy = GuardConfig(persistent_k=1, escalation=("abort",))  # any persistent fault would abort
    guard = StepGuard(model, opt, scaler=scaler, max_norm=1.0, policy=policy)
    x, y = torch.randn(32, 16), torch.randint(0, 8, (32,))

    def fwd_bwd() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(x)
        loss = torch.nn.functional.cross_entropy(out.float(), y)
        scaler.scale(loss).backward()
        return loss.detach()

    results = [guard.step(fwd_bwd) for _ in range(16)]
    reasons = [r.reason for r in results]
    assert reasons.count("overflow") >= 3, reasons  # NaN from inf·0 at 2^30 .. 2^2x
    assert not any(r.classification == "persistent" for r in results), reasons
    assert not results[-1].skipped and scaler.get_scale() < 2.0 ** 30, (reasons, scaler.get_scale())
    assert guard.strikes == {}, guard.strikes


def test_disabled_guard_is_the_plain_recipe() -> None:
    from titan.guard import StepGuard

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = StepGuard(model, opt, max_norm=1.0, policy=GuardConfig(enabled=False))
    before = model.weight.detach().clone()

    def fwd_bwd() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = model(torch.ones(2, 4)).sum()
        loss.backward()
        return loss.detach()

    res = guard.step(fwd_bwd)
    assert guard.check is None and not res.skipped and res.grad_norm > 0 and guard.step_count == 1
    assert not torch.equal(model.weight, before)


def test_the_guards_exchange_counts_as_a_collective_on_the_beacon(tmp_path: Path) -> None:
    """The exchange is a collective like DDP's buckets: counted issued and completed on the
    beacon, so a rank stopped before it is behind in the sequence the watchdog compares
    (uncounted, its waiting peer looked like the rank that stopped first)."""
    import titan.beacon as beacon
    from titan.guard import StepGuard

    b = beacon.Beacon(tmp_path / "n.local0.bcn", rank=0, local_rank=0, world=1, attempt=0, node="n")
    beacon.set_beacon(b)
    try:
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        guard = StepGuard(model, opt, max_norm=1.0)
        for _ in range(3):
            opt.zero_grad()
            model(torch.ones(3, 4)).sum().backward()
            guard.step(model(torch.ones(3, 4)).sum().detach())
        s = beacon.read_beacon(b.path)
        assert s.issued[0] == 3 and s.completed[0] == 3, f"issued={s.issued} completed={s.completed}"
    finally:
        beacon.set_beacon(None)
        b.close()
