"""fsdp_plain.py with Titan: guard, checkpoints (sharded), hang detection, events.

    titan run --nproc-per-node 2 -- examples/fsdp.py --epochs 3
    titan drill --nproc-per-node 2 -- examples/fsdp.py --epochs 3

Every changed line ends with ``# titan``. The loop keeps its shape: gradient accumulation
with ``set_requires_gradient_sync``, the learning rate set by hand (the guard's LR-lowering
escalation still applies: it scales the rate at the update), ``guard.step`` after the last
micro-batch (docs/integrate.md).
"""

import argparse

import titan  # titan
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset


class Net(torch.nn.Module):
    def __init__(self, dim: int = 32, width: int = 64, depth: int = 3, classes: int = 4) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(dim, width)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.LayerNorm(width), torch.nn.Linear(width, width), torch.nn.GELU())
            for _ in range(depth))
        self.out = torch.nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = h + b(h)
        return self.out(h)


def make_data(n: int = 512, dim: int = 32) -> TensorDataset:
    g = torch.Generator().manual_seed(4321)
    x = torch.randn(n, dim, generator=g)
    y = (x[:, :4].sum(1) > 0).long() + 2 * (x[:, 4:8].sum(1) > 0).long()
    return TensorDataset(x, y)


def lr_at(step: int, peak: float, warmup: int = 10) -> float:
    return peak * min(1.0, (step + 1) / warmup)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    args = p.parse_args()

    titan_ctx = titan.WorkerContext.from_env()  # titan
    titan.init_distributed(titan_ctx, "gloo")  # titan
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Net()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data = make_data()
    sampler = titan.ResumableSampler(data, args.batch_size, shuffle=True, seed=0)  # titan
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    guard = titan.StepGuard(model, opt, max_norm=1.0, ctx=titan_ctx)  # titan
    ckpt = titan.Checkpointer(titan_ctx)  # titan
    state = {"model": model, "optimizer": opt, "sampler": sampler, "guard": guard}  # titan

    step = ckpt.restore(state)  # titan
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for micro, (x, y) in enumerate(loader):
            last = (micro + 1) % args.accum == 0
            model.set_requires_gradient_sync(last)
            loss = F.cross_entropy(model(x), y) / args.accum
            loss.backward()
            if not last:
                continue
            for group in opt.param_groups:
                group["lr"] = lr_at(step, args.lr)
            guard.step(loss * args.accum)  # titan
            opt.zero_grad()
            step += 1
            ckpt.maybe_save(step, state)  # titan
            if rank == 0 and step % 20 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item() * args.accum:.4f}", flush=True)

    ckpt.close()  # titan
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
