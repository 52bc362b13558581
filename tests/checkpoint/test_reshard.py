"""Resume across world sizes (2 → 1 and 1 → 2): same model state, data position carried over.

Exact in data, not bitwise in the continuation: per-rank RNG streams are re-derived from
(seed, new rank, step) because they cannot be split or merged (docs/checkpoint.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from _ckpt_launch import bitwise_diff, load_out, run_workload, step_events

ARGS = ["--seq-len", "32", "--batch-size", "4", "--threads", "1", "--no-guard", "--log-every", "0"]


def _single(run_dir, args, timeout=120):
    run_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, TITAN_RUN_DIR=str(run_dir))
    r = subprocess.run([sys.executable, "-m", "titan.workloads.tinygpt", *ARGS, *args], env=env,
                       capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]


def _loaded(run_dir):
    return [e for e in step_events(run_dir) if e["kind"] == "ckpt.loaded"]


def _last_samples(run_dir):
    return max((e["step"], e["data"]["samples"]) for e in step_events(run_dir) if e["kind"] == "step")[1]


# five launches: ~30 s on a quiet 2-core box, ~2 min when it is shared
@pytest.mark.timeout(240)
def test_two_to_one_and_one_to_two_keep_model_state_and_data_position(tmp_path):
    a = tmp_path / "a"
    r = run_workload(a, 2, ["--steps", "4", "--ckpt-every", "4", "--seq-len", "32", "--batch-size", "4",
                            "--out", str(tmp_path / "a.pt")])
    assert r.returncode == 0, (a / "torchrun.log").read_text()[-3000:]
    _single(a, ["--steps", "4", "--out", str(tmp_path / "a1.pt")])
    (ev,) = _loaded(a)
    assert ev["data"]["resharded"] and ev["data"]["from_world_size"] == 2 and ev["world"] == 1
    assert not bitwise_diff(load_out(tmp_path / "a.pt"), load_out(tmp_path / "a1.pt")), "2 → 1 changed the model"
    cfg = [e for e in step_events(a) if e["kind"] == "workload.config" and e["world"] == 1][-1]
    assert cfg["data"]["samples"] == _last_samples(a) == 4 * 2 * 4, "data position not carried over 2 → 1"

    b = tmp_path / "b"
    _single(b, ["--steps", "4", "--ckpt-every", "4", "--out", str(tmp_path / "b.pt")])
    # 1 → 2, model state: resume a copy on 2 ranks with nothing left to train; rank 0 writes
    # what it loaded.
    b2 = tmp_path / "b2"
    shutil.copytree(b, b2)
    r = run_workload(b2, 2, ["--steps", "4", "--seq-len", "32", "--batch-size", "4", "--out", str(tmp_path / "b2.pt")])
    assert r.returncode == 0, (b2 / "torchrun.log").read_text()[-3000:]
    assert all(e["data"]["resharded"] for e in _loaded(b2)) and len(_loaded(b2)) == 2
    assert not bitwise_diff(load_out(tmp_path / "b.pt"), load_out(tmp_path / "b2.pt")), "1 → 2 changed the model"
    r = run_workload(b, 2, ["--steps", "5", "--seq-len", "32", "--batch-size", "4"])
    assert r.returncode == 0, (b / "torchrun.log").read_text()[-3000:]
    loaded = _loaded(b)
    assert len(loaded) == 2 and all(e["data"]["resharded"] for e in loaded)
    step5 = [e for e in step_events(b) if e["kind"] == "step" and e["step"] == 5]
    assert step5 and step5[0]["data"]["samples"] == 4 * 4 + 2 * 4, \
        f"1 → 2: step 5 should consume one 2-rank batch after 16 samples, saw {step5[0]['data']['samples']}"
