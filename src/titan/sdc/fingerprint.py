"""Per-tensor fingerprints of a replica's state: parameters, buffers, optimizer state.

Two methods (``sdc.hash``): xxHash3-64 of the raw bytes (CPU; zero-copy through numpy) and a
position-weighted integer checksum computed on the tensor's device (CUDA: 8 bytes per
tensor cross to the host, not the state). Both change for any single flipped bit: the
checksum adds ``±2^k · (2i+1)`` mod 2^64 for a flip of bit ``k`` of element ``i``, never 0.
"""

from __future__ import annotations

import hashlib
from typing import Iterator

import torch
from torch import nn

__all__ = ["named_state", "tensor_fingerprint", "state_fingerprints", "digest", "pick_method"]

_CHUNK = 1 << 20
_WEIGHTS: dict[torch.device, torch.Tensor] = {}


def pick_method(requested: str, device: torch.device) -> str:
    if requested != "auto":
        return requested
    if device.type == "cpu":
        try:
            import xxhash  # noqa: F401

            return "xxhash"
        except ImportError:
            return "checksum"
    return "checksum"


def named_state(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor replicas must hold bit-identically, with a stable name (model order)."""
    names = {}
    for name, p in model.named_parameters():
        clean = name.replace("module.", "", 1) if name.startswith("module.") else name
        names[id(p)] = clean
        yield f"param.{clean}", p.detach()
    for name, b in model.named_buffers():
        yield f"buffer.{name}", b.detach()
    if optimizer is not None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                st = optimizer.state.get(p, {})
                for key in sorted(st):
                    v = st[key]
                    if isinstance(v, torch.Tensor):
                        yield f"optim.{names.get(id(p), '?')}.{key}", v.detach()


def _int_view(t: torch.Tensor) -> torch.Tensor:
    flat = t.contiguous().reshape(-1)
    size = flat.element_size()
    if size == 8:
        return flat.view(torch.int64)
    if size == 4:
        return flat.view(torch.int32)
    if size == 2:
        return flat.view(torch.int16)
    return flat.view(torch.uint8)


def _checksum(t: torch.Tensor) -> int:
    v = _int_view(t)
    w = _WEIGHTS.get(v.device)
    if w is None:
        w = _WEIGHTS[v.device] = torch.arange(_CHUNK, dtype=torch.int64, device=v.device) * 2 + 1
    acc = torch.zeros((), dtype=torch.int64, device=v.device)
    for i in range(0, v.numel(), _CHUNK):
        c = v[i:i + _CHUNK].to(torch.int64)
        # sum((base + j)·2 + 1)·x = sum((2j+1)·x) + 2·base·sum(x); int64 arithmetic wraps.
        acc += (c * w[: c.numel()]).sum() + 2 * i * c.sum()
    return int(acc.item()) & 0xFFFFFFFFFFFFFFFF


def tensor_fingerprint(t: torch.Tensor, method: str) -> int:
    """A 64-bit fingerprint of ``t``'s bytes (dtype and shape folded in)."""
    # Not hash(): str hashing is salted per process, and replicas must agree.
    head = int.from_bytes(hashlib.blake2b(f"{t.dtype}{tuple(t.shape)}".encode(), digest_size=2).digest(), "little")
    if method == "xxhash" and t.device.type == "cpu":
        import xxhash

        data = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        return xxhash.xxh3_64_intdigest(data, seed=head)
    return (_checksum(t) ^ head) & 0xFFFFFFFFFFFFFFFF


def state_fingerprints(model: nn.Module, optimizer: torch.optim.Optimizer | None, method: str) -> tuple[list[str], list[int]]:
    """Names and fingerprints of every replicated tensor. Cost: one read of the state."""
    names, fps = [], []
    for name, t in named_state(model, optimizer):
        names.append(name)
        fps.append(tensor_fingerprint(t, method))
    return names, fps


def digest(fps: list[int]) -> int:
    """One signed 64-bit digest of a fingerprint list (fits an int64 tensor)."""
    h = hashlib.blake2b(b"".join(f.to_bytes(8, "little") for f in fps), digest_size=8).digest()
    return int.from_bytes(h, "little", signed=True)


def as_signed(x: int) -> int:
    return x - (1 << 64) if x >= (1 << 63) else x


