"""Disk collector: per-device latency, IOPS, throughput and errors; free space of checkpoints.

Latency is the kernel's own accounting from ``/proc/diskstats``: milliseconds spent on
reads divided by reads completed over the tick (what ``iostat`` calls ``r_await``).
Error counts come from ``/sys/block/<dev>/device/ioerr_cnt`` where the driver offers it
(SCSI). Free space is ``statvfs`` of the checkpoint folder (or its nearest existing
parent). Cost: one small file read plus one ``statvfs`` per tick.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from titan.monitor.base import ProcFS, RateTracker, Reading, metric_key, unavailable

__all__ = ["DiskCollector"]

_SKIP = re.compile(r"^(loop|ram|zram|sr|fd)\d*")
_SECTOR = 512


class DiskCollector:
    """Per-device I/O figures since the previous tick, plus free space under ``watch_path``."""

    name = "disk"

    def __init__(self, proc: ProcFS | None = None, *, watch_path: str | os.PathLike[str] | None = None) -> None:
        self.proc = proc or ProcFS("/")
        self.watch_path = Path(watch_path) if watch_path else None
        self._rates = RateTracker()
        self._prev: dict[str, tuple[float, list[int]]] = {}

    def collect(self, now: float) -> Reading:
        r = Reading(self.name)
        text = self.proc.read("/proc/diskstats")
        if text is None:
            r.status = unavailable("/proc/diskstats is not readable")
        else:
            self._diskstats(text, now, r)
        self._free(r)
        return r

    def _is_whole_disk(self, name: str) -> bool:
        sys_block = self.proc.path("/sys/block")
        if sys_block.is_dir():
            return (sys_block / name).exists()
        return not re.search(r"\d$", name) or name.startswith(("nvme", "mmcblk")) and "p" not in name[4:]

    def _diskstats(self, text: str, now: float, r: Reading) -> None:
        devices = []
        for line in text.splitlines():
            f = line.split()
            if len(f) < 14:
                continue
            name = f[2]
            if _SKIP.match(name) or not self._is_whole_disk(name):
                continue
            vals = [int(x) for x in f[3:14]]
            if not any(vals):
                continue
            devices.append(name)
            prev = self._prev.get(name)
            self._prev[name] = (now, vals)
            err = self.proc.read(f"/sys/block/{name}/device/ioerr_cnt")
            if err is not None:
                try:
                    r.metrics[metric_key("disk_io_errors_total", device=name)] = float(int(err.strip(), 0))
                except ValueError:
                    pass
            if prev is None:
                continue
            dt = now - prev[0]
            d = [a - b for a, b in zip(vals, prev[1])]
            if dt <= 0 or min(d[:8]) < 0:
                continue
            reads, _rm, rsec, rms, writes, _wm, wsec, wms, _inflight, io_ms, _wio = d
            r.metrics[metric_key("disk_reads_per_second", device=name)] = reads / dt
            r.metrics[metric_key("disk_writes_per_second", device=name)] = writes / dt
            r.metrics[metric_key("disk_read_bytes_per_second", device=name)] = rsec * _SECTOR / dt
            r.metrics[metric_key("disk_written_bytes_per_second", device=name)] = wsec * _SECTOR / dt
            r.metrics[metric_key("disk_busy_ratio", device=name)] = min(1.0, max(0.0, io_ms / 1000.0 / dt))
            if reads > 0:
                r.metrics[metric_key("disk_read_latency_seconds", device=name)] = rms / reads / 1000.0
            if writes > 0:
                r.metrics[metric_key("disk_write_latency_seconds", device=name)] = wms / writes / 1000.0
            r.metrics[metric_key("disk_in_flight_requests", device=name)] = float(vals[8])
        r.info["devices"] = devices

    def _free(self, r: Reading) -> None:
        if self.watch_path is None:
            return
        p = self.watch_path
        while not p.exists() and p != p.parent:
            p = p.parent
        try:
            st = os.statvfs(p)
        except OSError as e:
            r.info["free_space"] = unavailable(f"statvfs({p}) failed: {e.strerror}")
            return
        path = str(self.watch_path)
        r.metrics[metric_key("disk_free_bytes", path=path)] = float(st.f_bavail * st.f_frsize)
        r.metrics[metric_key("disk_size_bytes", path=path)] = float(st.f_blocks * st.f_frsize)
        if st.f_blocks:
            r.metrics[metric_key("disk_free_ratio", path=path)] = st.f_bavail / st.f_blocks

    def close(self) -> None:
        pass
