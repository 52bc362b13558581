"""A compute canary: a fixed GEMM on seeded inputs whose bits must never change.

Run at start-up to record the rank's reference checksum, then every M steps; a rank whose
checksum changes — or departs from peers with identical hardware and software — computes
wrong answers and is flagged before its gradients do more damage.
"""

from __future__ import annotations

import hashlib
from typing import Callable

import torch

__all__ = ["GemmCanary"]


class GemmCanary:
    """``size``×``size`` float32 product on ``device``; ``checksum()`` returns a signed int64."""

    def __init__(self, device: torch.device, size: int = 128, seed: int = 20261130,
                 perturbed: Callable[[], bool] | None = None) -> None:
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.a = torch.randn(size, size, generator=g).to(device)
        self.b = torch.randn(size, size, generator=g).to(device)
        self._perturbed = perturbed or (lambda: False)
        self.reference = self.checksum()

    def checksum(self) -> int:
        """Cost: one small GEMM and a device→host copy of 64 KiB (at size 128)."""
        c = self.a @ self.b
        if self._perturbed():  # fault injection: a unit that now computes one wrong element
            c[3, 5] += 1e-3
        h = hashlib.blake2b(c.cpu().numpy().tobytes(), digest_size=8).digest()
        return int.from_bytes(h, "little", signed=True)
