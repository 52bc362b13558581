"""The replication transport's frames: an authenticated header, then a payload, then its tag.

One frame on the wire::

    b"TRP1" ‖ u32 header length ‖ header (JSON) ‖ header tag (32 bytes)
            ‖ u64 payload length ‖ payload ‖ payload tag (32 bytes)

The header tag is the job key's HMAC of the header alone, so a receiver refuses a forged
request *before* it reads (or allocates for) the payload; the payload tag is the HMAC of
header tag ‖ payload, so a payload cannot be moved under another header. Requests and
responses use different purposes, and a response's context carries the request's nonce,
so a recorded response never answers another request. Nothing here unpickles: headers are
JSON, payloads are bytes. Standard library only.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator

from titan.errors import TitanError
from titan.security.signing import Signer

__all__ = ["ReplicaError", "MAGIC", "REQUEST", "RESPONSE", "CHUNK", "send_frame", "read_header", "read_payload",
           "new_nonce", "Payload", "chunks_of", "fresh"]

MAGIC = b"TRP1"
REQUEST = "titan.replica.request.v1"
RESPONSE = "titan.replica.response.v1"
#: Bytes per read/write/MAC update (large enough to amortise syscalls, small enough to stay in cache).
CHUNK = 4 << 20
_MAX_HEADER = 1 << 20
_U32 = struct.Struct("!I")
_U64 = struct.Struct("!Q")
_TAG = 32

#: What a payload can be on the sending side: bytes in memory, or a regular file to stream.
Payload = bytes | bytearray | memoryview | Path | None


class ReplicaError(TitanError):
    """A replication request failed; ``kind`` is one of ``unreachable``, ``timeout``,
    ``refused`` (authentication), ``missing``, ``corrupt``, ``full``, ``bad_request``, ``error``."""

    def __init__(self, message: str, kind: str = "error") -> None:
        super().__init__(message)
        self.kind = kind


def new_nonce() -> str:
    return os.urandom(12).hex()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if not k:
            raise ReplicaError("connection closed in the middle of a frame", "unreachable")
        got += k
    return bytes(buf)


def chunks_of(payload: Payload) -> tuple[int, Iterator[memoryview]]:
    """(size, pieces) of a payload: bytes are sliced, a ``Path`` is read in ``CHUNK`` pieces."""
    if isinstance(payload, Path):
        size = os.stat(payload).st_size

        def from_file() -> Iterator[memoryview]:
            with open(payload, "rb", buffering=0) as f:
                buf = bytearray(CHUNK)
                view = memoryview(buf)
                left = size
                while left:
                    n = f.readinto(view[:min(CHUNK, left)])
                    if not n:
                        raise ReplicaError(f"{payload} shrank while it was being sent", "error")
                    yield view[:n]
                    left -= n
        return size, from_file()
    data = memoryview(payload if payload is not None else b"").cast("B")
    return len(data), (data[off:off + CHUNK] for off in range(0, len(data), CHUNK))


def send_frame(sock: socket.socket, signer: Signer, purpose: str, context: str, header: dict[str, Any],
               payload: Payload = None, *, chunks: tuple[int, Iterable[memoryview]] | None = None,
               crc_out: list[int] | None = None) -> int:
    """Send one frame whose payload is ``payload`` (or ``chunks``: size and pieces).

    Cost: one HMAC over header and payload (and a CRC-32 of the payload when ``crc_out`` is
    given: its one element is set). Returns the payload size. Raises ``OSError`` or
    ``ReplicaError``.
    """
    raw = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    htag = signer.tag(purpose + ".header", raw, context=context)
    mac = signer.hasher(purpose + ".payload", context=context)
    mac.update(htag)
    size, pieces = chunks if chunks is not None else chunks_of(payload)
    sock.sendall(MAGIC + _U32.pack(len(raw)) + raw + htag + _U64.pack(size))
    crc, sent = 0, 0
    for chunk in pieces:
        mac.update(chunk)
        if crc_out is not None:
            crc = zlib.crc32(chunk, crc)
        sock.sendall(chunk)
        sent += len(chunk)
    if sent != size:
        raise ReplicaError(f"payload of {sent} bytes, {size} announced", "error")
    sock.sendall(mac.digest())
    if crc_out is not None:
        crc_out[:] = [crc]
    return size


def read_header(sock: socket.socket, signer: Signer, purpose: str, context: str) -> tuple[dict[str, Any], bytes, int]:
    """Read and verify a frame's header; returns (header, header tag, payload length).

    Raises ``ReplicaError`` (``refused`` for a bad tag, ``bad_request`` for a malformed
    frame) before any payload byte is read.
    """
    head = _recv_exact(sock, len(MAGIC) + _U32.size)
    if head[:len(MAGIC)] != MAGIC:
        raise ReplicaError("not a replication frame", "bad_request")
    (hlen,) = _U32.unpack(head[len(MAGIC):])
    if hlen > _MAX_HEADER:
        raise ReplicaError(f"header of {hlen} bytes is larger than {_MAX_HEADER}", "bad_request")
    raw = _recv_exact(sock, hlen)
    htag = _recv_exact(sock, _TAG)
    if not signer.verify(purpose + ".header", raw, htag, context=context):
        raise ReplicaError("frame not signed with this job's replication key (another job, or forged)", "refused")
    (plen,) = _U64.unpack(_recv_exact(sock, _U64.size))
    try:
        header = json.loads(raw)
    except ValueError:
        raise ReplicaError("header is not JSON", "bad_request") from None
    if not isinstance(header, dict):
        raise ReplicaError("header is not an object", "bad_request")
    return header, htag, plen


def read_payload(sock: socket.socket, signer: Signer, purpose: str, context: str, htag: bytes, size: int,
                 sink: Callable[[memoryview], None] | BinaryIO | None = None) -> int:
    """Read ``size`` payload bytes into ``sink`` (a callable or a writable file; ``None``:
    discard), verifying the payload tag at the end. Returns the payload's CRC-32.

    The sink has seen the bytes before the tag is checked: it must write to a temporary
    place that the caller commits only when this returns. Raises ``ReplicaError``.
    """
    mac = signer.hasher(purpose + ".payload", context=context)
    mac.update(htag)
    crc = 0
    buf = bytearray(min(CHUNK, max(size, 1)))
    view = memoryview(buf)
    left = size
    write = sink if callable(sink) else (sink.write if sink is not None else None)
    while left:
        n = sock.recv_into(view[:min(len(buf), left)])
        if not n:
            raise ReplicaError("connection closed in the middle of a payload", "unreachable")
        chunk = view[:n]
        mac.update(chunk)
        crc = zlib.crc32(chunk, crc)
        if write is not None:
            write(chunk)
        left -= n
    tag = _recv_exact(sock, _TAG)
    import hmac as _hmac

    if not _hmac.compare_digest(mac.digest(), tag):
        raise ReplicaError("payload does not match its signature (altered in transit)", "refused")
    return crc


def fresh(header: dict[str, Any], window_s: float) -> bool:
    """Whether a request's time stamp is within ``window_s`` of this clock."""
    t = header.get("t")
    return isinstance(t, (int, float)) and abs(time.time() - float(t)) <= window_s
