"""The guard on 2 gloo ranks: every acceptance scenario runs in ONE spawn (start-up of two
torch processes dominates on 2 cores), then each test checks its own scenario.

Scenarios: NaN/Inf injected on one rank vs a plain loop (bitwise), gradient accumulation,
20 loss spikes on one rank, transient vs persistent (poisoned sample), escalation with
rollback → lower LR → abort, GradScaler overflow + NaN, FSDP2.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
import torch

from guard_harness import batch_indices, events, params, run_world

pytestmark = pytest.mark.timeout(240)

SPIKE_STEPS = sorted(random.Random(7).sample(range(56, 141), 20))
SPIKE_RANKS = [random.Random(s).randrange(2) for s in SPIKE_STEPS]
POISON_STEP = 6
POISON_IDX = batch_indices(POISON_STEP, rank=0, world=2, bs=32)[5]
ESC_POISON = [batch_indices(s, rank=1, world=2, bs=32)[0] for s in (3, 4, 5, 6)]
NO_SPIKE = {"loss_spike": False, "grad_spike": False}

SCENARIOS = [
    # Small buckets: DDP starts with one bucket and rebuilds several after iteration 1; the
    # fault at step 1 hits the first layout, those at 5 and 9 the rebuilt one.
    {"name": "nan_inf", "steps": 12, "verify_at": [1, 3], "bucket_cap_mb": 0.002, "faults": [
        {"kind": "nan_grad", "rank": 0, "param": "5.weight", "step": 1},
        {"kind": "nan_grad", "rank": 1, "param": "3.weight", "step": 5},
        {"kind": "inf_grad", "rank": 0, "param": "0.bias", "step": 9}]},
    {"name": "nan_inf_plain", "steps": 12, "plain": True, "plain_skip": [1, 5, 9], "bucket_cap_mb": 0.002},
    {"name": "accum", "steps": 8, "accum": 2, "faults": [
        {"kind": "nan_grad", "rank": 1, "param": "5.weight", "step": 4}]},
    {"name": "accum_plain", "steps": 8, "accum": 2, "plain": True, "plain_skip": [4]},
    {"name": "spikes", "steps": 140, "faults": [
        {"kind": "loss_spike", "rank": r, "step": s, "factor": 3.0} for s, r in zip(SPIKE_STEPS, SPIKE_RANKS)]},
    {"name": "poison", "steps": 8, "poison": [POISON_IDX]},
    {"name": "escalate", "steps": 12, "poison": ESC_POISON, "snapshot_at": 2,
     "policy": {"persistent_k": 2, "persistent_window": 10, **NO_SPIKE}},
    {"name": "scaler", "steps": 14, "scaler": 2.0 ** 72, "faults": [
        {"kind": "nan_grad", "rank": 1, "param": "3.weight", "step": 2}]},
    {"name": "fsdp", "steps": 8, "wrap": "fsdp", "faults": [
        {"kind": "nan_activation", "rank": 1, "module": "3", "step": 4}]},
    # The loss handed over before the backward (add_loss + step()): the verdict rides DDP's
    # last gradient bucket, no exchange after the backward.
    # (No closure, no replay: each fault counts as persistent; 3 of them would lower the LR.)
    {"name": "nan_inf_ride", "steps": 12, "ride": True, "bucket_cap_mb": 0.002, "policy": {"persistent_k": 4},
     "faults": [
        {"kind": "nan_grad", "rank": 0, "param": "5.weight", "step": 1},
        {"kind": "nan_grad", "rank": 1, "param": "3.weight", "step": 5},
        {"kind": "inf_grad", "rank": 0, "param": "0.bias", "step": 9}]},
    {"name": "accum_ride", "steps": 8, "accum": 2, "ride": True, "faults": [
        {"kind": "nan_grad", "rank": 1, "param": "5.weight", "step": 4}]},
    {"name": "spikes_ride", "steps": 140, "ride": True, "policy": {"persistent_k": 100}, "faults": [
        {"kind": "loss_spike", "rank": r, "step": s, "factor": 3.0} for s, r in zip(SPIKE_STEPS, SPIKE_RANKS)]},
    {"name": "ride_mismatch", "steps": 10, "ride": True, "perturb_norm_at": 5},
]


@pytest.fixture(scope="module")
def world2(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], Path]:
    out = tmp_path_factory.mktemp("guard2")
    return run_world(2, SCENARIOS, out, timeout_s=200), out


def _skips(res: dict) -> dict[int, dict]:
    return {s["step"]: s for s in res["steps"] if s["skipped"]}


def _kinds(out: Path, name: str, rank: int, kind: str) -> list[dict]:
    return [e for e in events(out, name, rank) if e["kind"] == kind]


def test_nan_and_inf_on_one_rank_skip_everywhere_and_name_rank_node_param(world2) -> None:
    res, out = world2
    for r in (0, 1):
        sc = res[r]["nan_inf"]
        assert sc["raised"] is None, sc["raised"]
        skips = _skips(sc)
        assert sorted(skips) == [1, 5, 9], f"rank {r}: expected steps 1, 5 and 9 skipped, saw {sorted(skips)}"
        c1, c5, c9 = skips[1]["culprit"], skips[5]["culprit"], skips[9]["culprit"]
        assert (c1["ranks"], c1["params"], c1["culprits"][0]["buckets"]) == ([0], ["5.weight"], ["bucket0"]), c1
        assert len({c["culprits"][0]["buckets"][0] for c in (c5, c9)}) == 2, (c5, c9)  # rebuilt: several
        assert (c5["ranks"], c5["nodes"], c5["params"]) == ([1], ["node1"], ["3.weight"]), c5
        assert c5["culprits"][0]["values"] == ["nan"], c5
        assert (c9["ranks"], c9["nodes"], c9["params"]) == ([0], ["node0"], ["0.bias"]), c9
        assert c9["culprits"][0]["values"] == ["inf"], c9
    ev = _kinds(out, "nan_inf", 0, "guard.nonfinite")
    assert [e["data"]["ranks"] for e in ev] == [[0], [1], [0]], ev
    assert ev[1]["data"]["culprits"][0]["node"] == "node1" and ev[1]["data"]["params"] == ["3.weight"]


def test_weights_after_skips_are_bitwise_those_of_a_plain_loop_without_titan(world2) -> None:
    _, out = world2
    for name, ref in (("nan_inf", "nan_inf_plain"), ("accum", "accum_plain"),
                      ("nan_inf_ride", "nan_inf_plain"), ("accum_ride", "accum_plain")):
        for r in (0, 1):
            got, want = params(out, name, r), params(out, ref, r)
            diff = [k for k in want if not torch.equal(got[k], want[k])]
            assert not diff, f"{name} rank {r}: expected bitwise-equal weights, differing: {diff}"


def test_gradient_accumulation_replays_every_micro_batch_and_skips_once(world2) -> None:
    res, out = world2
    for r in (0, 1):
        sc = res[r]["accum"]
        assert sorted(_skips(sc)) == [4], sc["steps"]
        assert _skips(sc)[4]["classification"] == "transient"
        assert len(_skips(sc)[4]["culprit"]["culprits"][0]["samples"]) == 64  # 2 micro-batches x 32
    assert len(_kinds(out, "accum", 1, "guard.strike")) == 1


def test_three_x_loss_spikes_on_one_rank_are_all_caught_with_the_default_policy(world2) -> None:
    res, _ = world2
    sc = res[0]["spikes"]
    assert sc["raised"] is None, sc["raised"]
    flagged = {s["step"]: s for s in sc["steps"] if s["reason"]}
    missed = [s for s in SPIKE_STEPS if s not in flagged]
    assert not missed, f"expected all 20 spikes caught, missed steps {missed}"
    extra = sorted(set(flagged) - set(SPIKE_STEPS))
    assert not extra, f"false positives at steps {extra}: {[flagged[s]['reason'] for s in extra]}"
    for s, r in zip(SPIKE_STEPS, SPIKE_RANKS):
        assert flagged[s]["culprit"]["ranks"] == [r], (s, r, flagged[s]["culprit"])
        assert flagged[s]["classification"] == "transient", flagged[s]


def test_riding_ddps_all_reduce_skips_the_same_steps_and_names_the_same_culprits(world2) -> None:
    res, out = world2
    for r in (0, 1):
        sc = res[r]["nan_inf_ride"]
        assert sc["raised"] is None, sc["raised"]
        assert all(s["rode"] for s in sc["steps"]), [s["rode"] for s in sc["steps"]]
        skips = _skips(sc)
        assert sorted(skips) == [1, 5, 9], f"rank {r}: expected steps 1, 5 and 9 skipped, saw {sorted(skips)}"
        got = [(skips[s]["culprit"]["ranks"], skips[s]["culprit"]["params"],
                skips[s]["culprit"]["culprits"][0]["values"]) for s in (1, 5, 9)]
        assert got == [([0], ["5.weight"], ["nan"]), ([1], ["3.weight"], ["nan"]), ([0], ["0.bias"], ["inf"])], got
        accum = res[r]["accum_ride"]
        assert all(s["rode"] for s in accum["steps"]) and sorted(_skips(accum)) == [4], accum["steps"]
        assert _skips(accum)[4]["culprit"]["ranks"] == [1]
        assert [s["grad_norm"] for s in res[r]["nan_inf_ride"]["steps"]] == \
            [s["grad_norm"] for s in res[1 - r]["nan_inf_ride"]["steps"]]
    ev = _kinds(out, "nan_inf_ride", 0, "guard.nonfinite")
    assert [e["data"]["ranks"] for e in ev] == [[0], [1], [0]], ev


def test_riding_catches_every_loss_spike_on_one_rank(world2) -> None:
    res, _ = world2
    sc = res[0]["spikes_ride"]
    assert sc["raised"] is None, sc["raised"]
    assert all(s["rode"] for s in sc["steps"])
    flagged = {s["step"]: s for s in sc["steps"] if s["reason"]}
    assert sorted(flagged) == SPIKE_STEPS, sorted(flagged)
    for s, r in zip(SPIKE_STEPS, SPIKE_RANKS):
        assert flagged[s]["culprit"]["ranks"] == [r], (s, r, flagged[s]["culprit"])
    assert res[0]["spikes_ride"]["state"] == res[1]["spikes_ride"]["state"], "the ranks' statistics differ"


def test_ranks_that_compute_different_norms_are_reported_and_the_guard_stops_riding(world2) -> None:
    res, out = world2
    for r in (0, 1):
        sc = res[r]["ride_mismatch"]
        assert sc["raised"] is None, sc["raised"]
        # Step 5's norms differ; step 6's vector carries them: reported there, then exchanged.
        assert [s["rode"] for s in sc["steps"]] == [True] * 6 + [False] * 4, [s["rode"] for s in sc["steps"]]
        assert not _skips(sc)
    ev = _kinds(out, "ride_mismatch", 0, "guard.norm_mismatch")
    assert [e["step"] for e in ev] == [5], ev
    a, b = ev[0]["data"]["norms"]
    assert a != b and abs(a - b) / a < 2e-3, ev[0]["data"]
    st = [res[r]["ride_mismatch"]["state"] for r in (0, 1)]
    assert st[0] == st[1], "the ranks' statistics differ: a rank's own norm entered them"


def test_one_shot_fault_is_transient_and_struck_against_its_node(world2) -> None:
    res, out = world2
    assert _skips(res[0]["nan_inf"])[5]["classification"] == "transient"
    strikes = _kinds(out, "nan_inf", 1, "guard.strike")
    assert [(e["data"]["node"], e["node"], e["step"]) for e in strikes] == [("node1", "node1", 5)], strikes
    assert [(e["data"]["node"], e["step"]) for e in _kinds(out, "nan_inf", 0, "guard.strike")] == [
        ("node0", 1), ("node0", 9)]


def test_poisoned_sample_is_persistent_and_its_index_is_logged(world2) -> None:
    res, out = world2
    for r in (0, 1):
        sk = _skips(res[r]["poison"])
        assert sorted(sk) == [POISON_STEP] and sk[POISON_STEP]["classification"] == "persistent", sk
        assert POISON_IDX in sk[POISON_STEP]["culprit"]["culprits"][0]["samples"]
    rep = _kinds(out, "poison", 0, "guard.replay")
    assert rep and rep[0]["data"]["classification"] == "persistent", rep
    assert POISON_IDX in rep[0]["data"]["samples"]["0"], rep[0]["data"]
    assert not _kinds(out, "poison", 0, "guard.strike") and not _kinds(out, "poison", 1, "guard.strike")


def test_escalation_rolls_back_then_lowers_lr_then_aborts_with_gave_up(world2) -> None:
    res, out = world2
    for r in (0, 1):
        sc = res[r]["escalate"]
        assert sc["raised"] and sc["raised"]["type"] == "TitanAbort", sc["raised"]
        assert sc["raised"]["exit_code"] == 3, sc["raised"]
        rungs = [(s["step"], s["escalation"]) for s in sc["steps"] if s["escalation"]]
        # rollback to 2 → steps 3, 4 again → lower LR → steps 5, 6 → abort (raised, no result)
        assert rungs == [(4, "rollback"), (4, "lower_lr")], rungs
        assert [s["step"] for s in sc["steps"]] == [1, 2, 3, 4, 3, 4, 5], sc["steps"]
        back = [s for s in sc["steps"] if s["rolled_back_to"] is not None]
        assert back and back[0]["rolled_back_to"] == 2
        assert sc["steps"][-1]["lr"] < sc["steps"][0]["lr"] * 0.6
    esc = _kinds(out, "escalate", 1, "guard.escalate")
    assert esc and esc[-1]["level"] == "critical" and esc[-1]["data"]["exit_code"] == 3, esc
    assert esc[-1]["step"] == 6 and esc[-1]["data"]["action"] == "abort", esc[-1]
    assert _kinds(out, "escalate", 0, "guard.rollback")[0]["data"]["restored_step"] == 2


def test_scaler_overflow_gives_no_strike_but_a_nan_during_it_is_attributed_and_struck(world2) -> None:
    res, out = world2
    for r in (0, 1):
        steps = res[r]["scaler"]["steps"]
        overflow = [s["step"] for s in steps if s["reason"] == "overflow"]
        assert len(overflow) >= 2, f"expected an overflow period, saw reasons {[s['reason'] for s in steps]}"
        s2 = steps[1]
        assert s2["reason"] == "nonfinite" and s2["culprit"]["ranks"] == [1], s2
        assert s2["classification"] == "transient", s2
        # Once the scale is low enough, updates are applied (the guard's norm overflows
        # float32 above ~2^64 of scale: that, too, is an overflow the scaler backs off from).
        assert any(not s["skipped"] for s in steps[-7:]) and steps[-1]["scale"] < 2.0 ** 72, steps[-7:]
    strikes = _kinds(out, "scaler", 1, "guard.strike") + _kinds(out, "scaler", 0, "guard.strike")
    assert [(e["data"]["node"], e["step"]) for e in strikes] == [("node1", 2)], strikes


def test_fsdp2_skip_attribution_and_training(world2) -> None:
    res, _ = world2
    for r in (0, 1):
        sc = res[r]["fsdp"]
        assert sc["raised"] is None, sc["raised"]
        sk = _skips(sc)
        assert sorted(sk) == [4] and sk[4]["culprit"]["ranks"] == [1], sk
        assert sk[4]["culprit"]["params"], sk[4]["culprit"]
        losses = [s["loss"] for s in sc["steps"] if not s["skipped"]]
        assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0], losses


def test_a_verification_replay_requested_on_one_rank_runs_on_every_rank(world2) -> None:
    res, out = world2
    for r in (0, 1):
        st = res[r]["nan_inf"]["steps"][2]
        assert st["step"] == 3 and st["replay_match"] is True, st
        assert res[r]["nan_inf"]["steps"][3]["replay_match"] is None
    ver = [e for e in _kinds(out, "nan_inf", 0, "guard.replay") if e["data"].get("verify")]
    assert [(e["step"], e["data"]["match"]) for e in ver] == [(3, True)], ver
