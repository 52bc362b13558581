"""DCP storage plug-ins: a writer that checksums while writing, a reader that never unpickles.

``TitanWriter`` is DCP's ``FileSystemWriter`` with a file system whose streams compute
CRC-32 and size of every byte as it is written (no re-read). Each rank records its files
in ``__sums.<rank>.json``; the coordinator's ``finish`` writes DCP's ``.metadata`` and then
the manifest (``manifest.py``) — the last file of a checkpoint.

``SafeReader`` reads ``.metadata`` with an unpickler that only resolves DCP's metadata
classes, ``torch.Size``, dtypes and paths; ``SafeLoadPlanner`` loads byte items with
``torch.load(weights_only=True)``. Stock DCP uses ``pickle.load`` and
``weights_only=False`` for both (a tampered ``.metadata`` ran a shell command here).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import threading
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Generator

import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from titan.private_api import PrivateName, register, require

#: torch internals the safe restore rests on (titan.private_api: a torch that moved them is
#: refused with one line naming the version, not an ImportError traceback).
PRIVATE_NAMES = register("checkpoint restore", [
    PrivateName("torch.distributed.checkpoint._traverse", "set_element",
                "SafeLoadPlanner puts each loaded value into the nested state dict as DCP's own planner does"),
])
try:
    from torch.distributed.checkpoint._traverse import set_element
except ImportError:  # pragma: no cover - only on a torch that moved it
    require(PRIVATE_NAMES, feature="checkpoint restore")
    raise

from titan.checkpoint import inject
from titan.checkpoint.manifest import SUMS_PREFIX, build_manifest, write_manifest
from titan.errors import TitanError
from titan.security.paths import PathEscape, check_regular, confined, open_regular

__all__ = ["TitanWriter", "SafeReader", "SafeLoadPlanner", "UnsafeCheckpointError", "safe_unpickle_metadata",
           "load_metadata_file"]


class UnsafeCheckpointError(TitanError):
    """A checkpoint file asked to run or import something a checkpoint never needs."""


class _HashingStream(io.RawIOBase):
    """Write-through wrapper that keeps CRC-32 and byte count of what passed through."""

    def __init__(self, raw: Any) -> None:
        super().__init__()
        self.raw = raw
        self.crc = 0
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:  # type: ignore[override]
        mv = memoryview(b).cast("B")
        n = self.raw.write(mv)
        n = len(mv) if n is None else n
        self.crc = zlib.crc32(mv[:n], self.crc)
        self.size += n
        return n

    def tell(self) -> int:
        return self.raw.tell()

    def seekable(self) -> bool:
        return False

    def fileno(self) -> int:
        return self.raw.fileno()

    def flush(self) -> None:
        self.raw.flush()


class _HashingFileSystem(FileSystem):
    """Local file system whose write streams record ``{name: (size, crc32)}``."""

    def __init__(self) -> None:
        super().__init__()
        self.sums: dict[str, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:  # picklable for process-mode async save
        return {"sums": dict(self.sums)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.sums = state["sums"]
        self._lock = threading.Lock()

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Generator[io.IOBase, None, None]:
        path = Path(path)
        if "w" not in mode:
            with path.open(mode) as stream:
                yield stream  # type: ignore[misc]
            return
        with path.open(mode) as raw:
            h = _HashingStream(raw)
            yield h  # type: ignore[misc]
            raw.flush()
            with self._lock:
                self.sums[path.name] = (h.size, h.crc)


class TitanWriter(FileSystemWriter):
    """``FileSystemWriter`` that checksums while writing and writes the manifest last.

    ``info`` (step, world size, user data) goes into the manifest. Raises what DCP raises
    (note: ``CheckpointException`` is a ``BaseException``).
    """

    def __init__(self, path: str | os.PathLike, *, info: dict[str, Any], fsync: bool = True,
                 thread_count: int = 1, manifest: bool = True) -> None:
        super().__init__(path, single_file_per_rank=True, sync_files=fsync, thread_count=thread_count,
                         overwrite=True)
        self.fs = _HashingFileSystem()
        self.info = dict(info)
        self.fsync = fsync
        #: False (node-local storage): ``finish`` writes ``.metadata`` only; the manifest is
        #: agreed over the process group afterwards (``titan.checkpoint.nodelocal``).
        self.manifest = manifest

    def write_data(self, plan: Any, planner: Any) -> Any:
        inject.point("shard_write", rank=self.rank)
        fut = super().write_data(plan, planner)
        fut.wait()  # the stock writer is synchronous; results are ready
        inject.point("shard_written", rank=self.rank)
        sums = {name: {"size": s, "crc32": c} for name, (s, c) in self.fs.sums.items()
                if not name.startswith(".")}
        _write_small(Path(self.path) / f"{SUMS_PREFIX}{self.rank or 0}.json",
                     json.dumps({"rank": self.rank or 0, "files": sums}), self.fsync)
        return fut

    def finish(self, metadata: Metadata, results: Any) -> None:
        super().finish(metadata, results)  # .metadata.tmp → fsync → rename
        inject.point("metadata_written", rank=self.rank)
        if not self.manifest:
            return
        meta_sum = self.fs.sums.get(".metadata.tmp")
        manifest = build_manifest(Path(self.path), self.info, metadata_sum=meta_sum)
        write_manifest(Path(self.path), manifest, fsync=self.fsync)


def _write_small(path: Path, text: str, fsync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, text.encode())
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


# --- safe loading ---------------------------------------------------------------------

_MD = "torch.distributed.checkpoint.metadata"
_ALLOWED: frozenset[tuple[str, str]] = frozenset({
    (_MD, "Metadata"), (_MD, "TensorStorageMetadata"), (_MD, "TensorProperties"),
    (_MD, "ChunkStorageMetadata"), (_MD, "BytesStorageMetadata"), (_MD, "MetadataIndex"),
    (_MD, "StorageMeta"), (_MD, "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"), ("torch.serialization", "_get_layout"),  # a dict lookup of torch.layout values
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"), ("collections", "OrderedDict"),
})


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpointError(
            f"checkpoint metadata refers to {module}.{name}, which a DCP metadata file never needs; refused")


def safe_unpickle_metadata(data: bytes) -> Metadata:
    """Unpickle DCP metadata allowing only DCP's metadata classes; raises ``UnsafeCheckpointError``."""
    obj = _MetadataUnpickler(io.BytesIO(data)).load()
    if not isinstance(obj, Metadata):
        raise UnsafeCheckpointError(f"checkpoint metadata is a {type(obj).__name__}, not DCP Metadata")
    return obj


def load_metadata_file(ckpt: str | os.PathLike) -> Metadata:
    """A checkpoint's ``.metadata`` read safely and checked: every data file it names is a
    regular file inside ``ckpt``. Raises ``UnsafeCheckpointError`` or ``OSError``."""
    try:
        fd = open_regular(Path(ckpt) / ".metadata", what="checkpoint metadata")
    except PathEscape as e:
        raise UnsafeCheckpointError(str(e)) from None
    with open(fd, "rb") as f:
        metadata = safe_unpickle_metadata(f.read())
    _confine_storage(Path(ckpt), metadata)
    return metadata


class SafeReader(FileSystemReader):
    """``FileSystemReader`` whose ``read_metadata`` executes nothing from the file."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        try:
            fd = open_regular(path, what="checkpoint metadata")
        except PathEscape as e:
            raise UnsafeCheckpointError(str(e)) from None
        with open(fd, "rb") as f:
            metadata = safe_unpickle_metadata(f.read())
        _confine_storage(Path(self.path), metadata)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _confine_storage(root: Path, metadata: Metadata) -> None:
    """Every data file ``.metadata`` names must be a regular file inside the checkpoint."""
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        rel = getattr(info, "relative_path", None)
        try:
            check_regular(confined(root, rel, what="checkpoint data file"), what="checkpoint data file")
        except FileNotFoundError:
            continue  # DCP reports the missing file itself when it is needed
        except (PathEscape, OSError) as e:
            raise UnsafeCheckpointError(f"checkpoint metadata names {rel!r}: {e}; refused") from None


class SafeLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` that loads byte items with ``torch.load(weights_only=True)``.

    A tampered byte item raises ``UnsafeCheckpointError`` instead of running its payload.
    """

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as e:
            raise UnsafeCheckpointError(
                f"checkpoint item {read_item.dest_index.fqn!r} is not plain data; refused ({str(e).splitlines()[0]})"
            ) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj
