"""On-disk layout of Titan checkpoints, the manifest, and verification.

Layout under the checkpoint root::

    step-00000100/            committed checkpoint (DCP files + .metadata + manifest.json)
    step-00000200.partial/    being written; never loaded
    step-00000050.corrupt-<t>/ moved aside after failing verification
    latest                    text: name of the newest committed checkpoint (replaced last)

The manifest is written last inside the directory: format version, step, world size,
torch and Titan versions, and size + CRC-32 of every file (computed while writing).
A directory without a readable manifest of a known version is never loaded. Policy for
older formats: a manifest whose ``version`` is newer than this code knows is refused with
a message naming both versions; versions this code knows are read as written.

Versions: 1 — the files and their sums; 2 (node-local storage) adds ``storage``
(``shared`` | ``node-local``), ``domains`` (the nodes of each storage domain) and
``placement`` (file → the rank and node that wrote it and the node holding its replica).
A version-1 checkpoint loads unchanged (``tests/checkpoint/test_format_versions.py``).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import logging
import os
import re
import zlib
from pathlib import Path
from typing import Any

from titan.checkpoint import inject
from titan.security.paths import PathEscape, check_regular, confined, is_plain_name, open_regular

__all__ = [
    "FORMAT", "VERSION", "MANIFEST", "LATEST", "SUMS_PREFIX", "step_dir_name", "parse_step",
    "build_manifest", "write_manifest", "read_manifest", "parse_manifest", "manifest_bytes", "MAX_MANIFEST_BYTES", "verify", "VerifyResult",
    "list_committed", "read_latest", "fsync_dir", "crc32_file", "build_file_manifest",
]

log = logging.getLogger(__name__)

FORMAT = "titan-checkpoint"
VERSION = 2
MANIFEST = "manifest.json"
LATEST = "latest"
SUMS_PREFIX = "__sums."
_STEP_RE = re.compile(r"^step-(\d{8,})$")
_CHUNK = 8 << 20
_MAX_MANIFEST = 64 << 20
MAX_MANIFEST_BYTES = _MAX_MANIFEST


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def parse_step(name: str) -> int | None:
    """Step of a committed checkpoint directory name, else ``None``."""
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


def fsync_dir(path: Path) -> None:
    """fsync a directory so that renames inside it are durable (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def crc32_file(path: Path) -> tuple[int, int]:
    """(size, CRC-32) of a regular file; one sequential read. ``PathEscape`` for anything else."""
    crc, size = 0, 0
    with open(open_regular(path), "rb", buffering=0) as f:
        buf = bytearray(_CHUNK)
        mv = memoryview(buf)
        while True:
            n = f.readinto(buf)
            if not n:
                break
            crc = zlib.crc32(mv[:n], crc)
            size += n
    return size, crc


def build_manifest(ckpt: Path, info: dict[str, Any], *, metadata_sum: tuple[int, int] | None,
                   files: dict[str, dict[str, int]] | None = None,
                   layout: dict[str, Any] | None = None) -> dict[str, Any]:
    """One manifest dict from every rank's sums.

    Shared storage: the sums are read from each rank's ``__sums.<rank>.json`` in ``ckpt``
    (``RuntimeError`` when one is missing: that rank's write did not finish). Node-local
    storage: ``files`` (gathered over the process group) and ``layout`` (``storage``,
    ``domains``, ``placement``) are given, and no other node's file is read.
    """
    import torch

    import titan

    world = int(info.get("world_size", 1))
    if files is None:
        files = {}
        for r in range(world):
            p = ckpt / f"{SUMS_PREFIX}{r}.json"
            try:
                files.update(json.loads(p.read_text())["files"])
            except (OSError, ValueError, KeyError) as e:
                raise RuntimeError(f"rank {r} left no checksums in {ckpt.name} ({e})") from None
    else:
        files = dict(files)
    if metadata_sum is None:
        metadata_sum = crc32_file(ckpt / ".metadata")
    files[".metadata"] = {"size": metadata_sum[0], "crc32": metadata_sum[1]}
    return {
        "format": FORMAT, "version": VERSION, "step": int(info["step"]), "world_size": world,
        "torch": torch.__version__, "titan": titan.__version__, "checksum": "crc32",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds"),
        "bytes": sum(f["size"] for f in files.values()), "files": files,
        "info": {k: v for k, v in info.items() if k not in ("step", "world_size")},
        **(layout or {"storage": "shared"}),
    }


def build_file_manifest(ckpt: Path, files: list[str], *, step: int, world_size: int,
                        info: dict[str, Any]) -> dict[str, Any]:
    """A manifest for files another program wrote into ``ckpt`` (a framework's own
    checkpoint: ``titan.integrations``), same format as :func:`build_manifest`. ``files``:
    names relative to ``ckpt``. Cost: one sequential read of each file."""
    import torch

    import titan

    sums = {}
    for name in files:
        size, crc = crc32_file(confined(ckpt, name, what="checkpoint file"))
        sums[name] = {"size": size, "crc32": crc}
    return {
        "format": FORMAT, "version": VERSION, "step": int(step), "world_size": int(world_size),
        "torch": torch.__version__, "titan": titan.__version__, "checksum": "crc32",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds"),
        "bytes": sum(f["size"] for f in sums.values()), "files": sums, "info": dict(info),
    }


def manifest_bytes(manifest: dict[str, Any]) -> bytes:
    """A manifest as written to storage (local folder or fsspec store alike)."""
    return (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()


def write_manifest(ckpt: Path, manifest: dict[str, Any], *, fsync: bool = True, name: str = MANIFEST) -> None:
    """Write ``manifest.json`` (or ``name``; temp name, fsync, rename) and fsync the directory."""
    inject.point("manifest_write")
    tmp = ckpt / f".{name}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, manifest_bytes(manifest))
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, ckpt / name)
    if fsync:
        fsync_dir(ckpt)
    inject.point("manifest_written")


def read_manifest(ckpt: Path, name: str = MANIFEST) -> dict[str, Any]:
    """Parse and sanity-check a manifest (``ckpt/name``); raises ``ValueError`` saying what is wrong."""
    p = ckpt / name
    try:
        with open(open_regular(p, what="manifest"), "rb") as f:
            raw = f.read(_MAX_MANIFEST + 1)
    except FileNotFoundError:
        raise ValueError("no manifest (the save never completed)") from None
    except PathEscape as e:
        raise ValueError(f"manifest refused: {e}") from None
    except OSError as e:
        raise ValueError(f"manifest unreadable: {e}") from None
    return parse_manifest(raw)


def parse_manifest(raw: bytes) -> dict[str, Any]:
    """Parse and sanity-check a manifest's bytes (read from a file or an fsspec store);
    raises ``ValueError`` saying what is wrong."""
    try:
        if len(raw) > _MAX_MANIFEST:
            raise ValueError(f"larger than {_MAX_MANIFEST >> 20} MiB")
        m = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"manifest unreadable: {e}") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise ValueError("manifest is not a Titan checkpoint manifest")
    if not isinstance(m.get("version"), int) or m["version"] > VERSION:
        raise ValueError(f"manifest version {m.get('version')!r} is newer than this Titan understands ({VERSION})")
    if not isinstance(m.get("files"), dict) or not isinstance(m.get("step"), int):
        raise ValueError("manifest lacks files or step")
    return m


@dataclasses.dataclass
class VerifyResult:
    """Outcome of verifying one checkpoint directory."""

    path: Path
    ok: bool
    problems: list[str]
    manifest: dict[str, Any] | None
    seconds: float = 0.0
    bytes_read: int = 0

    @property
    def reason(self) -> str:
        return "; ".join(self.problems) if self.problems else "ok"


def verify(ckpt: Path, *, checksums: bool = True, share: tuple[int, int] = (0, 1),
           manifest: str = MANIFEST) -> VerifyResult:
    """Check the manifest and every file's size (and CRC-32 unless ``checksums=False``).

    ``share=(r, n)`` checksums only files ``i`` with ``i % n == r`` (ranks split the
    reading). ``manifest``: the manifest's name inside ``ckpt`` (a framework checkpoint that
    is one file has a sidecar manifest beside it: ``titan.integrations``). Cost: one sequential read of the (shared) files; stat calls without
    checksums. Never raises for a bad checkpoint; the result lists the problems.
    """
    import time

    t0 = time.monotonic()
    try:
        m = read_manifest(ckpt, manifest)
    except ValueError as e:
        return VerifyResult(ckpt, False, [str(e)], None, time.monotonic() - t0)
    problems: list[str] = []
    nbytes = 0
    for i, (name, want) in enumerate(sorted(m["files"].items())):
        # A manifest names files *inside* its checkpoint: an absolute path, `..`, a symlink
        # out or a device (``/dev/zero`` would never end) is damage, never opened or measured.
        try:
            p = confined(ckpt, name, what="manifest entry")
            size = check_regular(p, what="manifest entry").st_size
            if not isinstance(want, dict) or not isinstance(want.get("size"), int) \
                    or not isinstance(want.get("crc32"), int):
                raise PathEscape(f"manifest entry {name!r} has no integer size and crc32")
        except FileNotFoundError:
            problems.append(f"{name}: missing")
            continue
        except PathEscape as e:
            problems.append(f"refused (damaged manifest): {e}")
            continue
        except OSError as e:
            problems.append(f"{name}: unreadable ({e.strerror or e})")
            continue
        if size != want["size"]:
            problems.append(f"{name}: size {size}, manifest says {want['size']} (truncated or overwritten)")
            continue
        if checksums and i % share[1] == share[0]:
            try:
                _, crc = crc32_file(p)
            except (OSError, PathEscape) as e:
                problems.append(f"{name}: unreadable ({e})")
                continue
            nbytes += size
            if crc != want["crc32"]:
                problems.append(f"{name}: checksum {crc:08x}, manifest says {want['crc32']:08x} (corrupted)")
    return VerifyResult(ckpt, not problems, problems, m, time.monotonic() - t0, nbytes)


def list_committed(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of every committed-looking directory (name ``step-N``), oldest first."""
    out = []
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    for e in entries:
        s = parse_step(e.name)
        if s is not None and e.is_dir():
            out.append((s, Path(e.path)))
    return sorted(out)


def read_latest(root: Path) -> str | None:
    """Name in ``latest`` or ``None``.

    ``latest`` must be a small regular file naming one entry of ``root``; anything else
    (a path, ``..``, a device) is damage: logged and treated as no ``latest``.
    """
    try:
        fd = open_regular(root / LATEST, what="latest")
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (PathEscape, OSError) as e:
        log.warning("checkpoint pointer refused: %s", e)
        return None
    with open(fd, "rb") as f:
        raw = f.read(4096)
    name = raw.decode("utf-8", "replace").strip()
    if name and not is_plain_name(name):
        log.warning("checkpoint pointer %s names %r, not an entry of %s; refused", root / LATEST, name, root)
        return None
    return name or None
