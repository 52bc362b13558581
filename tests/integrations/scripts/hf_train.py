"""A tiny Hugging Face Trainer job (2 gloo ranks, no downloads) wired to Titan in two lines."""

import argparse
import os

import torch
from torch import nn
from transformers import Trainer, TrainingArguments

from titan.integrations.transformers import TitanCallback


class Tiny(nn.Module):
    """A model built here: the Trainer needs only forward(**batch) -> {"loss": …}."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict:
        logits = self.net(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class Data(torch.utils.data.Dataset):
    def __init__(self, n: int = 256) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(n, 16, generator=g)
        self.y = (self.x[:, :4].sum(1) > 0).long() + 2 * (self.x[:, 4:8].sum(1) > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "labels": self.y[i]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.path.join(os.environ.get("TITAN_RUN_DIR", "."), "hf-out"))
    p.add_argument("--epochs", type=float, default=2)
    p.add_argument("--save-steps", type=int, default=5)
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--plain", action="store_true", help="no Titan: a run from before Titan was adopted")
    a = p.parse_args()
    torch.set_num_threads(1)
    args = TrainingArguments(
        output_dir=a.out, per_device_train_batch_size=8, num_train_epochs=a.epochs, learning_rate=3e-3,
        lr_scheduler_type="linear", save_strategy="steps", save_steps=a.save_steps, save_total_limit=4,
        logging_strategy="no", report_to="none", use_cpu=True, ddp_backend="gloo" if "WORLD_SIZE" in os.environ else None,
        ddp_find_unused_parameters=False, seed=0, data_seed=0, dataloader_num_workers=0, disable_tqdm=True, max_grad_norm=1.0,
        max_steps=a.max_steps)
    torch.manual_seed(0)
    model = Tiny()
    trainer = Trainer(model=model, args=args, train_dataset=Data())
    if a.plain:
        trainer.train()
    else:
        titan_cb = TitanCallback(trainer)
        trainer.train(resume_from_checkpoint=titan_cb.resume_from())
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"final step {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
