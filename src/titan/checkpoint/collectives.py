"""Small collectives that carry JSON and bytes as uint8 tensors: nothing received is unpickled.

``torch.distributed``'s ``*_object`` collectives pickle; what the node-local commit and
restore exchange (inventories, manifests, DCP's ``.metadata``) goes through these instead:
JSON text or raw bytes, padded to the longest contribution. All are collectives on
``group`` (``None``: the default group); with no process group they return the local value.
Cost: two all-gathers (lengths, then the padded bytes) or two broadcasts.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["gather_json", "broadcast_bytes", "broadcast_json", "world_of"]


def world_of(group: Any) -> int:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


def _gather_bytes(data: bytes, group: Any) -> list[bytes]:
    import torch
    import torch.distributed as dist

    n = world_of(group)
    if n == 1:
        return [data]
    size = torch.tensor([len(data)], dtype=torch.int64)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(sizes, size, group=group)
    longest = max(int(s.item()) for s in sizes)
    buf = torch.zeros(max(longest, 1), dtype=torch.uint8)
    if data:
        buf[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    outs = [torch.zeros(max(longest, 1), dtype=torch.uint8) for _ in range(n)]
    dist.all_gather(outs, buf, group=group)
    return [bytes(o[:int(s.item())].numpy().tobytes()) for o, s in zip(outs, sizes)]


def gather_json(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's ``obj`` (JSON-serialisable), in rank order of ``group``."""
    raw = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()
    return [json.loads(b) for b in _gather_bytes(raw, group)]


def broadcast_bytes(data: bytes | None, src: int = 0, group: Any = None) -> bytes:
    """``data`` of rank ``src`` (a global rank) on every rank of ``group``."""
    import torch
    import torch.distributed as dist

    if world_of(group) == 1:
        return data or b""
    is_src = dist.get_rank() == src
    size = torch.tensor([len(data or b"") if is_src else 0], dtype=torch.int64)
    dist.broadcast(size, src=src, group=group)
    n = int(size.item())
    buf = torch.zeros(max(n, 1), dtype=torch.uint8)
    if is_src and n:
        buf[:n] = torch.frombuffer(bytearray(data or b""), dtype=torch.uint8)
    dist.broadcast(buf, src=src, group=group)
    return bytes(buf[:n].numpy().tobytes())


def broadcast_json(obj: Any, src: int = 0, group: Any = None) -> Any:
    """``obj`` of rank ``src`` on every rank (JSON-serialisable)."""
    import torch.distributed as dist

    is_src = world_of(group) == 1 or dist.get_rank() == src
    raw = json.dumps(obj, separators=(",", ":"), sort_keys=True).encode() if is_src else None
    return json.loads(broadcast_bytes(raw, src, group))
