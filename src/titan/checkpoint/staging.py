"""Copy a state dict into CPU buffers that are reused from one save to the next.

The copy is the only part of an async save the training loop waits for. Buffers are
keyed by their path in the state dict and reused while shape and dtype match, so only
the first save pays for allocating (and page-faulting) them. Pinned when CUDA is present
(faster device-to-host copies); non-tensor leaves are deep-copied (they are small).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

__all__ = ["Stager"]


class Stager:
    """Reusable staging area; not thread-safe (one save in flight at a time)."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self.allocated_bytes = 0

    def stage(self, sd: Any) -> Any:
        """Return a copy of ``sd`` whose tensors live in this stager's buffers.

        Cost: one memcpy of every tensor (plus a device sync when tensors are on a GPU).
        """
        seen: set[str] = set()
        out = self._copy(sd, "", seen)
        for k in set(self._buffers) - seen:  # keys that disappeared: free their buffers
            self.allocated_bytes -= self._buffers.pop(k).nbytes
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return out

    def _copy(self, obj: Any, path: str, seen: set[str]) -> Any:
        if hasattr(obj, "to_local") and hasattr(obj, "device_mesh"):
            # A DTensor (FSDP2): stage this rank's shard and wrap it again, so DCP still sees
            # the global shape and placement (copying into a plain tensor raises "mixed
            # torch.Tensor and DTensor").
            from torch.distributed.tensor import DTensor

            local = self._copy(obj.to_local(), path, seen)
            return DTensor.from_local(local, obj.device_mesh, obj.placements, run_check=False,
                                      shape=obj.shape, stride=obj.stride())
        if isinstance(obj, torch.Tensor):
            seen.add(path)
            buf = self._buffers.get(path)
            src = obj.detach()
            if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
                if buf is not None:
                    self.allocated_bytes -= buf.nbytes
                buf = torch.empty(src.shape, dtype=src.dtype, device="cpu",
                                  pin_memory=torch.cuda.is_available())
                self._buffers[path] = buf
                self.allocated_bytes += buf.nbytes
            buf.copy_(src, non_blocking=src.is_cuda)
            return buf
        if isinstance(obj, dict):
            return {k: self._copy(v, f"{path}/{k}", seen) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            items = [self._copy(v, f"{path}/{i}", seen) for i, v in enumerate(obj)]
            return type(obj)(items) if isinstance(obj, list) else tuple(items)
        return copy.deepcopy(obj)

    def close(self) -> None:
        self._buffers.clear()
        self.allocated_bytes = 0
