"""Measure (4): how long the training loop is blocked per in-memory capture, 100m preset.

One process per rank (2 ranks, gloo), started by the system's own launcher. The state is
tinygpt ``100m`` (54.6 M parameters) + AdamW moments after one real optimizer step. Each
capture: the parameters are nudged (so nothing can be cached), then the system's capture
call is timed (``stall_s``: the time the loop is blocked), then the loop "computes" for
``--gap-s`` seconds (the next step, which asynchronous captures overlap) and the system's
own wait-for-completion call is timed too (``wait_s``: blocking only if the copy did not
finish within the gap). ``floor_s``: one plain copy of the same tensors (clone), the
memcpy floor. Writes ``$PEERS_LOG_DIR/capture.rank<r>.json``.

    --system titan_step   Checkpointer.maybe_save with checkpoint.snapshot_every_steps=1: the
                          per-step crash-recovery tier (/dev/shm, one memcpy; under titan run)
    --system titan        Checkpointer.snapshot: the verified tier SDC rollback uses
    --system gemini       lm_resiliency InMemoryCheckpointManager.save / maybe_wait (docs/gemini.md)
    --system dcp_async    torch.distributed.checkpoint.async_save / future.result()
"""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

from titan.workloads.tinygpt.config import PRESETS
from titan.workloads.tinygpt.model import GPT


def build(preset: str):
    torch.manual_seed(0)
    model = GPT(PRESETS[preset])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    x = torch.randint(0, PRESETS[preset].vocab_size, (1, 64))
    model(x, x).backward()  # one real step: AdamW's moments exist
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt


def nudge(model) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-7)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--system", required=True, choices=("titan_step", "titan", "gemini", "dcp_async"))
    ap.add_argument("--captures", type=int, default=5)
    ap.add_argument("--gap-s", type=float, default=2.0)
    ap.add_argument("--preset", default="100m")
    ap.add_argument("--dir", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    if a.system.startswith("titan"):
        from titan.worker import WorkerContext, init_distributed
        ctx = WorkerContext.from_env()
        init_distributed(ctx)
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, opt = build(a.preset)
    nbytes = sum(t.numel() * t.element_size() for t in list(model.state_dict().values()) +
                 [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)])
    if a.system == "titan":
        from titan.checkpoint import Checkpointer
        ckpt = Checkpointer(ctx, seed=0)
        ckpt.enable_snapshots()
        app = {"model": model, "optimizer": opt}
        capture, wait = (lambda step: ckpt.snapshot(step, app)), (lambda: None)
    elif a.system == "titan_step":
        from titan.checkpoint import Checkpointer
        ckpt = Checkpointer(ctx, seed=0)  # launched with snapshot_every_steps=1, every_steps=0 (capture.py)
        app = {"model": model, "optimizer": opt}
        capture, wait = (lambda step: ckpt.maybe_save(step, app)), (lambda: None)  # its checksum thread: in the next save
    elif a.system == "gemini":
        from lm_resiliency import InMemoryCkptConfig
        from lm_resiliency.experimental import InMemoryCheckpointManager
        mgr = InMemoryCheckpointManager(InMemoryCkptConfig(interval=1, pin_memory=False, disk_flush_interval=0,
                                                           run_id="capture", disk_folder=os.path.join(a.dir, "gemini")))
        capture = lambda step: mgr.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, step)  # noqa: E731
        wait = mgr.maybe_wait
    else:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict
        pending = []

        def capture(step):
            m, o = get_state_dict(model, opt)
            pending.append(dcp.async_save({"model": m, "optim": o}, checkpoint_id=os.path.join(a.dir, f"dcp-{step}")))

        def wait():
            while pending:
                pending.pop().result()
    rows = []
    for i in range(1, a.captures + 1):
        nudge(model)
        dist.barrier()
        t0 = time.perf_counter()
        capture(i)
        stall = time.perf_counter() - t0
        time.sleep(a.gap_s)
        t1 = time.perf_counter()
        wait()
        rows.append({"capture": i, "stall_s": stall, "wait_s": time.perf_counter() - t1})
    t0 = time.perf_counter()
    copy = [t.clone() for t in list(model.state_dict().values()) +
            [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]]
    floor = time.perf_counter() - t0
    del copy
    out = {"system": a.system, "rank": rank, "bytes": nbytes, "floor_s": floor, "rows": rows,
           "stall_median_s": statistics.median(r["stall_s"] for r in rows),
           "wait_median_s": statistics.median(r["wait_s"] for r in rows)}
    with open(os.path.join(os.environ.get("PEERS_LOG_DIR", a.dir), f"capture.rank{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.barrier()
    if a.system == "gemini":
        mgr.close()
    elif a.system.startswith("titan"):
        ckpt.close()
        ckpt.discard_snapshots()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
