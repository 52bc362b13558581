"""Active UDP echo probe between the agents of one job: round-trip time and loss.

Each agent binds one UDP socket — on the job's listen address (``TITAN_LISTEN_ADDR``, set by
``titan run``), or ``agent.probe_host``, else loopback — and announces ``{node, host, port}``
in ``<run_dir>/metrics/probe.<node>.json`` (rewritten atomically every ``refresh_s``, so a
file older than ``stale_s`` is a dead peer). Every tick it sends one ping to each peer; a
helper thread answers pings and matches pongs. A ping unanswered after ``timeout_s`` counts
as lost; ``net_probe_last_lost_sent_seconds`` is the wall-clock time the newest lost ping
was *sent* — when the loss happened, not when it was counted (``timeout_s`` later, or later
still when the agent fell behind). Cost per tick: one ``sendto`` and one HMAC per peer.

Pings and pongs carry a 16-byte HMAC (``titan.security.Signer``, purpose
``titan.probe.v1``, the run id as context) under the job secret: a packet that does not
verify, is older than ``_FRESH_S`` or repeats a recent ping (from any address) is dropped
unanswered, so the probe reflects nothing to anyone without the secret.
"""

from __future__ import annotations

import collections
import hmac
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
from titan.security.signing import Signer
from titan.settings.env import TITAN_LISTEN_ADDR

__all__ = ["EchoProbe", "default_probe_host", "PROBE_PURPOSE"]

log = logging.getLogger(__name__)

PROBE_PURPOSE = "titan.probe.v1"
_PING, _PONG = b"TP", b"TR"
#: magic, sequence number, sender's monotonic send time, sender's wall clock (freshness)
_FMT = struct.Struct("!2sQdd")
_TAG = 16
_SIZE = _FMT.size + _TAG
_FRESH_S = 60.0
_SEEN_MAX = 4096
_PROCESS_SIGNER: Signer | None = None


def default_probe_host() -> str:
    """The job's listen address (``TITAN_LISTEN_ADDR``, set by ``titan run``), else loopback."""
    return os.environ.get(TITAN_LISTEN_ADDR) or "127.0.0.1"


def _process_signer() -> Signer:
    """A random key private to this process (probes made without the job's signer)."""
    global _PROCESS_SIGNER
    if _PROCESS_SIGNER is None:
        _PROCESS_SIGNER = Signer(os.urandom(32))
    return _PROCESS_SIGNER


class EchoProbe:
    """Probe the other agents found in ``metrics_dir``; see the module docstring."""

    def __init__(self, metrics_dir: str | os.PathLike[str], node: str, *, host: str = "",
                 port: int = 0, timeout_s: float = 1.0, window: int = 300, min_probes: int = 100,
                 refresh_s: float = 10.0, stale_s: float = 60.0, signer: Signer | None = None,
                 context: str = "", interval_s: float | None = None) -> None:
        self.dir = Path(metrics_dir)
        self._signer = signer or _process_signer()
        self._context = context.encode()
        self._seen: collections.OrderedDict[bytes, float] = collections.OrderedDict()
        self.rejected = 0
        self.node = node
        self.host = host or default_probe_host()
        self.timeout_s = timeout_s
        self.window = window
        self.min_probes = min_probes
        self.refresh_s = refresh_s
        self.stale_s = stale_s
        self.sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((self.host, port))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self._lock = threading.Lock()
        self._peers: dict[str, tuple[str, int]] = {}
        self._seq = 0
        self._outstanding: dict[int, tuple[str, float, float]] = {}  # seq -> (peer, monotonic, wall) sent
        self._rtts: dict[str, list[float]] = collections.defaultdict(list)
        self._outcomes: dict[str, collections.deque[bool]] = {}
        self._sent: dict[str, int] = collections.defaultdict(int)
        self._lost: dict[str, int] = collections.defaultdict(int)
        self._lost_sent: dict[str, float] = {}  # peer -> wall time the newest lost ping was sent
        self._last_refresh = -1e18
        self._closed = False
        self._announce()
        self._thread = threading.Thread(target=self._serve, name="titan-probe", daemon=True)
        self._thread.start()
        # ``interval_s``: ping every peer at this pace from a thread of its own (a link fault of
        # a few seconds needs more than the agent's one ping per tick to be seen).
        self.interval_s = interval_s
        self._sender: threading.Thread | None = None
        if interval_s:
            self._sender = threading.Thread(target=self._send_loop, name="titan-probe-send", daemon=True)
            self._sender.start()

    def _send_loop(self) -> None:
        assert self.interval_s
        nxt = time.monotonic()
        while not self._closed:
            try:
                self.tick(time.time())
            except OSError as e:
                log.debug("probe round failed: %s", e)
            nxt += self.interval_s
            time.sleep(max(0.0, nxt - time.monotonic()))

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
            for seq, (peer, sent, wall) in list(self._outstanding.items()):
                if mono - sent > self.timeout_s:
                    del self._outstanding[seq]
                    self._record(peer, False)
                    self._lost_sent[peer] = max(wall, self._lost_sent.get(peer, 0.0))
            peers = dict(self._peers)
        for peer, addr in peers.items():
            with self._lock:
                self._seq += 1
                seq = self._seq
                self._outstanding[seq] = (peer, time.monotonic(), time.time())
                self._sent[peer] += 1
            try:
                self.sock.sendto(self._packet(_PING, seq, time.monotonic(), time.time()), addr)
            except OSError as e:
                log.debug("probe to %s %s failed: %s", peer, addr, e)

    def _record(self, peer: str, ok: bool) -> None:
        dq = self._outcomes.setdefault(peer, collections.deque(maxlen=self.window))
        dq.append(ok)
        if not ok:
            self._lost[peer] += 1

    def _packet(self, magic: bytes, seq: int, sent: float, wall: float) -> bytes:
        body = _FMT.pack(magic, seq, sent, wall)
        return body + self._signer.tag(PROBE_PURPOSE, body, context=self._context)[:_TAG]

    def _verified(self, data: bytes, addr: Any) -> tuple[bytes, int, float, float] | None:
        """The fields of an authentic, fresh, unrepeated packet; None (dropped) otherwise."""
        if len(data) != _SIZE:
            return None
        body, tag = data[:_FMT.size], data[_FMT.size:]
        if not hmac.compare_digest(self._signer.tag(PROBE_PURPOSE, body, context=self._context)[:_TAG], tag):
            return None
        magic, seq, sent, wall = _FMT.unpack(body)
        now = time.time()
        if abs(now - wall) > _FRESH_S:
            return None
        if magic == _PING:
            key = bytes(tag)  # the same ping again, from any address, is a replay
            if key in self._seen:
                return None
            self._seen[key] = now
            while len(self._seen) > _SEEN_MAX or (self._seen and now - next(iter(self._seen.values())) > _FRESH_S):
                self._seen.popitem(last=False)
        return magic, seq, sent, wall

    def _serve(self) -> None:
        while not self._closed:
            try:
                data, addr = self.sock.recvfrom(128)
            except socket.timeout:
                continue
            except OSError:
                if self._closed:
                    return
                continue
            fields = self._verified(data, addr)
            if fields is None:
                self.rejected += 1
                continue
            magic, seq, sent, wall = fields
            if magic == _PING:
                try:
                    self.sock.sendto(self._packet(_PONG, seq, sent, wall), addr)
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
        """RTT (mean and median of the pongs since the last call, and how many there were),
        loss over the window, counters."""
        out: dict[str, float] = {}
        with self._lock:
            for peer in set(self._peers) | set(self._outcomes):
                rtts = self._rtts.pop(peer, [])
                if rtts:
                    out[metric_key("net_probe_rtt_seconds", peer=peer)] = sum(rtts) / len(rtts)
                    out[metric_key("net_probe_rtt_median_seconds", peer=peer)] = sorted(rtts)[len(rtts) // 2]
                    out[metric_key("net_probe_pongs", peer=peer)] = float(len(rtts))
                dq = self._outcomes.get(peer)
                if dq is not None and len(dq) >= self.min_probes:
                    out[metric_key("net_probe_loss_ratio", peer=peer)] = 1.0 - sum(dq) / len(dq)
                out[metric_key("net_probe_sent_total", peer=peer)] = float(self._sent[peer])
                out[metric_key("net_probe_lost_total", peer=peer)] = float(self._lost[peer])
                if peer in self._lost_sent:
                    out[metric_key("net_probe_last_lost_sent_seconds", peer=peer)] = self._lost_sent[peer]
        return out

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {"listen": f"{self.host}:{self.port}", "peers": sorted(self._peers), "rejected": self.rejected,
                    "key_id": self._signer.key_id}

    def close(self) -> None:
        self._closed = True
        try:
            self.sock.close()
        except OSError:
            pass
        self._thread.join(1.0)
        if self._sender is not None:
            self._sender.join(1.0)
        try:
            self.announce_file.unlink()
        except OSError:
            pass
