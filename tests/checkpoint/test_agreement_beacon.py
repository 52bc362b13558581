"""``maybe_save``'s per-step agreement is a collective the hang watchdog can see (2 ranks, gloo).

A rank that waits in it for a stopped peer is in phase ``comm`` (learned, tight), not in the
``checkpoint`` budget, and is one collective ahead on the beacon, so the watchdog's rule names
the peer that never arrived — before, the waiting rank sat in the checkpoint budget with equal
counters and a stall there went undetected (seen in bench/peers' schedule).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import titan.beacon as beacon
from titan.beacon import Beacon, read_beacon
from titan.events import RunDir
from titan.watchdog.culprit import RankView, identify
from titan.worker import WorkerContext

pytestmark = pytest.mark.timeout(120)


def _rank(rank: int, root: str, port: int) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    dist.init_process_group("gloo", rank=rank, world_size=2)
    b = Beacon(Path(root) / f"n.local{rank}.bcn", rank=rank, local_rank=rank, world=2, attempt=0, node="n")
    beacon.set_beacon(b)
    from titan.checkpoint import Checkpointer

    ctx = WorkerContext.from_env(run_dir=Path(root) / "runs" / "r", env={
        "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "TITAN_NODE_ID": "n"})
    ckpt = Checkpointer(ctx, root=Path(root) / "ckpt")
    state = {"model": torch.nn.Linear(2, 2)}
    for step in (1, 2):  # step 1 also sets up the checkpointer's groups (collective)
        b.step_begin(step)
        if rank == 1 and step == 2:
            (Path(root) / "r1.late").touch()
            time.sleep(3.0)  # "stopped" in unmarked code while rank 0 waits in the agreement
        ckpt.maybe_save(step, state)
        b.step_end(step)
    ckpt.close()
    dist.barrier()
    dist.destroy_process_group()


def test_a_rank_waiting_in_the_per_step_agreement_is_in_comm_and_ahead_of_the_late_peer(tmp_path: Path) -> None:
    RunDir.create(tmp_path / "runs", "r")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, str(tmp_path), port)) for r in (0, 1)]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + 90
        while not (tmp_path / "r1.late").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        seen = None
        while time.monotonic() < deadline and seen is None:
            time.sleep(0.1)
            try:
                s0, s1 = read_beacon(tmp_path / "n.local0.bcn"), read_beacon(tmp_path / "n.local1.bcn")
            except (OSError, ValueError):
                continue
            if s0.issued[1] > s0.completed[1]:  # rank 0 is inside the agreement
                seen = (s0, s1)
        assert seen is not None, "rank 0 never showed the agreement in flight on its beacon"
        s0, s1 = seen
        assert s0.phase == "comm", f"expected the waiting rank in phase comm, saw {s0.phase!r}"
        assert (s0.issued[1], s1.issued[1]) == (2, 1), (s0.issued, s1.issued)
        views = [RankView(node="n", rank=s.rank, local_rank=s.rank, pid=0, attempt=0, step=2, phase=s.phase,
                          issued=list(s.issued), completed=list(s.completed), last_wall_ns=s.last_wall_ns,
                          phase_wall_ns=0, stalled_s=0.0, timeout_s=4.0) for s in (s0, s1)]
        v = identify(views)
        assert v is not None and v.rank == 1 and v.reason == "collective-seq", v
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0, 0]
        done = read_beacon(tmp_path / "n.local0.bcn")
        assert done.issued[1] == done.completed[1] >= 2, (done.issued, done.completed)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
