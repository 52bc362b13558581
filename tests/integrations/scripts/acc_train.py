"""A tiny Accelerate loop (MULTI_CPU over gloo, no downloads) wired to Titan."""

import argparse
import os

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from titan.integrations.accelerate import TitanAccelerate


def data(n: int = 256) -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 16, generator=g)
    y = (x[:, :4].sum(1) > 0).long() + 2 * (x[:, 4:8].sum(1) > 0).long()
    return TensorDataset(x, y)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seeded-loader", action="store_true", help="the loader shuffles with its own torch.Generator")
    p.add_argument("--exit-after", type=int, default=0, help="a crash: os._exit(9) after this step (tests)")
    a = p.parse_args()
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    set_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0) if a.seeded_loader else None
    loader = DataLoader(data(), batch_size=8, shuffle=True, generator=gen)
    scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.1, total_iters=64)
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    titan = TitanAccelerate(accelerator, model, optimizer, scheduler=scheduler)
    for epoch in range(a.epochs):
        for x, y in titan.batches(loader, epoch):
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            if a.exit_after and titan.guarded is not None and titan.guarded.step_count == a.exit_after:
                os._exit(9)
    titan.close()
    accelerator.print(f"final step {titan.step}")
    accelerator.end_training()  # destroys the process group: no rank left in gloo when its peer exits


if __name__ == "__main__":
    main()
