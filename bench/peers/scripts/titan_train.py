"""Titan: the plain loop wired as Titan's docs say, launched by ``titan run``.

Wiring from docs/workload.md ("Wiring Titan into your own loop"), docs/guard.md ("Wiring")
and docs/hang.md ("Using it"): worker context + robust init, progress beacons with phases,
DCP checkpoints with resume, the step guard, the fault boundary (the restart decision is
the launcher's: titan.launch.restarts).
Settings and their sources: bench/peers/configs/titan.toml.
"""
import time; T0 = time.time()  # bench
from peers.common.steplog import StepLog  # bench
LOG = StepLog("titan", T0)  # bench

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import titan.beacon as beacon
from titan.checkpoint import Checkpointer
from titan.guard import StepGuard
from titan.worker import WorkerContext, init_distributed
from titan.worker.errors import fault_boundary

from peers.common import workload
from peers.common.faults import Faults  # bench


def main() -> None:
    args = workload.parse_args()
    torch.set_num_threads(args.threads)
    ctx = WorkerContext.from_env()
    ctx.announce()
    bcn = beacon.install(ctx)
    with fault_boundary(ctx):
        with beacon.phase("init"):
            init_distributed(ctx)
        rank, world = ctx.rank, ctx.world_size
        LOG.mark("ready", rank=rank)  # bench
        w = workload.build(args, rank, world)
        model = DDP(w.model)
        guard = StepGuard(model, w.optimizer, scheduler=w.scheduler, max_norm=w.clip, ctx=ctx)
        app_state = {"model": w.model, "optimizer": w.optimizer, "scheduler": w.scheduler,
                     "sampler": w.sampler, "guard": guard}
        ckpt = Checkpointer(ctx, seed=args.seed)
        guard.use_checkpointer(ckpt, app_state)
        with beacon.phase("restore"):
            start = ckpt.restore(app_state)
        LOG.mark("restored", step=start)  # bench
        faults = Faults.from_env(rank, w.model, lambda kind, step: ctx.events.emit(  # bench: told, as drills do
            f"inject.{kind}", step=step, data={"rank": rank, "by": "bench/peers"}))  # bench
        batches = w.batches()
        step = start
        while step < args.steps:
            step += 1
            ctx.step = step
            t_start = time.time()  # bench
            bcn.step_begin(step)
            faults.begin_step(step)  # bench
            with beacon.phase("data"):
                x, y = next(batches)

            def fwd_bwd():
                w.optimizer.zero_grad(set_to_none=True)
                with beacon.phase("forward"):
                    loss = model(x, y)
                with beacon.phase("backward"):
                    loss.backward()
                return loss.detach()

            res = guard.step(fwd_bwd)
            if res.rolled_back_to is not None:
                step, batches = res.rolled_back_to, w.batches()
                continue
            w.commit()
            bcn.step_end(step)
            ctx.events.emit("step", step=step, data={"loss": res.loss_mean, "step_time_s": time.time() - t_start,
                                                     **res.event_data()}, force=res.skipped)
            LOG.step(step, t_start=t_start, loss=res.loss, skipped=res.skipped)  # bench
            with beacon.phase("checkpoint"):
                ckpt.maybe_save(step, app_state)
        beacon.done()
        ckpt.close()
    LOG.mark("done")  # bench


if __name__ == "__main__":
    main()
