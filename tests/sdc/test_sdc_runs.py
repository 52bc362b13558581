"""Silent data corruption on real gloo runs: a flipped bit is found, named and repaired in-job.

Three runs of the tinygpt workload under ``titan run`` (30 steps, fingerprint rounds and
canary every 10 steps): a clean 3-rank run; the same with the lowest mantissa bit flipped in
a parameter of rank 1 (after step 20), in an Adam moment of rank 2 (after step 30), and a
perturbed compute canary on rank 0; and a 2-rank run with two Adam-moment flips compared
against the shared clean reference run.

A lowest-bit flip made *between* rounds is often absorbed by rounding within a few updates
(measured here: a flip after step 13 was gone by step 20 — the replicas agreed again); the
flips below are made at round steps, where they are still present (docs/sdc.md).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from titan.chaos.plan import Plan
from titan.events import filter_events, read_run

# Several faults hit one machine ("node") in these runs: a higher strike limit keeps the
# node ledger from excluding the only node mid-test (exclusion is tested in tests/watchdog).
# node ledger from excluding the only node mid-test (exclusion is tested in tests/watchdog),
# and a 1-step escalation window keeps two faults 10 steps apart from escalating.
SDC_SETS = ("--set", "sdc.every_steps=10", "--set", "sdc.canary_every_steps=10", "--set", "watchdog.strike_limit=10",
            "--set", "sdc.escalate_window_steps=1")


@dataclasses.dataclass
class Run:
    run_dir: Path
    params: dict[str, torch.Tensor]
    events: list


def _titan_run(root: Path, name: str, nproc: int, workload: tuple[str, ...], plan: Plan | None = None,
               timeout: int = 300) -> Run:
    env = dict(os.environ, TITAN_WATCHDOG_LEDGER_PATH=str(root / f"{name}-ledger.sqlite"))
    if plan is not None:
        env["TITAN_CHAOS_PLAN"] = str(plan.save(root / f"{name}-plan.toml"))
    out = root / f"{name}.pt"
    cmd = [sys.executable, "-m", "titan", "run", "--nproc-per-node", str(nproc), "--max-restarts", "0",
           "--runs-dir", str(root / "runs"), "--run-id", name, *SDC_SETS, "--", *workload, "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, start_new_session=True)
    assert p.returncode == 0, p.stderr[-3000:]
    return Run(root / "runs" / name, torch.load(out), read_run(root / "runs" / name).events)


def _workload(steps: int = 30, seed: int = 7) -> tuple[str, ...]:
    return ("-m", "titan.workloads.tinygpt", "--steps", str(steps), "--seed", str(seed), "--ckpt-every", "10",
            "--threads", "1", "--log-every", "0")


def _assert_bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    differing = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differing, f"final weights differ from the fault-free run in {len(differing)} tensors: {differing[:5]}"


@pytest.fixture(scope="module")
def three_rank_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("sdc3")
    clean = _titan_run(root, "clean3", 3, _workload())
    plan = (Plan().bitflip(rank=1, step=20, target="param", tensor="blocks.0.attn.qkv.weight", index=5, bit=0)
            .bitflip(rank=2, step=30, target="exp_avg", tensor="blocks.1.mlp.0.weight", index=7, bit=0)
            .gemm_perturb(rank=0, step=4))
    faulty = _titan_run(root, "flip3", 3, _workload(), plan)
    return clean, faulty


@pytest.mark.multinode
@pytest.mark.timeout(600)
def test_param_bitflip_is_named_by_majority_and_repaired_bitwise(three_rank_runs):
    clean, faulty = three_rank_runs
    flips = filter_events(faulty.events, kinds=["inject.bitflip"])
    assert [(f.rank, f.step) for f in flips] == [(1, 20), (2, 30)], flips
    mism = [e for e in filter_events(faulty.events, kinds=["sdc.mismatch"]) if e.rank == 0]
    assert mism, "the flipped bit was not detected"
    m = mism[0]
    assert m.step == 20, f"expected detection at the round of step 20, got {m.step}"
    assert set(m.data["culprits"]) == {"1"}, m.data
    assert m.data["culprits"]["1"] == ["param.blocks.0.attn.qkv.weight"], m.data
    rep = filter_events(faulty.events, kinds=["sdc.repaired"])
    assert rep and rep[0].data["restored_step"] == 10, rep
    strikes = [e for e in filter_events(faulty.events, kinds=["guard.strike"]) if e.data.get("cause") == "sdc.mismatch"]
    assert {e.data["rank"] for e in strikes} == {1, 2}
    assert not filter_events(faulty.events, kinds=["worker.failed", "launcher.restart"]), "repair must be in-job"
    _assert_bitwise(faulty.params, clean.params)


@pytest.mark.multinode
@pytest.mark.timeout(600)
def test_adam_moment_bitflip_is_named_by_majority_and_repaired(three_rank_runs):
    clean, faulty = three_rank_runs
    mism = [e for e in filter_events(faulty.events, kinds=["sdc.mismatch"]) if e.rank == 0]
    assert [e.step for e in mism] == [20, 30], [(e.step, e.data) for e in mism]
    assert mism[1].data["culprits"] == {"2": ["optim.blocks.1.mlp.0.weight.exp_avg"]}, mism[1].data
    rep = [e for e in filter_events(faulty.events, kinds=["sdc.repaired"]) if e.rank == 0]
    assert [(e.step, e.data["restored_step"]) for e in rep] == [(20, 10), (30, 20)]
    _assert_bitwise(faulty.params, clean.params)


@pytest.mark.multinode
@pytest.mark.timeout(600)
def test_perturbed_canary_names_its_rank_and_clean_run_raises_nothing(three_rank_runs):
    clean, faulty = three_rank_runs
    can = filter_events(faulty.events, kinds=["sdc.canary"])
    assert [(e.rank, e.data["rank"], e.step) for e in can] == [(0, 0, 10)], [(e.data, e.step) for e in can]
    noisy = [e for e in clean.events if e.kind.startswith("sdc.") and e.level in ("warning", "error", "critical")]
    assert not noisy, [f"{e.kind}: {e.msg}" for e in noisy]
    rounds = [e for e in clean.events if e.kind == "sdc.round"]
    assert rounds, "the clean run held no fingerprint round: nothing was checked"


@pytest.mark.timeout(600)
def test_two_replicas_repair_bitwise_and_name_the_culprit_only_when_the_evidence_allows(reference_run, tmp_path):
    # Flip A (step 12, rank 1) reaches the all-reduce before the round at 20: both replicas
    # leave the clean trajectory, so the repair is exact but the rank cannot be named.
    # Flip B (step 30 = a round step, rank 0) is caught before any all-reduce: named exactly.
    # Flip A flips the top mantissa bit (22): the moment moves by ~25 %, so rank 1's next
    # update differs far above rounding and the divergence survives to the round on any
    # trajectory. A low bit there (bit 1: a 1e-7 relative change) is absorbed within a few
    # updates or not, depending on the trajectory (the LR schedule, the kernels): measured
    # here, the same flip gave a mismatch at step 20 with --steps 30 and none with --steps 20.
    plan = (Plan().bitflip(rank=1, step=12, target="exp_avg", tensor="blocks.1.mlp.0.weight", index=3, bit=22)
            .bitflip(rank=0, step=30, target="exp_avg", tensor="blocks.0.attn.proj.weight", index=11, bit=2))
    faulty = _titan_run(tmp_path, "flip2", 2, reference_run.workload_args, plan)
    flips = filter_events(faulty.events, kinds=["inject.bitflip"])
    assert [(f.rank, f.step) for f in flips] == [(1, 12), (0, 30)], f"planned flips (1, 12), (0, 30); fired {flips}"
    mism = [e for e in filter_events(faulty.events, kinds=["sdc.mismatch"]) if e.rank == 0]
    assert [(e.step, e.data["culprits"]) for e in mism] == [(20, {}), (30, {})], "2 replicas cannot name before replay"
    assert "optim.blocks.1.mlp.0.weight.exp_avg" in mism[0].data["diverged"], mism[0].data  # the tensor is named
    rep = [e for e in filter_events(faulty.events, kinds=["sdc.repaired"]) if e.rank == 0]
    assert len(rep) == 2, rep
    assert rep[0].data["culprits"] == {} and "culprit unknown" in rep[0].data["note"], rep[0].data
    assert rep[1].data["culprits"] == {"0": ["optim.blocks.0.attn.proj.weight.exp_avg"]}, rep[1].data
    replayed = [e.step for e in faulty.events if e.kind == "step" and e.rank == 0 and e.data.get("replay")]
    assert replayed == list(range(11, 21)) + list(range(21, 31)), replayed
    _assert_bitwise(faulty.params, torch.load(reference_run.params))


def test_shared_clean_reference_run_raises_no_sdc_finding(reference_run):
    evs = read_run(reference_run.run_dir.path).events
    rounds = {(e.rank, e.step) for e in evs if e.kind == "sdc.round"}
    assert {s for _, s in rounds} >= {0, 10, 20, 30}, sorted(rounds)
    noisy = [f"{e.kind}: {e.msg}" for e in evs if e.kind.startswith("sdc.") and e.level in ("warning", "error", "critical")]
    assert not noisy, noisy


@pytest.mark.timeout(600)
def test_thousand_clean_steps_with_default_cadence_raise_nothing(tmp_path):
    # 2 ranks, a very small model, the default K and M (50): 20 fingerprint rounds and 20
    # canary rounds over 1,000 steps must all agree.
    workload = ("-m", "titan.workloads.tinygpt", "--steps", "1000", "--layers", "1", "--width", "32", "--heads", "2",
                "--seq-len", "16", "--batch-size", "2", "--threads", "1", "--log-every", "0", "--ckpt-every", "500")
    env = dict(os.environ, TITAN_WATCHDOG_LEDGER_PATH=str(tmp_path / "ledger.sqlite"))
    cmd = [sys.executable, "-m", "titan", "run", "--nproc-per-node", "2", "--max-restarts", "0", "--no-agent",
           "--runs-dir", str(tmp_path / "runs"), "--run-id", "clean1000", "--", *workload]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=580, env=env, start_new_session=True)
    assert p.returncode == 0, p.stderr[-3000:]
    evs = read_run(tmp_path / "runs" / "clean1000").events
    rounds = sorted({e.step for e in evs if e.kind == "sdc.round"})
    assert rounds == list(range(0, 1001, 50)), rounds
    noisy = [f"{e.kind}: {e.msg}" for e in evs if e.kind.startswith(("sdc.", "guard.")) and e.level != "debug"
             and e.level != "info"]
    assert not noisy, noisy[:5]
