"""The sockets a process tree listens on, read from /proc (no ``ss`` needed)."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Listener:
    pid: int
    cmd: str
    proto: str
    addr: str
    port: int

    def __str__(self) -> str:
        return f"{self.proto} {self.addr}:{self.port} pid {self.pid} ({self.cmd})"


def process_tree(root: int) -> set[int]:
    """``root`` and all its descendants now alive."""
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text()
                parents[int(d.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, grew = {root}, True
    while grew:
        new = {p for p, pp in parents.items() if pp in tree and p not in tree}
        tree |= new
        grew = bool(new)
    return tree


def _addr(hexaddr: str) -> str:
    if len(hexaddr) == 8:
        return str(ipaddress.IPv4Address(bytes.fromhex(hexaddr)[::-1]))
    raw = bytes.fromhex(hexaddr)
    return str(ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))))


def listening(pids: set[int]) -> list[Listener]:
    """TCP sockets in LISTEN and unconnected UDP sockets owned by ``pids``."""
    owner: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                m = re.match(r"socket:\[(\d+)\]", os.readlink(f"/proc/{pid}/fd/{fd}"))
                if m:
                    owner[m.group(1)] = pid
        except OSError:
            continue
    out: list[Listener] = []
    seen: set[str] = set()
    for pid in sorted(set(owner.values())):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:300]
        except OSError:
            cmd = "?"
        for proto in ("tcp", "tcp6", "udp", "udp6"):
            try:
                lines = Path(f"/proc/{pid}/net/{proto}").read_text().splitlines()[1:]
            except OSError:
                continue
            for ln in lines:
                f = ln.split()
                local, remote, state, inode = f[1], f[2], f[3], f[9]
                if owner.get(inode) != pid or inode in seen:
                    continue
                listens = state == "0A" if proto.startswith("tcp") else int(remote.split(":")[1], 16) == 0
                if listens:
                    seen.add(inode)
                    a, p = local.split(":")
                    out.append(Listener(pid, cmd, proto, _addr(a), int(p, 16)))
    return out


def kill_tree(root: int) -> None:
    """SIGKILL ``root`` and every descendant (the node agent runs in its own session)."""
    import signal

    for pid in sorted(process_tree(root), reverse=True):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
