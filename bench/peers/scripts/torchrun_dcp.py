"""Plain torchrun + DCP: the baseline, wired as PyTorch's own docs say.

torchrun restarts the whole worker group on any failure (``--max-restarts``); the script
resumes from its last DCP checkpoint — the pattern of the torchrun docs ("Train script":
load the latest checkpoint at start, save periodically) with the state handled as in the
DCP recipe (``Stateful`` app state over ``get_state_dict``/``set_state_dict``). Settings and
their sources: bench/peers/configs/torchrun.toml.
"""
import time; T0 = time.time()  # bench
from peers.common.steplog import StepLog  # bench
LOG = StepLog("torchrun", T0)  # bench

import os
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.nn.parallel import DistributedDataParallel as DDP

from peers.common import workload
from peers.common.faults import Faults  # bench


class AppState(Stateful):
    def __init__(self, w, step=0):
        self.w, self.step = w, step

    def state_dict(self):
        model, optim = get_state_dict(self.w.model, self.w.optimizer)
        return {"model": model, "optim": optim, "sched": self.w.scheduler.state_dict(),
                "sampler": self.w.sampler.state_dict(), "step": self.step}

    def load_state_dict(self, sd):
        set_state_dict(self.w.model, self.w.optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        self.w.scheduler.load_state_dict(sd["sched"])
        self.w.sampler.load_state_dict(sd["sampler"])
        self.step = sd["step"]


def main() -> None:
    args = workload.parse_args()
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    LOG.mark("ready", rank=rank)  # bench
    w = workload.build(args, rank, world)
    state = AppState(w)
    latest = os.path.join(args.ckpt_dir, "latest")
    if os.path.exists(latest):
        with open(latest) as f:
            dcp.load({"app": state}, checkpoint_id=os.path.join(args.ckpt_dir, f.read().strip()))
    LOG.mark("restored", step=state.step)  # bench
    model = DDP(w.model)
    faults = Faults.from_env(rank, w.model)  # bench
    batches = w.batches()
    for step in range(state.step + 1, args.steps + 1):
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
        if step % args.ckpt_every == 0:
            state.step = step
            t_save = time.time()  # bench
            dcp.save({"app": state}, checkpoint_id=os.path.join(args.ckpt_dir, f"step_{step}"))
            if rank == 0:
                with open(latest + ".tmp", "w") as f:
                    f.write(f"step_{step}")
                os.replace(latest + ".tmp", latest)
            LOG.mark("saved", step=step, stall_s=time.time() - t_save)  # bench
    LOG.mark("done")  # bench
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
