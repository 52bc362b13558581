"""SIGTERM on one rank → every rank saves the same step and exits 9, whether the
checkpointer's per-step flags ride the step guard's vector (DDP's gradient all-reduce, or
the guard's own exchange) or ``maybe_save`` all-reduces them itself.

One spawn of 2 gloo ranks runs every scenario (``_ckpt_ride_worker.py``). A SIGTERM that
reaches rank 1 after its step's vector left is carried by the next step's vector: both
ranks then save one step later — still the same step everywhere.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from titan.checkpoint.manifest import list_committed, verify
from titan.events import read_run

from _ckpt_ride_worker import rank_main

pytestmark = pytest.mark.timeout(180)

SCENARIOS = [
    # (wiring, when the signal comes, the step that should be saved on both ranks)
    {"name": "ride_early", "wiring": "ride", "when": "early", "sigterm_step": 5, "steps": 9, "expect": 5},
    {"name": "ride_late", "wiring": "ride", "when": "late", "sigterm_step": 4, "steps": 9, "expect": 5},
    {"name": "closure_early", "wiring": "closure", "when": "early", "sigterm_step": 4, "steps": 9, "expect": 4},
    {"name": "exchange_late", "wiring": "exchange", "when": "late", "sigterm_step": 5, "steps": 9, "expect": 5},
]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def world2(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], Path]:
    out = tmp_path_factory.mktemp("ride")
    ctx = mp.start_processes(rank_main, args=(2, _port(), SCENARIOS, str(out)), nprocs=2, join=False,
                             start_method="spawn")
    try:
        deadline = time.monotonic() + 150
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError("the 2-rank SIGTERM scenarios did not finish within 150 s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join(5)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)], out


@pytest.mark.parametrize("sc", SCENARIOS, ids=[s["name"] for s in SCENARIOS])
def test_sigterm_on_one_rank_saves_the_same_step_on_every_rank(world2, sc) -> None:
    results, out = world2
    name, want = sc["name"], sc["expect"]
    mine = [r[name] for r in results]
    for rank, r in enumerate(mine):
        assert "error" not in r, f"rank {rank}: {r['error']}"
        assert r["preempted_at"] == want, f"rank {rank} preempted at step {r['preempted_at']}, expected {want}"
        assert r["last_saved_step"] == want and r["exit_code"] == 9, r
    evs = read_run(out / name).events
    pre = sorted((e.rank, e.data["step"]) for e in evs if e.kind == "ckpt.preempted")
    assert pre == [(0, want), (1, want)], f"ckpt.preempted per rank: {pre}"
    saved = sorted((e.rank, e.data["step"]) for e in evs if e.kind == "ckpt.saved")
    assert saved == [(0, 3), (0, want), (1, 3), (1, want)], f"ckpt.saved per rank: {saved}"
    committed = list_committed(out / name / "ckpt")
    assert [s for s, _ in committed] == [3, want], committed
    assert all(verify(p).ok for _, p in committed)
    if sc["wiring"] == "exchange":  # no riding guard: maybe_save's own all-reduce, every call
        assert all(r["flags_rode"] == 0 and r["flags_exchanged"] == want for r in mine), mine
    else:  # every maybe_save took the flags the guard's vector carried: no all-reduce of its own
        assert all(r["flags_rode"] == want and r["flags_exchanged"] == 0 for r in mine), mine
    if sc["wiring"] == "closure":  # the guard's own exchange after the backward carried them
        assert not any(x for r in mine for x in r["rode"]), mine
    else:  # the guard's vector rode DDP's gradient all-reduce (with the flags in "ride")
        assert all(all(r["rode"]) and len(r["rode"]) == want for r in mine), mine
