"""A tiny Lightning job (DDP under torchelastic, gloo, no downloads) wired to Titan."""

import argparse
import os

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from titan.integrations.lightning import TitanCallback, resume_path


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=3e-3)
        sched = torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.1, total_iters=64)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def data(n: int = 256) -> TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(n, 16, generator=g)
    y = (x[:, :4].sum(1) > 0).long() + 2 * (x[:, 4:8].sum(1) > 0).long()
    return TensorDataset(x, y)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.path.join(os.environ.get("TITAN_RUN_DIR", "."), "pl-out"))
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--save-steps", type=int, default=5)
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--plain", action="store_true", help="no Titan: a run from before Titan was adopted")
    a = p.parse_args()
    torch.set_num_threads(1)
    L.seed_everything(0, verbose=False)
    model = Tiny()
    loader = DataLoader(data(), batch_size=8, shuffle=True)
    ckpts = ModelCheckpoint(dirpath=a.out, every_n_train_steps=a.save_steps, save_top_k=-1)
    trainer = L.Trainer(accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")), strategy="ddp",
                        max_epochs=a.epochs, max_steps=a.max_steps,
                        callbacks=[ckpts] if a.plain else [ckpts, TitanCallback()], logger=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        gradient_clip_val=1.0, deterministic=True)
    trainer.fit(model, loader, ckpt_path=None if a.plain else resume_path(a.out))
    if trainer.global_rank == 0:
        print(f"final step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
