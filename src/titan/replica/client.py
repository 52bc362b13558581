"""``ReplicaClient``: put a named blob set on a buddy node's server, fetch it back, checksummed.

One persistent connection per server (reopened once when it broke); requests are
sequential per client. Every response is verified (signed under the job key, bound to the
request's nonce); a fetched blob's CRC-32 is checked against the server's record *and*
against what the caller expects (a checkpoint manifest), and a blob fetched into a file
is written to a temporary name and renamed only when both checks pass.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from titan.replica.stores import BlobInfo, check_name, check_set_id
from titan.replica.wire import (REQUEST, RESPONSE, Payload, ReplicaError, new_nonce, read_header, read_payload,
                                send_frame)
from titan.security.signing import Signer

__all__ = ["ReplicaClient", "parse_endpoint"]


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` → (host, port); ``ReplicaError`` when malformed."""
    try:
        if endpoint.startswith("["):
            host, _, rest = endpoint[1:].partition("]")
            port = int(rest.lstrip(":"))
        else:
            host, _, p = endpoint.rpartition(":")
            port = int(p)
    except ValueError:
        raise ReplicaError(f"replica endpoint {endpoint!r} is not HOST:PORT", "bad_request") from None
    if not host or not 0 < port < 65536:
        raise ReplicaError(f"replica endpoint {endpoint!r} is not HOST:PORT", "bad_request")
    return host, port


class ReplicaClient:
    """Talk to replica servers of one job (``key``, ``context``: see :class:`ReplicaServer`).

    ``timeout_s`` bounds connecting and every socket operation. Thread-safe (one lock per
    client; use one client per thread for parallel transfers).
    """

    def __init__(self, key: bytes, *, context: str, timeout_s: float = 60.0) -> None:
        self.signer = Signer(key)
        self.context = context
        self.timeout_s = timeout_s
        self._socks: dict[str, socket.socket] = {}
        self._lock = threading.Lock()
        self.bytes_sent = 0
        self.bytes_received = 0

    def close(self) -> None:
        with self._lock:
            for s in self._socks.values():
                with contextlib.suppress(OSError):
                    s.close()
            self._socks.clear()

    def __enter__(self) -> "ReplicaClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plumbing ---------------------------------------------------------------------
    def _connect(self, endpoint: str) -> socket.socket:
        s = self._socks.get(endpoint)
        if s is not None:
            return s
        host, port = parse_endpoint(endpoint)
        try:
            s = socket.create_connection((host, port), timeout=self.timeout_s)
        except socket.timeout:
            raise ReplicaError(f"replica server {endpoint} did not answer within {self.timeout_s:g} s",
                               "timeout") from None
        except OSError as e:
            raise ReplicaError(f"replica server {endpoint} unreachable: {e.strerror or e}", "unreachable") from None
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(self.timeout_s)
        self._socks[endpoint] = s
        return s

    def _drop(self, endpoint: str) -> None:
        s = self._socks.pop(endpoint, None)
        if s is not None:
            with contextlib.suppress(OSError):
                s.close()

    def _call(self, endpoint: str, header: dict[str, Any], payload: Payload = None, *,
              sink: Any = None) -> tuple[dict[str, Any], int | None]:
        """One request; returns (response header, CRC-32 of the response payload or None)."""
        with self._lock:
            for attempt in (1, 2):
                fresh_conn = endpoint not in self._socks
                sock = self._connect(endpoint)
                nonce = new_nonce()
                req = {**header, "nonce": nonce, "t": time.time()}
                answered = False
                try:
                    self.bytes_sent += send_frame(sock, self.signer, REQUEST, self.context, req, payload)
                    resp, htag, plen = read_header(sock, self.signer, RESPONSE, f"{self.context}:{nonce}")
                    answered = True
                    crc = read_payload(sock, self.signer, RESPONSE, f"{self.context}:{nonce}", htag, plen,
                                       sink if plen else None)
                    self.bytes_received += plen
                    return resp, (crc if header.get("op") == "get" else None)
                except socket.timeout:
                    self._drop(endpoint)
                    raise ReplicaError(f"replica server {endpoint} timed out after {self.timeout_s:g} s",
                                       "timeout") from None
                except (OSError, ReplicaError) as e:
                    self._drop(endpoint)
                    kind = getattr(e, "kind", "unreachable")
                    # A pooled connection the server had closed (idle, restarted): the request
                    # never got an answer, so it is sent once more on a new connection.
                    if attempt == 1 and not fresh_conn and not answered and kind == "unreachable":
                        continue
                    if isinstance(e, ReplicaError):
                        raise
                    raise ReplicaError(f"replica server {endpoint}: {e.strerror or e}", "unreachable") from None
        raise AssertionError("unreachable")

    @staticmethod
    def _check(resp: dict[str, Any], what: str) -> dict[str, Any]:
        if not resp.get("ok"):
            raise ReplicaError(f"{what}: {resp.get('error', 'refused')}", str(resp.get("kind", "error")))
        return resp

    # --- the API ----------------------------------------------------------------------
    def ping(self, endpoint: str) -> dict[str, Any]:
        """The server's node, store kind, bytes held and exports."""
        return self._check(self._call(endpoint, {"op": "ping"})[0], f"ping {endpoint}")

    def put(self, endpoint: str, set_id: str, name: str, data: Payload, *, crc32: int | None = None) -> BlobInfo:
        """Store ``data`` (bytes, or a file to stream) as ``name`` in ``set_id`` on the server.

        ``crc32``, when known (a checkpoint writer computed it while writing), is checked
        by the server against what arrived. Returns what the server stored. Cost: one pass
        over the data (HMAC; the server adds CRC-32, its write, and fsync on disk).
        """
        check_set_id(set_id)
        check_name(name)
        resp, _ = self._call(endpoint, {"op": "put", "set": set_id, "name": name, "crc32": crc32}, data)
        self._check(resp, f"put {set_id}/{name} on {endpoint}")
        return BlobInfo(int(resp["size"]), int(resp["crc32"]))

    def put_set(self, endpoint: str, set_id: str, blobs: Mapping[str, Payload | tuple[Payload, int]]) -> dict[str, BlobInfo]:
        """``put`` every blob of ``blobs`` (name → data or (data, crc32)); one connection."""
        out = {}
        for name, item in blobs.items():
            data, crc = item if isinstance(item, tuple) else (item, None)
            out[name] = self.put(endpoint, set_id, name, data, crc32=crc)
        return out

    def get(self, endpoint: str, set_id: str, name: str, *, expect: BlobInfo | None = None,
            into: str | os.PathLike[str] | None = None) -> bytes | BlobInfo:
        """Fetch one blob: bytes, or (with ``into``) written to that file, returning its info.

        ``set_id`` starting with ``@`` reads from one of the server's exports. Raises
        ``ReplicaError`` (``missing``; ``corrupt`` when the CRC-32 is not the server's
        record or ``expect``) — a file is then not created.
        """
        check_name(name)
        if into is None:
            parts: list[bytes] = []
            resp, crc = self._call(endpoint, {"op": "get", "set": set_id, "name": name},
                                   sink=lambda c: parts.append(bytes(c)))
            self._check(resp, f"get {set_id}/{name} from {endpoint}")
            data = b"".join(parts)
            self._verify(resp, crc, len(data), expect, f"{set_id}/{name}")
            return data
        dst = Path(into)
        tmp = dst.with_name(f".{dst.name}.fetch{os.getpid()}.{threading.get_ident()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        ok = False
        try:
            with open(fd, "wb", buffering=0, closefd=True) as f:
                def write(c: memoryview) -> None:
                    while len(c):
                        c = c[f.write(c):]
                resp, crc = self._call(endpoint, {"op": "get", "set": set_id, "name": name}, sink=write)
                self._check(resp, f"get {set_id}/{name} from {endpoint}")
                size = f.tell()
                info = self._verify(resp, crc, size, expect, f"{set_id}/{name}")
                os.fsync(f.fileno())
            os.replace(tmp, dst)
            ok = True
            return info
        finally:
            if not ok:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)

    @staticmethod
    def _verify(resp: dict[str, Any], crc: int | None, size: int, expect: BlobInfo | None, what: str) -> BlobInfo:
        crc = crc if crc is not None else 0
        if resp.get("crc32") is not None and int(resp["crc32"]) != crc:
            raise ReplicaError(f"{what}: CRC-32 {crc:08x}, the server's record says {int(resp['crc32']):08x} "
                               "(corrupted at rest)", "corrupt")
        if expect is not None and (expect.size != size or expect.crc32 != crc):
            raise ReplicaError(f"{what}: {size} bytes CRC-32 {crc:08x}, expected {expect.size} bytes "
                               f"{expect.crc32:08x}", "corrupt")
        return BlobInfo(size, crc)

    def list(self, endpoint: str, prefix: str = "") -> dict[str, dict[str, BlobInfo]]:
        """Sets (and their blobs) the server holds under ``prefix``."""
        resp = self._check(self._call(endpoint, {"op": "list", "prefix": prefix})[0], f"list on {endpoint}")
        return {s: {n: BlobInfo(int(i["size"]), int(i["crc32"])) for n, i in b.items()}
                for s, b in (resp.get("sets") or {}).items()}

    def drop(self, endpoint: str, set_id: str) -> int:
        """Delete one set; returns the bytes it held."""
        check_set_id(set_id)
        return int(self._check(self._call(endpoint, {"op": "drop", "set": set_id})[0], f"drop {set_id}")["bytes"])

    def retain(self, endpoint: str, prefix: str, keep: Iterable[str]) -> list[str]:
        """Delete every set under ``prefix`` except ``keep``; returns what was deleted."""
        resp = self._call(endpoint, {"op": "retain", "prefix": prefix, "keep": sorted(keep)})[0]
        return list(self._check(resp, f"retain {prefix}")["dropped"])

