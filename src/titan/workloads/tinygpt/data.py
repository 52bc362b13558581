"""A deterministic, learnable synthetic corpus: samples drawn from a random sparse Markov chain.

Every token has ``branching`` possible successors with random (skewed) probabilities, so
the best achievable loss is about ``entropy_nats()`` (~1 nat) against ``ln(vocab)`` for
an untrained model (5.5 nats at vocab 256): the loss visibly falls within ~100 steps.
The whole corpus is generated from ``seed`` with a private ``torch.Generator`` (the
global RNG is untouched) and is identical on every rank and every run.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import Dataset

from titan.data import ResumableSampler

__all__ = ["MarkovCorpus", "ResumableSampler"]


class MarkovCorpus(Dataset):
    """``num_samples`` sequences of ``seq_len + 1`` tokens; item i is ``(x, y)``, y = x shifted.

    Cost: generated once in memory, ``num_samples x (seq_len + 1)`` int64
    (4096 x 65 x 8 B = 2 MB for the tiny preset); O(num_samples x seq_len) to build.
    """

    def __init__(self, vocab_size: int, seq_len: int, *, num_samples: int = 4096, seed: int = 0,
                 branching: int = 4) -> None:
        if vocab_size < 2 or seq_len < 1 or num_samples < 1 or not 1 <= branching <= vocab_size:
            raise ValueError("need vocab_size >= 2, seq_len >= 1, num_samples >= 1, 1 <= branching <= vocab_size")
        g = torch.Generator().manual_seed(seed)
        self.vocab_size, self.seq_len, self.seed = vocab_size, seq_len, seed
        self.successors = torch.randint(vocab_size, (vocab_size, branching), generator=g)
        # Squaring uniform weights skews them, so each state has a few likely successors.
        w = torch.rand(vocab_size, branching, generator=g, dtype=torch.float64) ** 2 + 1e-3
        self.probs = w / w.sum(dim=1, keepdim=True)
        cum = self.probs.cumsum(dim=1)
        tokens = torch.empty(num_samples, seq_len + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(vocab_size, (num_samples,), generator=g)
        for t in range(seq_len):
            cur = tokens[:, t]
            u = torch.rand(num_samples, 1, generator=g, dtype=torch.float64)
            # Inverse-CDF sampling: exact and deterministic (no multinomial kernel).
            choice = (u > cum[cur]).sum(dim=1).clamp_(max=branching - 1)
            tokens[:, t + 1] = self.successors[cur, choice]
        self.tokens = tokens

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = self.tokens[i]
        return row[:-1], row[1:]

    def entropy_nats(self) -> float:
        """Mean entropy of the successor distributions: roughly the best reachable loss
        (an upper bound on the chain's true conditional entropy when successors repeat)."""
        p = self.probs
        return float(-(p * p.log()).sum(dim=1).mean())

    def uniform_nats(self) -> float:
        """Loss of a model that predicts uniformly: ``ln(vocab_size)``."""
        return math.log(self.vocab_size)
