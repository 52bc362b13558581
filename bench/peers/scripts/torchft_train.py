"""torchft: the plain loop wired as torchft's train_ddp.py and README say.

One replica group per rank (a group of one worker, as train_ddp.py does for DDP), each
under its own ``torchrun --nnodes=1 --nproc_per_node=1 --max_restarts=…`` (torchft/torchx.py),
all coordinated by one ``torchft_lighthouse``. A killed replica is restarted by its own
torchrun and heals from a live peer; the survivors keep their processes and step on.
Settings and their sources: bench/peers/configs/torchft.toml.
"""
import time; T0 = time.time()  # bench
from peers.common.steplog import StepLog  # bench
LOG = StepLog("torchft", T0)  # bench

import os
from datetime import timedelta

import torch

from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo
from torchft.checkpointing.pg_transport import PGTransport

from peers.common import workload
from peers.common.faults import Faults  # bench


def main() -> None:
    args = workload.parse_args()
    cfg = workload.config()  # bench: this system's settings (configs/<name>.toml)
    torch.set_num_threads(args.threads)
    replica = int(os.environ["REPLICA_GROUP_ID"])
    replicas = int(os.environ["NUM_REPLICA_GROUPS"])
    LOG.mark("ready", rank=replica)  # bench
    w = workload.build(args, replica, replicas)

    def state_dict():
        return {"model": w.model.state_dict(), "optim": w.optimizer.state_dict(),
                "sched": w.scheduler.state_dict(), "sampler": w.sampler.state_dict()}

    def load_state_dict(sd):
        w.model.load_state_dict(sd["model"])
        w.optimizer.load_state_dict(sd["optim"])
        w.scheduler.load_state_dict(sd["sched"])
        w.sampler.load_state_dict(sd["sampler"])

    pg = ProcessGroupGloo(timeout=timedelta(seconds=cfg["pg_timeout_s"]))
    transport = PGTransport(pg, timeout=timedelta(seconds=cfg["transport_timeout_s"]), device="cpu")
    manager = Manager(pg=pg, min_replica_size=cfg["min_replica_size"], load_state_dict=load_state_dict,
                      state_dict=state_dict, replica_id=f"train_ddp_{replica}",
                      timeout=timedelta(seconds=cfg["manager_timeout_s"]), checkpoint_transport=transport)
    model = DistributedDataParallel(manager, w.model)
    optimizer = Optimizer(manager, w.optimizer)
    faults = Faults.from_env(replica, w.model)  # bench
    batches = w.batches()
    while manager.current_step() < args.steps:
        t_start = time.time()  # bench
        faults.begin_step(manager.current_step() + 1)  # bench
        x, y = next(batches)
        optimizer.zero_grad()
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(w.model.parameters(), w.clip)
        position, step = w.sampler.state_dict(), manager.current_step()
        optimizer.step()
        if manager.current_step() == step:
            continue
        healed = w.sampler.state_dict() != position
        w.scheduler.step()
        w.commit()
        if healed:
            batches = w.batches()
            LOG.mark("restored", step=manager.current_step() - 1)  # bench
        LOG.step(manager.current_step(), t_start=t_start, loss=loss.item())  # bench
    LOG.mark("done")  # bench


if __name__ == "__main__":
    main()
