"""A tiny model + sampler-like object for in-process checkpoint tests (world size 1)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from titan.settings import load_settings
from titan.worker import WorkerContext


class CountingSampler:
    """Stands in for a data sampler: a replicated global consumed-samples counter."""

    def __init__(self, seed: int = 7) -> None:
        self.seed, self.consumed = seed, 0

    def batch(self, n: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 100_003 + self.consumed)
        return torch.randn(n, 8, generator=g)

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "consumed": self.consumed}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.seed, self.consumed = int(d["seed"]), int(d["consumed"])


def build(seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Dropout(0.3), torch.nn.Linear(32, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2, gamma=0.7)
    return {"model": model, "optim": opt, "sched": sched, "sampler": CountingSampler()}


def train_steps(st: dict[str, Any], start: int, end: int, ckpt: Any = None) -> list[float]:
    """Steps start+1..end; every step uses data (sampler), dropout (torch RNG), python and numpy RNG."""
    losses = []
    for step in range(start + 1, end + 1):
        x = st["sampler"].batch(4) * (1.0 + random.random()) + float(np.random.rand())
        loss = st["model"](x).pow(2).mean()
        loss.backward()
        st["optim"].step()
        st["optim"].zero_grad(set_to_none=True)
        st["sched"].step()
        st["sampler"].consumed += 4
        losses.append(loss.item())
        if ckpt is not None:
            ckpt.maybe_save(step, st)
    return losses


def params(st: dict[str, Any]) -> list[torch.Tensor]:
    return [p.detach().clone() for p in st["model"].parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def context(run_dir: Path, *, env_extra: dict[str, str] | None = None, **settings: Any) -> WorkerContext:
    env = {f"TITAN_CHECKPOINT_{k.upper()}": str(v) for k, v in settings.items()}
    env.update(env_extra or {})
    env.setdefault("TITAN_CHECKPOINT_SAVE_ON_SIGTERM", "false")
    # The disk path is what these tests are about; the per-step in-memory tier (on by
    # default) is tested where it is asked for, in a folder of the test's own.
    env.setdefault("TITAN_CHECKPOINT_SNAPSHOT_EVERY_STEPS", "0")
    env.setdefault("TITAN_CHECKPOINT_SNAPSHOT_DIR", str(Path(run_dir).parent / f"{Path(run_dir).name}.shm"))
    return WorkerContext.from_env(load_settings(env=env), run_dir=run_dir, env={})


def events(run_dir: Path, kind: str) -> list[Any]:
    from titan.events import read_run

    return [e for e in read_run(run_dir).events if e.kind == kind]
