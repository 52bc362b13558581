"""Sharded (FSDP2) state has no replica inside the group: SDC says so and raises nothing."""

from __future__ import annotations

import os
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from titan.events import read_run

from _dist import leave_without_teardown


def _worker(rank: int, port: int, run_dir: str, q) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      LOCAL_RANK=str(rank), TITAN_RUN_DIR=run_dir, TITAN_NODE_ID="n")
    from torch.distributed.fsdp import fully_shard

    from titan.sdc.monitor import SDCMonitor
    from titan.settings import load_settings
    from titan.worker import WorkerContext

    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        ctx = WorkerContext.from_env(load_settings(env={}), env=dict(os.environ))
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
        fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        sdc = SDCMonitor(ctx, model, opt, ctx.settings.sdc)
        sdc.start(0)
        for step in range(1, 101):
            model(torch.randn(4, 16)).sum().backward()
            opt.step()
            opt.zero_grad()
            assert sdc.after_step(step) is None
        ctx.events.close()
        q.put((rank, sdc.fingerprints))  # a SimpleQueue writes at once: nothing left to flush
        dist.barrier()  # neither rank tears down while the other may still be in a collective
    finally:
        dist.destroy_process_group()
    leave_without_teardown()  # FSDP2 keeps the group alive past destroy: its teardown can abort (-6)


@pytest.mark.timeout(420)  # spawn + torch import + 100 FSDP steps: 25-190 s at load 20-40 here
def test_fsdp2_shards_are_not_compared_and_the_reason_is_reported(tmp_path):
    from titan.events import RunDir

    rd = RunDir.create(tmp_path, "fsdp")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    procs = [ctx.Process(target=_worker, args=(r, port, str(rd.path), q)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + 360
        for p in procs:  # one deadline for both: a rank may finish ms after its peer
            p.join(max(0.0, deadline - time.monotonic()))
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    assert sorted([q.get(), q.get()]) == [(0, False), (1, False)]
    evs = read_run(rd.path).events
    una = [e for e in evs if e.kind == "sdc.unavailable"]
    assert len(una) == 2 and "sharded" in una[0].msg
    assert not [e for e in evs if e.kind in ("sdc.mismatch", "sdc.canary")]
