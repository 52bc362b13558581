"""Per-rank seeding and the learning-rate schedule."""

from __future__ import annotations

import math
import random
from typing import Callable

import numpy as np
import torch

__all__ = ["rank_seed", "seed_everything", "warmup_cosine"]


def rank_seed(seed: int, rank: int) -> int:
    """A 63-bit seed derived from ``(seed, rank)`` (numpy ``SeedSequence``: well mixed,
    so nearby seeds and ranks give unrelated streams)."""
    return int(np.random.SeedSequence([seed, rank]).generate_state(1, np.uint64)[0] >> 1)


def seed_everything(seed: int, rank: int) -> int:
    """Seed Python, numpy and torch (CPU and every CUDA device) for this rank.

    Dropout then differs across ranks but is reproducible run to run. Returns the seed used.
    """
    s = rank_seed(seed, rank)
    random.seed(s)
    np.random.seed(s % 2**32)
    torch.manual_seed(s)  # also seeds all CUDA devices
    return s


def warmup_cosine(warmup_steps: int, total_steps: int, min_ratio: float = 0.1) -> Callable[[int], float]:
    """LR multiplier for ``LambdaLR``: linear warm-up from 1/warmup to 1, then cosine to ``min_ratio``."""
    def factor(step: int) -> float:
        if warmup_steps > 0 and step < warmup_steps:
            return (step + 1) / warmup_steps
        span = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return factor
