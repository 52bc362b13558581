"""LM Resiliency: the plain loop with ``enable_resiliency`` (GEMINI + SCOUT), under torchrun.

Wired as docs/api.md says ("Enable Resiliency": call ``enable_resiliency(model, optimizer,
interval=…)`` once on every rank after the model and optimizer exist, "Add Caller-Owned
State" for the scheduler and sampler, ``resiliency.step_count`` as the resume point) with
the CPU/gloo adjustments that this machine needs: gloo groups passed explicitly
(``group``/``nccl_group``: its peer-group discovery assumes NCCL), host buffers not pinned
(``pin_memory=False``), the node-local tier in the job directory. Its torchrun rendezvous
backend (the closed-loop restart path) does not register on torch 2.13, so plain torchrun
restarts the group and GEMINI restores from its node-local tier. Settings and their
sources: bench/peers/configs/lm_resiliency.toml.
"""
import time; T0 = time.time()  # bench
from peers.common.steplog import StepLog  # bench
LOG = StepLog("lm_resiliency", T0)  # bench

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from lm_resiliency import InMemoryCkptConfig, enable_resiliency

from peers.common import workload
from peers.common.faults import Faults  # bench


def main() -> None:
    args = workload.parse_args()
    cfg = workload.config()  # bench: this system's settings (configs/<name>.toml)
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    LOG.mark("ready", rank=rank)  # bench
    w = workload.build(args, rank, world)
    model = DDP(w.model)
    group = dist.new_group(backend="gloo")
    resiliency = enable_resiliency(
        w.model, w.optimizer, interval=cfg["interval"], enable_detection=world >= cfg["detection_min_world"],
        group=group, nccl_group=group, device=torch.device("cpu"),
        checkpoint=InMemoryCkptConfig(pin_memory=False, disk_folder=os.path.join(args.ckpt_dir, "gemini"),
                                      disk_flush_interval=args.ckpt_every, run_id=cfg["run_id"]),
        extra_state_fn=lambda: {"scheduler": w.scheduler.state_dict(), "sampler": w.sampler.state_dict()},
        load_extra_state_fn=lambda s: (w.scheduler.load_state_dict(s["scheduler"]),
                                       w.sampler.load_state_dict(s["sampler"])))
    LOG.mark("restored", step=resiliency.step_count)  # bench
    faults = Faults.from_env(rank, w.model)  # bench
    batches = w.batches()
    for step in range(resiliency.step_count + 1, args.steps + 1):
        t_start = time.time()  # bench
        faults.begin_step(step)  # bench
        x, y = next(batches)
        w.optimizer.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(w.model.parameters(), w.clip)
        w.optimizer.step()
        w.scheduler.step()
        w.commit()
        LOG.step(step, t_start=t_start, loss=loss.item())  # bench
    LOG.mark("done")  # bench
    resiliency.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
