"""A small DDP training script for the watchdog tests, launched by ``titan run``.

Deterministic (data is a function of step and rank; no dropout), checkpointed every
``--ckpt-every`` steps (rank 0 writes model + optimizer + step atomically), so a run
restarted after a hang ends with the same bits as a clean run.

Faults: ``--inject ATTEMPT:RANK:STEP:KIND`` (repeatable; RANK may be ``node=ID``), KIND one of
``hook`` (asleep inside the DDP comm hook of the last bucket, before issuing it),
``data`` (asleep in data loading), ``spin`` (tight Python loop holding the GIL, in
forward), ``kill`` (SIGKILL itself in data loading); ``--slow RANK`` doubles that rank's compute time
(a sleep in forward equal to its median compute time: data + forward + optimizer, the phases the
straggler detector compares; a sleep of the forward time alone slowed this small model's compute by
only ~1.3x); ``--no-progress`` exits with a crash right after resuming (give-up tests).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import titan.beacon as beacon
from titan.worker import WorkerContext, init_distributed
from titan.worker.errors import fault_boundary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--out", default="")
    ap.add_argument("--inject", action="append", default=[])
    ap.add_argument("--slow", type=int, default=-1)
    ap.add_argument("--slow-where", choices=("forward", "gap"), default="forward")
    ap.add_argument("--crash-after-resume", action="store_true")
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--batch", type=int, default=16, help="rows per rank and step (more: a longer compute)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    ctx = WorkerContext.from_env()
    b = beacon.install(ctx)
    with fault_boundary(ctx):
        b.enter("init")
        init_distributed(ctx)
        b.exit()
        faults = {}
        for spec in a.inject:
            att, rank, step, kind = spec.split(":")
            who = ctx.node == rank[5:] if rank.startswith("node=") else int(rank) == ctx.rank
            if int(att) == ctx.attempt and who:
                faults[int(step)] = kind
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                                    torch.nn.Tanh(), torch.nn.Linear(64, 8))
        ddp = DDP(model, bucket_cap_mb=0.01)
        cur = {"step": 0}

        def before(bucket) -> None:  # noqa: ANN001
            if faults.get(cur["step"]) == "hook" and bucket.is_last():
                ctx.events.emit("inject.stall", "asleep in comm hook", step=cur["step"], data={"kind": "hook"})
                time.sleep(3600)

        ddp.register_comm_hook(None, beacon.comm_hook(before=before))
        opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
        ckpt = ctx.run_dir.checkpoints / "hangtest.pt"
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        start = 0
        b.enter("restore")
        if ckpt.exists():
            st = torch.load(ckpt)
            model.load_state_dict(st["model"])
            opt.load_state_dict(st["opt"])
            start = int(st["step"])
        b.exit()
        if a.crash_after_resume:
            raise RuntimeError("injected crash right after resume")
        compute_times: list[float] = []  # data + forward + optimizer per step, without the --slow sleep
        for step in range(start + 1, a.steps + 1):
            cur["step"] = step
            ctx.step = step
            t0 = time.perf_counter()
            slept = 0.0
            if ctx.rank == a.slow and a.slow_where == "gap" and len(compute_times) >= 5:
                # Before the step, no phase open: as a harness (bench/peers) or a slow
                # iterator the loop does not mark would; counted from the step's start.
                time.sleep(statistics.median(compute_times[-20:]))
                t0 = time.perf_counter()
            b.step_begin(step)
            with beacon.phase("data"):
                g = torch.Generator().manual_seed(step * 1000 + ctx.rank)
                x = torch.randn(a.batch, 32, generator=g)
                y = torch.randn(a.batch, 8, generator=g)
                if faults.get(step) == "kill":
                    ctx.events.emit("inject.kill", "SIGKILL self", step=step, data={"kind": "kill"})
                    os.kill(os.getpid(), 9)
                if faults.get(step) == "data":
                    ctx.events.emit("inject.stall", "asleep in data loading", step=step, data={"kind": "data"})
                    time.sleep(3600)
            with beacon.phase("forward"):
                loss = torch.nn.functional.mse_loss(ddp(x), y)
                if faults.get(step) == "spin":
                    ctx.events.emit("inject.stall", "spinning in forward", step=step, data={"kind": "spin"})
                    n = 0
                    while True:
                        n += 1
                if ctx.rank == a.slow and a.slow_where == "forward" and len(compute_times) >= 5:
                    ts = time.perf_counter()
                    time.sleep(statistics.median(compute_times[-20:]))
                    slept = time.perf_counter() - ts
            tb = time.perf_counter()
            with beacon.phase("backward"):
                loss.backward()
            with beacon.phase("optimizer"):
                to = time.perf_counter()
                opt.step()
                opt.zero_grad(set_to_none=True)
            compute_times.append((tb - t0) - slept + (time.perf_counter() - to))
            if a.step_sleep:
                time.sleep(a.step_sleep)
            b.step_end(step)
            ctx.events.emit("step", step=step, data={"loss": float(loss.detach()), "step_time_s": time.perf_counter() - t0})
            if step % a.ckpt_every == 0:
                with beacon.phase("checkpoint"):
                    if ctx.rank == 0:
                        tmp = ckpt.with_suffix(".tmp")
                        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
                        os.replace(tmp, ckpt)
                    dist.barrier()
        if ctx.rank == 0 and a.out:
            torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, a.out)
        dist.barrier()
        b.close()
        dist.destroy_process_group()
    sys.exit(0)


if __name__ == "__main__":
    main()
