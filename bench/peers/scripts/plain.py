"""The plain loop: tinygpt on DDP/gloo with no fault tolerance at all.

Every system's script is this file plus that system's documented wiring; the lines they
add or change against it are measure (6). Lines marked ``# bench`` are the harness's
instrumentation (the same in every script).
"""
import time; T0 = time.time()  # bench
from peers.common.steplog import StepLog  # bench
LOG = StepLog("plain", T0)  # bench

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from peers.common import workload
from peers.common.faults import Faults  # bench


def main() -> None:
    args = workload.parse_args()
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    LOG.mark("ready", rank=rank)  # bench
    w = workload.build(args, rank, world)
    model = DDP(w.model)
    faults = Faults.from_env(rank, w.model)  # bench
    batches = w.batches()
    for step in range(1, args.steps + 1):
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
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
