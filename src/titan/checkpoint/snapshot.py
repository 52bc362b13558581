"""In-memory snapshots in ``/dev/shm``: double-buffered files with checksum and marker.

Each rank keeps two slots under ``<snapshot_dir>/<run id>/rank<r>/``. A save overwrites
the slot *not* holding the newest valid snapshot: delete its marker, write the data
(``torch.save``, CRC-32 computed while writing), then write the marker (step, world size,
size, CRC) by atomic replace. A slot counts only with a marker whose size and CRC match,
so a worker killed mid-write leaves the other slot intact. Files, not
``multiprocessing.shared_memory``: Python 3.11 unlinks a segment when its creator is
SIGKILLed (checked), which is exactly when the snapshot is needed. Files in tmpfs survive
the process and are lost with the node (or a reboot); memory cost = 2 × this rank's state.
Loading uses ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import logging
import os
import hashlib
import shutil
import zlib
from pathlib import Path
from typing import Any

import torch

__all__ = ["SnapshotStore", "shm_space"]

log = logging.getLogger(__name__)


def snapshot_key(run_dir: Path, run_id: str, started_at: object) -> str:
    """The folder name of a run's snapshots: run id, run directory and launch time, so that
    a run id reused elsewhere (tests, a copied or re-created run) never restores another
    job's snapshot, while every restart of one ``titan run`` finds them."""
    where = hashlib.sha1(f"{Path(run_dir).resolve()}|{started_at}".encode()).hexdigest()[:10]
    return f"{run_id}-{where}"


def discard_run_snapshots(base: Path, run_dir: Path, run_id: str, started_at: object) -> bool:
    """Delete every rank's snapshots of one run on this node (the launcher, at the end)."""
    d = Path(base) / snapshot_key(run_dir, run_id, started_at)
    existed = d.exists()
    shutil.rmtree(d, ignore_errors=True)
    return existed


def shm_space(path: Path) -> dict[str, int]:
    """Total and free bytes of the file system holding ``path`` (its nearest existing parent)."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    st = os.statvfs(p)
    return {"total_bytes": st.f_blocks * st.f_frsize, "free_bytes": st.f_bavail * st.f_frsize}


class _CrcFile:
    def __init__(self, f: Any) -> None:
        self.f, self.crc, self.size = f, 0, 0

    def write(self, b: Any) -> int:
        mv = memoryview(b).cast("B")
        self.f.write(mv)
        self.crc = zlib.crc32(mv, self.crc)
        self.size += len(mv)
        return len(mv)

    def flush(self) -> None:
        self.f.flush()


class SnapshotStore:
    """This rank's two snapshot slots."""

    def __init__(self, base: Path, run_id: str, rank: int, world: int) -> None:
        self.dir = Path(base) / run_id / f"rank{rank}"
        self.rank, self.world = rank, world

    def report(self, events: Any) -> dict[str, int]:
        """Emit ``ckpt.snapshot_space`` with the tmpfs size (Docker's default /dev/shm is 64 MB)."""
        space = shm_space(self.dir)
        events.emit("ckpt.snapshot_space", f"snapshot dir {self.dir.parent}: "
                    f"{space['free_bytes'] / 2**20:.0f} MiB free of {space['total_bytes'] / 2**20:.0f} MiB",
                    data={"dir": str(self.dir), **space})
        return space

    def _marker(self, slot: int) -> Path:
        return self.dir / f"slot{slot}.json"

    def _data(self, slot: int) -> Path:
        return self.dir / f"slot{slot}.pt"

    def _read_marker(self, slot: int) -> dict[str, Any] | None:
        try:
            m = json.loads(self._marker(slot).read_text())
        except (OSError, ValueError):
            return None
        return m if isinstance(m, dict) and m.get("world") == self.world else None

    def _slot_valid(self, slot: int) -> dict[str, Any] | None:
        m = self._read_marker(slot)
        if m is None:
            return None
        try:
            data = self._data(slot).read_bytes()
        except OSError:
            return None
        if len(data) != m.get("size") or zlib.crc32(data) != m.get("crc32"):
            log.warning("snapshot slot %d of rank %d fails its checksum; ignored", slot, self.rank)
            return None
        return m

    def valid_steps(self) -> list[int]:
        """Steps held by valid slots (cost: one CRC pass over each slot, memory speed)."""
        return sorted(m["step"] for s in (0, 1) if (m := self._slot_valid(s)) is not None)

    def save(self, step: int, sd: Any) -> int:
        """Write ``sd`` as the snapshot of ``step``; returns bytes written. Raises ``OSError``."""
        self.dir.mkdir(parents=True, exist_ok=True)
        markers = {s: self._read_marker(s) for s in (0, 1)}
        newest = max((s for s in (0, 1) if markers[s]), key=lambda s: markers[s]["step"], default=None)
        slot = 0 if newest is None or newest == 1 else 1
        self._marker(slot).unlink(missing_ok=True)
        try:
            with open(self._data(slot), "wb") as f:
                w = _CrcFile(f)
                torch.save(sd, w)  # type: ignore[arg-type]
                f.flush()
        except OSError:
            self._data(slot).unlink(missing_ok=True)  # give the space back
            raise
        tmp = self._marker(slot).with_suffix(".tmp")
        tmp.write_text(json.dumps({"step": step, "world": self.world, "size": w.size, "crc32": w.crc}))
        os.replace(tmp, self._marker(slot))
        return w.size

    def load(self, step: int) -> Any:
        """The state dict of the valid slot holding ``step``; raises ``FileNotFoundError``."""
        for s in (0, 1):
            m = self._slot_valid(s)
            if m is not None and m["step"] == step:
                return torch.load(self._data(s), weights_only=True)
        raise FileNotFoundError(f"no valid snapshot of step {step} for rank {self.rank} in {self.dir}")

    def remove(self) -> None:
        """Delete this rank's snapshots (e.g. after the job finished)."""
        shutil.rmtree(self.dir, ignore_errors=True)
        try:
            self.dir.parent.rmdir()  # the run's folder, once its last rank is gone
        except OSError:
            pass
