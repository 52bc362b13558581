"""Reader side of beacons (used by the watchdog): snapshot files without locks.

A read is one ``pread`` of the whole file (12 KB); a seqlock retry makes sure the phase
fields are not torn. Never raises for a vanished or half-written file.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from titan.beacon import layout as L

__all__ = ["read_beacon", "scan_beacons", "request_dump"]


def read_beacon(path: str | os.PathLike[str]) -> L.BeaconSnapshot | None:
    """Snapshot of one beacon file, or ``None`` when it is absent or not a beacon."""
    for _ in range(5):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            buf = os.pread(fd, L.SIZE, 0)
        except OSError:
            return None
        finally:
            os.close(fd)
        if len(buf) < L.SIZE:
            return None
        gen = struct.unpack_from("<q", buf, L.F.GEN)[0]
        if gen % 2 == 0:
            return L.decode(buf, str(path))
    return L.decode(buf, str(path))


def scan_beacons(folder: str | os.PathLike[str]) -> list[L.BeaconSnapshot]:
    """Snapshots of every ``*.bcn`` file in ``folder`` (sorted by rank)."""
    d = Path(folder)
    if not d.is_dir():
        return []
    out = [s for p in sorted(d.glob("*.bcn")) if (s := read_beacon(p)) is not None]
    return sorted(out, key=lambda s: (s.attempt, s.rank))


def request_dump(path: str | os.PathLike[str]) -> int:
    """Ask the worker's helper thread for a stack + flight-recorder dump; returns the request id.

    Writes one 8-byte counter into the beacon file (the only field a reader writes).
    """
    fd = os.open(path, os.O_RDWR)
    try:
        cur = struct.unpack("<q", os.pread(fd, 8, L.F.DUMP_REQ))[0]
        os.pwrite(fd, struct.pack("<q", cur + 1), L.F.DUMP_REQ)
        return cur + 1
    finally:
        os.close(fd)
