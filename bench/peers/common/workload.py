"""The tinygpt workload, built identically for every system.

Model, corpus, sampler and schedule come from ``titan.workloads.tinygpt`` (pure torch +
numpy modules), with tinygpt's defaults: preset ``tiny``, batch 8 per rank, AdamW
(lr 3e-3, betas 0.9/0.95, weight decay 0.1), 10 warm-up steps then cosine to 0.1, clip 1.0,
dropout 0.1, seed 0, one intra-op thread, fp32 parameters (``--dtype bf16``: bf16 parameters,
as tinygpt's flag; measure 5 only). Initial weights from ``torch.manual_seed(seed)``
(identical on every rank), then per-rank RNG streams as tinygpt seeds them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader

from titan.workloads.tinygpt.config import PRESETS
from titan.workloads.tinygpt.data import MarkovCorpus, ResumableSampler
from titan.workloads.tinygpt.model import GPT
from titan.workloads.tinygpt.rng import seed_everything, warmup_cosine

__all__ = ["Workload", "build", "config", "parse_args"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags every system's script takes (the harness passes the same ones to all)."""
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--ckpt-every", type=int, default=20, help="disk checkpoint cadence (systems that save)")
    p.add_argument("--ckpt-dir", default="ckpt")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                   help="parameter dtype, as tinygpt's --dtype (bf16: gradients and AdamW moments bf16 too)")
    return p.parse_args(argv)


def config() -> dict[str, Any]:
    """This system's settings from its config file, handed over by the harness as JSON."""
    return json.loads(os.environ.get("PEERS_CONFIG", "{}") or "{}")


@dataclasses.dataclass
class Workload:
    model: GPT
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    sampler: ResumableSampler
    corpus: MarkovCorpus
    clip: float

    def batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches from the sampler's committed position (build after any restore)."""
        loader = DataLoader(self.corpus, batch_size=self.sampler.batch_size, sampler=self.sampler,
                            drop_last=True, num_workers=0, generator=torch.Generator().manual_seed(0))
        yield from loader

    def commit(self) -> None:
        """Advance the sampler by one global batch (call after the optimizer step)."""
        self.sampler.advance(self.sampler.global_batch)


def build(args: argparse.Namespace, rank: int, world: int) -> Workload:
    """Model (identical initial weights on every rank), AdamW, warm-up + cosine, data."""
    cfg = PRESETS[args.preset]
    torch.manual_seed(args.seed)
    model = GPT(cfg).to(torch.bfloat16 if getattr(args, "dtype", "fp32") == "bf16" else torch.float32)
    seed_everything(args.seed, rank)
    lr = 3e-3 if args.preset == "tiny" else 3e-4
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(10, args.steps, 0.1))
    corpus = MarkovCorpus(cfg.vocab_size, cfg.seq_len, num_samples=4096, seed=args.seed)
    sampler = ResumableSampler(len(corpus), args.batch_size, seed=args.seed, rank=rank, world_size=world)
    return Workload(model=model, optimizer=opt, scheduler=sched, sampler=sampler, corpus=corpus, clip=1.0)
