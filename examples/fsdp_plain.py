"""A minimal FSDP2 training script, as people write it (no Titan): each block and the root
sharded with ``fully_shard``, gradient accumulation (no gradient sync on the micro-steps),
a learning rate set by hand every step (warm-up then constant), gradient clipping.

    torchrun --nproc-per-node 2 examples/fsdp_plain.py --epochs 3

Its Titan version is fsdp.py beside it (the diff is the integration; docs/integrate.md).
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


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

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Net()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data = make_data()
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)

    step = 0
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
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            step += 1
            if rank == 0 and step % 20 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item() * args.accum:.4f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
