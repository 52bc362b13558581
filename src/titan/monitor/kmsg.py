"""Kernel-log watcher: Xid (NVRM), machine checks, EDAC, PCIe AER, link down/up, OOM kills.

Reads ``/dev/kmsg`` without blocking (one record per ``read``; starts at the end so old
boot messages are not re-reported), or follows ``journalctl -k`` when ``/dev/kmsg`` is
not readable, or reports ``unavailable: <reason>``. Each matching line becomes a
``Finding``; ``kmsg_lines_total{category}`` counts them. Cost per tick: a few
non-blocking ``read`` calls returning EAGAIN.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Mapping

from titan.monitor.base import Finding, Reading, metric_key, unavailable
from titan.monitor.xid import parse_xid_line, xid_info

__all__ = ["KmsgCollector", "classify_line"]

log = logging.getLogger(__name__)

_PATTERNS: list[tuple[str, str, re.Pattern[str]]] = [
    ("gpu_lost", "critical", re.compile(r"NVRM: .*(has fallen off the bus|GPU is lost)")),
    ("mce", "error", re.compile(r"mce: \[Hardware Error\]|Machine check events logged|Machine Check Exception", re.I)),
    ("edac", "error", re.compile(r"EDAC (?:MC\d+|\w+): .*?\b\d+ (?:UE|CE)\b|EDAC .*(?:error|Error)")),
    ("pcie_aer", "warning", re.compile(r"AER: .*(?:Uncorrect|Correct)(?:ed|able) error", re.I)),
    ("oom", "error", re.compile(r"Out of memory: Killed process|oom-kill:|Memory cgroup out of memory")),
    ("link", "warning", re.compile(r"(?i)\blink (?:is )?(?:down|up)\b|\bNIC Link is (?:Down|Up)")),
    ("nvlink", "error", re.compile(r"NVRM: .*NVLink.*(?:error|fatal|down)", re.I)),
]
_OOM_RE = re.compile(r"Killed process (?P<pid>\d+) \((?P<name>[^)]+)\)|task=(?P<task>[^,]+),pid=(?P<pid2>\d+)")
_EDAC_RE = re.compile(r"\b(?P<n>\d+) (?P<kind>UE|CE)\b")


def classify_line(line: str, xid_actions: Mapping[str, str] | None = None) -> Finding | None:
    """The ``Finding`` for one kernel log line, or None when it is not of interest."""
    xid = parse_xid_line(line)
    if xid is not None:
        code, pci, rest = xid
        info = xid_info(code, xid_actions)
        return Finding("xid", f"Xid {code} ({info.description}) on PCI {pci}: {rest}".rstrip(": "),
                       info.level, {"code": code, "pci": pci, "action": info.action, "bucket": info.bucket,
                                    "source": "kmsg", "line": line})
    for cat, level, rx in _PATTERNS:
        if not rx.search(line):
            continue
        data: dict[str, object] = {"line": line}
        if cat == "oom":
            m = _OOM_RE.search(line)
            if m:
                data["pid"] = int(m["pid"] or m["pid2"])
                data["process"] = m["name"] or m["task"]
        elif cat == "edac":
            m = _EDAC_RE.search(line)
            if m:
                data.update(count=int(m["n"]), kind=m["kind"])
                level = "critical" if m["kind"] == "UE" else "warning"
        elif cat == "link":
            data["state"] = "down" if re.search(r"(?i)\bdown\b", line) else "up"
            level = "warning" if data["state"] == "down" else "info"
        return Finding(cat, line.strip(), level, data)
    return None


class KmsgCollector:
    """Follow the kernel log; ``path`` overrides ``/dev/kmsg`` (a recorded file in tests)."""

    name = "kmsg"

    def __init__(self, *, path: str | os.PathLike[str] = "/dev/kmsg", from_start: bool = False,
                 use_journalctl: bool = True, xid_actions: Mapping[str, str] | None = None,
                 max_lines_per_tick: int = 10_000) -> None:
        self.path = Path(path)
        self.xid_actions = dict(xid_actions or {})
        self.max_lines = max_lines_per_tick
        self._fd: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = b""
        self._counts: dict[str, int] = {}
        self._source = ""
        self._status = "ok"
        self._open(from_start, use_journalctl)

    def _open(self, from_start: bool, use_journalctl: bool) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as e:
            kmsg_err = f"{self.path}: {e.strerror}"
        else:
            if not from_start:
                try:
                    os.lseek(fd, 0, os.SEEK_END)
                except OSError:
                    pass
            self._fd = fd
            self._source = str(self.path)
            return
        jc = shutil.which("journalctl") if use_journalctl else None
        if jc is None:
            self._status = unavailable(f"{kmsg_err}; journalctl not found")
            return
        try:
            self._proc = subprocess.Popen([jc, "-k", "-f", "-n", "0", "-o", "cat", "--no-pager"],
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        except OSError as e:
            self._status = unavailable(f"{kmsg_err}; journalctl failed to start: {e.strerror}")
            return
        assert self._proc.stdout is not None
        fl = fcntl.fcntl(self._proc.stdout, fcntl.F_GETFL)
        fcntl.fcntl(self._proc.stdout, fcntl.F_SETFL, fl | os.O_NONBLOCK)
        self._source = "journalctl -k"

    @property
    def source(self) -> str:
        """``/dev/kmsg`` (or the given path), ``journalctl -k``, or "" when unavailable."""
        return self._source

    def read_new_lines(self) -> list[str]:
        """Kernel log lines that arrived since the last call (message text only)."""
        return self._read_lines()

    def _read_lines(self) -> list[str]:
        lines: list[str] = []
        if self._fd is not None:
            while len(lines) < self.max_lines:
                try:
                    chunk = os.read(self._fd, 8192)
                except OSError as e:
                    if e.errno == errno.EPIPE:  # ring buffer overwrote unread records
                        continue
                    if e.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                        log.debug("kmsg read failed: %s", e)
                    break
                if not chunk:
                    break
                self._buf += chunk
                *complete, self._buf = self._buf.split(b"\n")
                for raw in complete:
                    if raw.startswith(b" "):
                        continue  # /dev/kmsg continuation (KEY=value dictionary)
                    text = raw.decode("utf-8", "replace")
                    head, sep, msg = text.partition(";")
                    # "prio,seq,usec,flags;message" from /dev/kmsg; plain lines from a file.
                    lines.append(msg if sep and re.fullmatch(r"\d+,\d+,\d+,[^;]*", head) else text)
        elif self._proc is not None and self._proc.stdout is not None:
            try:
                chunk = self._proc.stdout.read(65536) or b""
            except (BlockingIOError, OSError):
                chunk = b""
            self._buf += chunk
            *complete, self._buf = self._buf.split(b"\n")
            lines = [c.decode("utf-8", "replace") for c in complete]
        return lines

    def collect(self, now: float) -> Reading:
        r = Reading(self.name, status=self._status)
        if self._status != "ok":
            return r
        r.info["source"] = self._source
        if self._proc is not None and self._proc.poll() is not None:
            r.status = unavailable(f"journalctl exited with {self._proc.returncode}")
            return r
        for line in self._read_lines():
            f = classify_line(line, self.xid_actions)
            if f is not None:
                r.findings.append(f)
                self._counts[f.category] = self._counts.get(f.category, 0) + 1
        for cat, n in self._counts.items():
            r.metrics[metric_key("kmsg_lines_total", category=cat)] = float(n)
        return r

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(2)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(2)
            self._proc = None
