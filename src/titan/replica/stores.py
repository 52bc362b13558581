"""Where a replica server keeps what it was sent: in memory, or on this node's disk.

A *set* is a named group of blobs (``ckpt/step-00000010/node1``: one node's shards of one
checkpoint; ``snap/rank3``: one rank's per-step state). Set ids are ``/``-separated plain
components and blob names one plain component, so a set maps to a folder and a blob to a
file without any path from the network ever escaping the store's root.

Both stores receive a blob into a temporary place and make it visible only when
:meth:`Incoming.commit` is called — after the transport verified the payload's tag and
CRC — so a torn or forged upload never replaces a good copy. ``MemoryStore`` lives as
long as its process (the ``titan run`` launcher, which survives worker restarts);
``DiskStore`` survives the launcher too (a requeued job on the same node) and writes each
blob with fsync, then rename, then an atomically replaced ``.sums.json`` per set.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Iterator, Protocol

from titan.events.rundir import atomic_write_text
from titan.replica.wire import ReplicaError

__all__ = ["BlobInfo", "BlobStore", "MemoryStore", "DiskStore", "check_set_id", "check_name", "Incoming"]

_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
_MAX_DEPTH = 8
#: The store's own files start with ``#``, which no blob name or set id can.
SUMS = "#sums.json"


@dataclasses.dataclass(frozen=True)
class BlobInfo:
    """Size and CRC-32 of a stored blob."""

    size: int
    crc32: int

    def to_dict(self) -> dict[str, int]:
        return {"size": self.size, "crc32": self.crc32}


def check_name(name: object) -> str:
    """A blob name: one plain component of letters, digits and ``._-`` (``.metadata`` is one)."""
    if not isinstance(name, str) or not _NAME.match(name) or name in (".", ".."):
        raise ReplicaError(f"blob name {name!r} is not a plain name", "bad_request")
    return name


def check_set_id(set_id: object) -> str:
    """A set id: 1..8 plain components joined by ``/``."""
    if not isinstance(set_id, str) or not set_id:
        raise ReplicaError(f"set id {set_id!r} is empty or not text", "bad_request")
    parts = set_id.split("/")
    if len(parts) > _MAX_DEPTH:
        raise ReplicaError(f"set id {set_id!r} has more than {_MAX_DEPTH} parts", "bad_request")
    for p in parts:
        if not _PART.match(p):
            raise ReplicaError(f"set id {set_id!r}: {p!r} is not a plain name", "bad_request")
    return set_id


class Incoming(Protocol):
    """One blob being received: ``write`` pieces, then ``commit`` or ``abort``."""

    def write(self, chunk: memoryview) -> None: ...

    def commit(self, crc32: int) -> BlobInfo: ...

    def abort(self) -> None: ...


class BlobStore(Protocol):
    """What a replica server stores blobs in (see the module doc)."""

    kind: str

    def incoming(self, set_id: str, name: str, size: int) -> Incoming: ...

    def read(self, set_id: str, name: str) -> tuple[BlobInfo, Iterator[memoryview]]: ...

    def list(self, prefix: str = "") -> dict[str, dict[str, BlobInfo]]: ...

    def drop(self, set_id: str) -> int: ...

    @property
    def used_bytes(self) -> int: ...


def _under(set_id: str, prefix: str) -> bool:
    return not prefix or set_id == prefix.rstrip("/") or set_id.startswith(prefix.rstrip("/") + "/")


class MemoryStore:
    """Blobs in this process's memory, at most ``max_bytes`` in all (0 = no bound)."""

    kind = "memory"

    def __init__(self, max_bytes: int = 0) -> None:
        self.max_bytes = max_bytes
        self._sets: dict[str, dict[str, tuple[bytes, BlobInfo]]] = {}
        self._reserved = 0
        self._lock = threading.Lock()

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(i.size for s in self._sets.values() for _, i in s.values())

    def incoming(self, set_id: str, name: str, size: int) -> Incoming:
        check_set_id(set_id)
        check_name(name)
        with self._lock:
            old = self._sets.get(set_id, {}).get(name)
            used = sum(i.size for s in self._sets.values() for _, i in s.values()) + self._reserved
            if self.max_bytes and used - (old[1].size if old else 0) + size > self.max_bytes:
                raise ReplicaError(f"replica memory full: {used} of {self.max_bytes} bytes used, "
                                   f"{size} more asked", "full")
            self._reserved += size
        return _MemIncoming(self, set_id, name, size)

    def _put(self, set_id: str, name: str, data: bytes, info: BlobInfo, reserved: int) -> None:
        with self._lock:
            self._reserved -= reserved
            self._sets.setdefault(set_id, {})[name] = (data, info)

    def _release(self, reserved: int) -> None:
        with self._lock:
            self._reserved -= reserved

    def read(self, set_id: str, name: str) -> tuple[BlobInfo, Iterator[memoryview]]:
        with self._lock:
            got = self._sets.get(set_id, {}).get(name)
        if got is None:
            raise ReplicaError(f"no blob {name!r} in set {set_id!r}", "missing")
        data, info = got
        view = memoryview(data)
        return info, iter([view])

    def list(self, prefix: str = "") -> dict[str, dict[str, BlobInfo]]:
        with self._lock:
            return {s: {n: i for n, (_, i) in blobs.items()} for s, blobs in self._sets.items() if _under(s, prefix)}

    def drop(self, set_id: str) -> int:
        with self._lock:
            blobs = self._sets.pop(set_id, {})
        return sum(i.size for _, i in blobs.values())


class _MemIncoming:
    def __init__(self, store: MemoryStore, set_id: str, name: str, size: int) -> None:
        self.store, self.set_id, self.name, self.size = store, set_id, name, size
        self.buf = bytearray(size)
        self.n = 0
        self.done = False

    def write(self, chunk: memoryview) -> None:
        k = len(chunk)
        if self.n + k > self.size:
            raise ReplicaError("more bytes than announced", "bad_request")
        self.buf[self.n:self.n + k] = chunk
        self.n += k

    def commit(self, crc32: int) -> BlobInfo:
        if self.n != self.size:
            raise ReplicaError(f"{self.n} bytes received, {self.size} announced", "bad_request")
        info = BlobInfo(self.size, crc32)
        self.store._put(self.set_id, self.name, bytes(self.buf), info, self.size)
        self.buf = bytearray()
        self.done = True
        return info

    def abort(self) -> None:
        if not self.done:
            self.done = True
            self.buf = bytearray()
            self.store._release(self.size)


class DiskStore:
    """Blobs as files under ``root`` (this node's disk): ``root/<set>/<name>`` + ``.sums.json``.

    Existing sets under ``root`` are picked up when the store is opened (a relaunched
    launcher serves what the previous one received). ``fsync`` makes every blob durable
    before its upload is acknowledged.
    """

    kind = "disk"

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.root = Path(root)
        self.fsync = fsync
        self._lock = threading.Lock()
        self._index: dict[str, dict[str, BlobInfo]] = {}
        self.root.mkdir(parents=True, exist_ok=True)
        self._load()

    def _load(self) -> None:
        for sums in self.root.rglob(SUMS):
            rel = sums.parent.relative_to(self.root).as_posix()
            try:
                check_set_id(rel)
                raw = json.loads(sums.read_text())
            except (ReplicaError, OSError, ValueError):
                continue
            blobs = {}
            for name, d in (raw.get("blobs") or {}).items() if isinstance(raw, dict) else ():
                try:
                    info = BlobInfo(int(d["size"]), int(d["crc32"]))
                    if (sums.parent / check_name(name)).stat().st_size == info.size:
                        blobs[name] = info
                except (ReplicaError, OSError, KeyError, TypeError, ValueError):
                    continue
            if blobs:
                self._index[rel] = blobs

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(i.size for s in self._index.values() for i in s.values())

    def _dir(self, set_id: str) -> Path:
        return self.root.joinpath(*check_set_id(set_id).split("/"))

    def incoming(self, set_id: str, name: str, size: int) -> Incoming:
        d = self._dir(set_id)
        check_name(name)
        d.mkdir(parents=True, exist_ok=True)
        return _DiskIncoming(self, set_id, name, d, size)

    def _commit(self, set_id: str, name: str, d: Path, info: BlobInfo) -> None:
        with self._lock:
            blobs = dict(self._index.get(set_id, {}))
            blobs[name] = info
            self._write_sums(d, blobs)
            self._index[set_id] = blobs

    def _write_sums(self, d: Path, blobs: dict[str, BlobInfo]) -> None:
        # Under the store's lock: one writer of a set's sums at a time in this process.
        atomic_write_text(d / SUMS, json.dumps({"blobs": {n: i.to_dict() for n, i in blobs.items()}}))

    def read(self, set_id: str, name: str) -> tuple[BlobInfo, Iterator[memoryview]]:
        with self._lock:
            info = self._index.get(set_id, {}).get(name)
        if info is None:
            raise ReplicaError(f"no blob {name!r} in set {set_id!r}", "missing")
        path = self._dir(set_id) / check_name(name)
        try:
            f = open(path, "rb", buffering=0)
        except OSError as e:
            raise ReplicaError(f"blob {name!r} of set {set_id!r} unreadable: {e}", "missing") from None
        return info, _file_chunks(f)

    def list(self, prefix: str = "") -> dict[str, dict[str, BlobInfo]]:
        with self._lock:
            return {s: dict(b) for s, b in self._index.items() if _under(s, prefix)}

    def drop(self, set_id: str) -> int:
        d = self._dir(set_id)
        with self._lock:
            blobs = self._index.pop(set_id, {})
        # Rename out of the namespace first: a crash mid-delete leaves no half set behind.
        if d.is_dir():
            trash = d.with_name(f"#drop-{d.name}-{os.getpid()}-{threading.get_ident()}")
            try:
                os.rename(d, trash)
            except OSError:
                trash = d
            shutil.rmtree(trash, ignore_errors=True)
        return sum(i.size for i in blobs.values())


def _file_chunks(f) -> Iterator[memoryview]:  # noqa: ANN001 - a raw binary file
    from titan.replica.wire import CHUNK

    try:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while True:
            n = f.readinto(buf)
            if not n:
                return
            yield view[:n]
    finally:
        f.close()


class _DiskIncoming:
    def __init__(self, store: DiskStore, set_id: str, name: str, d: Path, size: int) -> None:
        self.store, self.set_id, self.name, self.d, self.size = store, set_id, name, d, size
        self.tmp = d / f"#{name}.part{os.getpid()}.{threading.get_ident()}.{id(self):x}"
        self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.n = 0
        self.done = False

    def write(self, chunk: memoryview) -> None:
        if self.n + len(chunk) > self.size:
            raise ReplicaError("more bytes than announced", "bad_request")
        view = chunk
        while len(view):
            k = os.write(self.fd, view)
            view = view[k:]
        self.n += len(chunk)

    def commit(self, crc32: int) -> BlobInfo:
        if self.n != self.size:
            self.abort()
            raise ReplicaError(f"{self.n} bytes received, {self.size} announced", "bad_request")
        try:
            if self.store.fsync:
                os.fsync(self.fd)
        finally:
            os.close(self.fd)
            self.done = True
        os.replace(self.tmp, self.d / self.name)
        info = BlobInfo(self.size, crc32)
        self.store._commit(self.set_id, self.name, self.d, info)
        return info

    def abort(self) -> None:
        if not self.done:
            self.done = True
            os.close(self.fd)
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass

