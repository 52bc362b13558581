"""Titan: the plain loop wired as Titan's README and docs/integrate.md say, launched by ``titan run``.

The wiring of examples/ddp.py (docs/integrate.md, "12 changed lines"): the worker context
(under ``titan run`` it also installs the beacon for hang detection and the fault boundary),
robust init, the step guard in place of clip/step/schedule (it drives the beacon's phases
and writes one ``step`` event per step), DCP checkpoints with resume (and the per-step
in-memory tier, a setting). The loop keeps its shape. Settings and their sources:
bench/peers/configs/titan.toml.
"""
import time; T0 = time.time()  # bench
from peers.common.steplog import StepLog  # bench
LOG = StepLog("titan", T0)  # bench

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import titan

from peers.common import workload
from peers.common.faults import Faults  # bench


def main() -> None:
    args = workload.parse_args()
    torch.set_num_threads(args.threads)
    titan_ctx = titan.WorkerContext.from_env()
    titan.init_distributed(titan_ctx, "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    LOG.mark("ready", rank=rank)  # bench
    w = workload.build(args, rank, world)
    model = DDP(w.model)
    guard = titan.StepGuard(model, w.optimizer, scheduler=w.scheduler, max_norm=w.clip, ctx=titan_ctx)
    ckpt = titan.Checkpointer(titan_ctx, seed=args.seed)
    state = {"model": w.model, "optimizer": w.optimizer, "scheduler": w.scheduler, "sampler": w.sampler,
             "guard": guard}
    start = ckpt.restore(state)
    LOG.mark("restored", step=start)  # bench
    faults = Faults.from_env(rank, w.model, lambda kind, step: titan_ctx.events.emit(  # bench: told, as drills do
        f"inject.{kind}", step=step, data={"rank": rank, "by": "bench/peers"}))  # bench
    batches = w.batches()
    for step in range(start + 1, args.steps + 1):
        t_start = time.time()  # bench
        faults.begin_step(step)  # bench
        x, y = next(batches)
        w.optimizer.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        res = guard.step(loss)
        w.commit()
        LOG.step(step, t_start=t_start, loss=res.loss, skipped=res.skipped)  # bench
        ckpt.maybe_save(step, state)
    ckpt.close()
    LOG.mark("done")  # bench
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
