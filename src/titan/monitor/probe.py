"""Active UDP echo probe between the agents of one job: round-trip time and loss.

Each agent binds one UDP socket and announces ``{node, host, port}`` in
``<run_dir>/metrics/probe.<node>.json`` (rewritten atomically every ``refresh_s``, so a
file older than ``stale_s`` is a dead peer). Every tick it sends one 24-byte ping to each
peer; a helper thread answers pings and matches pongs. A ping unanswered after
``timeout_s`` counts as lost. Cost per tick: one ``sendto`` per peer.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

from titan.events import atomic_write_json
from titan.monitor.base import metric_key

__all__ = ["EchoProbe", "default_probe_host"]

log = logging.getLogger(__name__)

_PING, _PONG = b"TP", b"TR"
_FMT = struct.Struct("!2sQd")  # magic, sequence number, sender's monotonic send time


def default_probe_host() -> str:
    """This host's address as its peers see it.

    The hostname's address, unless that is loopback (Debian maps the hostname to
    127.0.1.1): then the source address of the default route (a UDP ``connect`` sends
    nothing), else 127.0.0.1. Set ``agent.probe_host`` when nodes talk over another network.
    """
    try:
        addr = socket.gethostbyname(socket.gethostname())
    except OSError:
        addr = "127.0.0.1"
    if not addr.startswith("127."):
        return addr
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed anywhere real
            return s.getsockname()[0]
    except OSError:
        return addr


class EchoProbe:
    """Probe the other agents found in ``metrics_dir``; see the module docstring."""

    def __init__(self, metrics_dir: str | os.PathLike[str], node: str, *, host: str = "",
                 port: int = 0, timeout_s: float = 1.0, window: int = 300, min_probes: int = 100,
                 refresh_s: float = 10.0, stale_s: float = 60.0) -> None:
        self.dir = Path(metrics_dir)
        self.node = node
        self.host = host or default_probe_host()
        self.timeout_s = timeout_s
        self.window = window
        self.min_probes = min_probes
        self.refresh_s = refresh_s
        self.stale_s = stale_s
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((self.host, port))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self._lock = threading.Lock()
        self._peers: dict[str, tuple[str, int]] = {}
        self._seq = 0
        self._outstanding: dict[int, tuple[str, float]] = {}
        self._rtts: dict[str, list[float]] = collections.defaultdict(list)
        self._outcomes: dict[str, collections.deque[bool]] = {}
        self._sent: dict[str, int] = collections.defaultdict(int)
        self._lost: dict[str, int] = collections.defaultdict(int)
        self._last_refresh = -1e18
        self._closed = False
        self._announce()
        self._thread = threading.Thread(target=self._serve, name="titan-probe", daemon=True)
        self._thread.start()

    @property
    def announce_file(self) -> Path:
        return self.dir / f"probe.{self.node}.json"

    def _announce(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.announce_file, {"node": self.node, "host": self.host, "port": self.port,
                                               "pid": os.getpid(), "t": time.time()})

    def _refresh_peers(self) -> None:
        peers = {}
        now = time.time()
        for f in self.dir.glob("probe.*.json"):
            try:
                obj = json.loads(f.read_text())
                if obj["node"] == self.node or now - float(obj["t"]) > self.stale_s:
                    continue
                peers[str(obj["node"])] = (str(obj["host"]), int(obj["port"]))
            except (OSError, ValueError, KeyError, TypeError):
                continue
        with self._lock:
            self._peers = peers

    def tick(self, now: float) -> None:
        """Expire old pings, re-read peers every ``refresh_s``, send one ping to each peer."""
        mono = time.monotonic()
        if mono - self._last_refresh >= self.refresh_s:
            self._last_refresh = mono
            self._announce()
            self._refresh_peers()
        with self._lock:
            for seq, (peer, sent) in list(self._outstanding.items()):
                if mono - sent > self.timeout_s:
                    del self._outstanding[seq]
                    self._record(peer, False)
            peers = dict(self._peers)
        for peer, addr in peers.items():
            with self._lock:
                self._seq += 1
                seq = self._seq
                self._outstanding[seq] = (peer, time.monotonic())
                self._sent[peer] += 1
            try:
                self.sock.sendto(_FMT.pack(_PING, seq, time.monotonic()), addr)
            except OSError as e:
                log.debug("probe to %s %s failed: %s", peer, addr, e)

    def _record(self, peer: str, ok: bool) -> None:
        dq = self._outcomes.setdefault(peer, collections.deque(maxlen=self.window))
        dq.append(ok)
        if not ok:
            self._lost[peer] += 1

    def _serve(self) -> None:
        while not self._closed:
            try:
                data, addr = self.sock.recvfrom(64)
            except socket.timeout:
                continue
            except OSError:
                if self._closed:
                    return
                continue
            if len(data) != _FMT.size:
                continue
            magic, seq, sent = _FMT.unpack(data)
            if magic == _PING:
                try:
                    self.sock.sendto(_FMT.pack(_PONG, seq, sent), addr)
                except OSError:
                    pass
            elif magic == _PONG:
                rtt = time.monotonic() - sent
                with self._lock:
                    entry = self._outstanding.pop(seq, None)
                    if entry is not None:
                        self._rtts[entry[0]].append(rtt)
                        self._record(entry[0], True)

    def metrics(self, now: float) -> dict[str, float]:
        """RTT (mean of the pongs since the last call), loss over the window, counters."""
        out: dict[str, float] = {}
        with self._lock:
            for peer in set(self._peers) | set(self._outcomes):
                rtts = self._rtts.pop(peer, [])
                if rtts:
                    out[metric_key("net_probe_rtt_seconds", peer=peer)] = sum(rtts) / len(rtts)
                dq = self._outcomes.get(peer)
                if dq is not None and len(dq) >= self.min_probes:
                    out[metric_key("net_probe_loss_ratio", peer=peer)] = 1.0 - sum(dq) / len(dq)
                out[metric_key("net_probe_sent_total", peer=peer)] = float(self._sent[peer])
                out[metric_key("net_probe_lost_total", peer=peer)] = float(self._lost[peer])
        return out

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {"listen": f"{self.host}:{self.port}", "peers": sorted(self._peers)}

    def close(self) -> None:
        self._closed = True
        try:
            self.sock.close()
        except OSError:
            pass
        self._thread.join(1.0)
        try:
            self.announce_file.unlink()
        except OSError:
            pass
