"""Capture and restore every RNG a forward/backward may draw from, for an identical replay.

Cost: a copy of the CPU generator state (~5 KB) and, on a GPU, of each CUDA generator's
seed/offset (host-side, no device sync). Python's ``random`` and numpy's global generator
are included when numpy is already imported (a data pipeline may draw from them inside
the step).
"""

from __future__ import annotations

import random
import sys
from typing import Any

import torch

__all__ = ["capture_rng", "restore_rng"]


def capture_rng() -> dict[str, Any]:
    """Return a snapshot of the torch CPU/CUDA, Python and (if loaded) numpy generators."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    np = sys.modules.get("numpy")
    if np is not None:
        state["numpy"] = np.random.get_state()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put every generator back to ``state`` (from :func:`capture_rng`)."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        sys.modules["numpy"].random.set_state(state["numpy"])
