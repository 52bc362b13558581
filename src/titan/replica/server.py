"""``ReplicaServer``: keeps other nodes' blobs for them and hands them back, authenticated.

It runs inside ``titan run`` (a thread of the launcher, so it outlives worker restarts),
listening on the node's listen address only. Every request is a signed frame
(:mod:`titan.replica.wire`) under the job's replication key, fresh (time stamp within
``window_s``) and never seen before (its nonce is remembered for the window), so a
recorded request cannot be replayed and a client without the key is refused before its
payload is read. Operations:

``ping`` · ``put`` (one blob into a set) · ``get`` (one blob back; also from a read-only
*export*: ``@name/sub/folders`` reads a regular file under an exported folder, e.g. this
node's committed checkpoints) · ``list`` (sets under a prefix) · ``drop`` · ``retain``
(drop every set under a prefix but the ones named).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from titan.replica.stores import BlobStore, check_name, check_set_id
from titan.replica.wire import REQUEST, RESPONSE, ReplicaError, fresh, read_header, read_payload, send_frame
from titan.security.paths import PathEscape, confined, open_regular
from titan.security.signing import Signer

__all__ = ["ReplicaServer"]

log = logging.getLogger(__name__)

_IDLE_S = 600.0


class ReplicaServer:
    """Serve ``store`` (and read-only ``exports``) on ``addr:port`` to holders of ``key``.

    ``context`` binds every frame to one job (the run id). Cost: one thread per client
    connection (a node's ranks), one HMAC over each payload in and out.
    """

    def __init__(self, store: BlobStore, *, key: bytes, context: str, addr: str = "127.0.0.1", port: int = 0,
                 exports: Mapping[str, str | os.PathLike[str]] | None = None, node: str = "",
                 window_s: float = 120.0) -> None:
        self.store = store
        self.signer = Signer(key)
        self.context = context
        self.node = node
        self.window_s = window_s
        self.exports = {check_set_id(k): Path(v) for k, v in (exports or {}).items()}
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((addr, port))
        self._sock.listen(64)
        self.addr = addr
        self.port = int(self._sock.getsockname()[1])
        self._nonces: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conns: set[socket.socket] = set()
        self.requests = 0
        self.refused = 0

    @property
    def endpoint(self) -> str:
        """``host:port`` (``[v6]:port``) clients connect to."""
        return f"[{self.addr}]:{self.port}" if ":" in self.addr else f"{self.addr}:{self.port}"

    def export(self, name: str, path: str | os.PathLike[str]) -> None:
        """Serve regular files under ``path`` read-only as ``@name/...``."""
        self.exports[check_set_id(name)] = Path(path)

    def start(self) -> "ReplicaServer":
        t = threading.Thread(target=self._accept, name="titan-replica-accept", daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def close(self) -> None:
        """Stop accepting, close every connection; blobs in a ``DiskStore`` stay on disk."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()
        for t in self._threads:
            t.join(5)

    def __enter__(self) -> "ReplicaServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- connections ------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self._sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(_IDLE_S)
            with self._lock:
                self._conns.add(conn)
            t = threading.Thread(target=self._serve, args=(conn, peer), name="titan-replica-conn", daemon=True)
            t.start()
            self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _serve(self, conn: socket.socket, peer: Any) -> None:
        try:
            while not self._stop.is_set():
                try:
                    header, htag, plen = read_header(conn, self.signer, REQUEST, self.context)
                except ReplicaError as e:
                    if e.kind != "unreachable":
                        self.refused += 1
                        log.warning("replica server: refused a request from %s: %s", peer, e)
                        with contextlib.suppress(OSError):  # a client with another key reads "refused"
                            send_frame(conn, self.signer, RESPONSE, f"{self.context}:",
                                       {"ok": False, "kind": e.kind, "error": str(e)})
                            _linger(conn)
                    return  # the frame cannot be trusted, nor its length: the connection ends
                except (OSError, TimeoutError):
                    return
                self.requests += 1
                nonce = str(header.get("nonce", ""))
                state = {"consumed": False}
                try:
                    if header.get("op") != "put":  # every frame ends in a payload tag, even an empty one
                        read_payload(conn, self.signer, REQUEST, self.context, htag, plen, None)
                        state["consumed"] = True
                    self._check_fresh(header, nonce)
                    reply, out = self._handle(conn, header, htag, plen, state)
                except ReplicaError as e:
                    if not state["consumed"]:
                        with contextlib.suppress(ReplicaError, OSError):
                            read_payload(conn, self.signer, REQUEST, self.context, htag, plen, None)
                    if e.kind == "refused":
                        self.refused += 1
                    reply, out = {"ok": False, "kind": e.kind, "error": str(e)}, None
                except OSError as e:
                    reply, out = {"ok": False, "kind": "error", "error": f"{type(e).__name__}: {e}"}, None
                send_frame(conn, self.signer, RESPONSE, f"{self.context}:{nonce}", reply, chunks=out)
        except (OSError, ReplicaError) as e:
            log.debug("replica connection from %s ended: %s", peer, e)
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _check_fresh(self, header: dict[str, Any], nonce: str) -> None:
        if len(nonce) < 16 or not fresh(header, self.window_s):
            raise ReplicaError("stale or unstamped request (clocks more than "
                               f"{self.window_s:g} s apart, or a replay)", "refused")
        now = time.time()
        with self._lock:
            if nonce in self._nonces:
                raise ReplicaError("replayed request (nonce seen before)", "refused")
            self._nonces[nonce] = now
            if len(self._nonces) > 4096:
                cut = now - 2 * self.window_s
                self._nonces = {n: t for n, t in self._nonces.items() if t >= cut}

    # --- operations -------------------------------------------------------------------
    def _handle(self, conn: socket.socket, h: dict[str, Any], htag: bytes, plen: int,
                state: dict[str, bool]) -> tuple[dict[str, Any], Any]:
        op = h.get("op")
        if op != "put" and plen:
            raise ReplicaError(f"{op!r} carries no payload", "bad_request")
        if op == "ping":
            return {"ok": True, "node": self.node, "store": self.store.kind, "used_bytes": self.store.used_bytes,
                    "exports": sorted(self.exports)}, None
        if op == "put":
            set_id, name = check_set_id(h.get("set")), check_name(h.get("name"))
            inc = self.store.incoming(set_id, name, plen)
            state["consumed"] = True
            try:
                crc = read_payload(conn, self.signer, REQUEST, self.context, htag, plen, inc.write)
                want = h.get("crc32")
                if want is not None and int(want) != crc:
                    raise ReplicaError(f"{name}: CRC-32 {crc:08x} received, {int(want):08x} sent (corrupted)",
                                       "corrupt")
                info = inc.commit(crc)
            except BaseException:
                inc.abort()
                raise
            return {"ok": True, **info.to_dict()}, None
        if op == "get":
            set_id, name = str(h.get("set", "")), check_name(h.get("name"))
            if set_id.startswith("@"):
                return self._get_export(set_id[1:], name)
            info, pieces = self.store.read(check_set_id(set_id), name)
            return {"ok": True, **info.to_dict()}, (info.size, pieces)
        if op == "list":
            prefix = str(h.get("prefix", ""))
            if prefix:
                check_set_id(prefix.rstrip("/"))
            sets = self.store.list(prefix)
            return {"ok": True, "sets": {s: {n: i.to_dict() for n, i in b.items()} for s, b in sets.items()}}, None
        if op == "drop":
            return {"ok": True, "bytes": self.store.drop(check_set_id(h.get("set")))}, None
        if op == "retain":
            prefix = check_set_id(str(h.get("prefix", "")).rstrip("/"))
            keep = {check_set_id(s) for s in h.get("keep") or []}
            dropped = [s for s in self.store.list(prefix) if s not in keep]
            for s in dropped:
                self.store.drop(s)
            return {"ok": True, "dropped": dropped}, None
        raise ReplicaError(f"unknown operation {op!r}", "bad_request")

    def _get_export(self, ref: str, name: str) -> tuple[dict[str, Any], Any]:
        export, _, sub = ref.partition("/")
        root = self.exports.get(export)
        if root is None:
            raise ReplicaError(f"nothing exported as @{export}", "missing")
        if sub:
            check_set_id(sub)
        try:
            path = confined(root, f"{sub}/{name}" if sub else name, what="exported file")
            fd = open_regular(path, what="exported file")
        except FileNotFoundError:
            raise ReplicaError(f"@{ref}/{name} does not exist", "missing") from None
        except (PathEscape, OSError) as e:
            raise ReplicaError(f"@{ref}/{name} refused: {e}", "missing") from None
        f = open(fd, "rb", buffering=0)
        size = os.fstat(f.fileno()).st_size
        from titan.replica.stores import _file_chunks

        return {"ok": True, "size": size, "crc32": None}, (size, _file_chunks(f))


def _linger(conn: socket.socket, limit: int = 16 << 20, seconds: float = 2.0) -> None:
    """Half-close and discard what the client still sends (bounded), so that closing does not
    reset the connection before the client read the refusal."""
    conn.shutdown(socket.SHUT_WR)
    conn.settimeout(seconds)
    end = time.monotonic() + seconds
    got = 0
    buf = bytearray(1 << 16)
    while got < limit and time.monotonic() < end:
        try:
            n = conn.recv_into(buf)
        except OSError:
            return
        if not n:
            return
        got += n
