"""The durable tier: every K-th checkpoint also copied to storage that outlives the nodes.

``checkpoint.persist_every_steps = K`` and ``checkpoint.persist_dir`` (a folder every node
sees, or an fsspec URL): after a checkpoint of a step that is a multiple of K committed
(node-local or shared), the same save — on its background thread in async mode, so off the
training loop — copies it there:

1. every rank copies the files it wrote (its DCP shard; the coordinator also ``.metadata``)
   from its own node's committed folder, checking size and CRC-32 against what it wrote while
   copying (local rot is never persisted);
2. the copies' receipts are gathered as JSON over the save's process group; only when every
   file of the committed manifest arrived intact does the coordinator commit: the same
   manifest, written last, then — in a folder — the rename from ``step-N.partial`` and
   ``latest`` (``titan.checkpoint.commit``, the engine of every other save); on an fsspec
   store, where rename is not atomic, the manifest written last *is* the commit;
3. the coordinator prunes the tier to the newest ``persist_keep_last`` (a deletion removes
   the manifest first, so a kill mid-delete never leaves a committed-looking step).

Restore reads the tier when the nodes' own copies are not enough (``restore`` for shared
storage, ``nodelocal`` for node-local storage): files fetched from it are CRC-checked on
arrival and appear under their name only then. A failed copy is ``ckpt.persist_failed``
(warning); training and the local checkpoint are unaffected.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Iterator

from titan.checkpoint import commit as _commit
from titan.checkpoint import manifest as _mf
from titan.settings.checkpoint import is_url
from titan.security.paths import PathEscape, confined, is_plain_name, open_regular

if TYPE_CHECKING:
    from titan.checkpoint.checkpointer import Checkpointer

__all__ = ["DurableTier", "DurableError", "open_tier", "is_url", "persist_due", "persist", "fetch_step"]

_CHUNK = 8 << 20


class DurableError(RuntimeError):
    """A file of the durable tier could not be written or read intact."""


def persist_due(cfg: Any, step: int) -> bool:
    """Whether the checkpoint of ``step`` is also copied to the durable tier (same on every rank)."""
    return bool(cfg.persist_every_steps and cfg.persist_dir) and step % cfg.persist_every_steps == 0


def _name(name: str) -> str:
    if not is_plain_name(name):
        raise DurableError(f"refused file name {name!r} (a manifest names files inside its step only)")
    return name


class DurableTier:
    """Committed checkpoints under a folder (``titan.checkpoint.commit``'s protocol) or an
    fsspec URL (manifest written last). Every method raises ``OSError``/``DurableError``."""

    def __init__(self, where: str, *, fsync: bool = True) -> None:
        self.where, self.fsync = where, fsync
        self.url = is_url(where)
        if self.url:
            import fsspec

            self.fs, self.base = fsspec.core.url_to_fs(where)
            self.base = self.base.rstrip("/")
        else:
            self.root = Path(where)

    def describe(self) -> str:
        return self.where

    # --- writing (one step at a time, coordinated by ``persist``) -------------------------
    def _sdir(self, step: int) -> str:
        return f"{self.base}/{_mf.step_dir_name(step)}"

    def begin(self, step: int) -> None:
        """Make an empty place for ``step`` (coordinator, before anyone copies)."""
        if self.url:
            self._remove(self._sdir(step))
            self.fs.makedirs(self._sdir(step), exist_ok=True)
        else:
            part = _commit.partial_dir(self.root, step)
            shutil.rmtree(part, ignore_errors=True)
            part.mkdir(parents=True)

    @contextlib.contextmanager
    def writer(self, step: int, name: str) -> Iterator[BinaryIO]:
        """A stream for one file of ``step`` (any rank, after ``begin``), durable when closed."""
        name = _name(name)
        if self.url:
            with self.fs.open(f"{self._sdir(step)}/{name}", "wb") as f:
                yield f
            return
        with open(_commit.partial_dir(self.root, step) / name, "wb") as f:
            yield f
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())

    def commit(self, step: int, manifest: dict[str, Any]) -> str:
        """The manifest last; in a folder also the rename and ``latest``. Returns where."""
        if self.url:
            d = self._sdir(step)
            self.fs.pipe_file(f"{d}/{_mf.MANIFEST}", _mf.manifest_bytes(manifest))
            self.fs.pipe_file(f"{self.base}/{_mf.LATEST}", (_mf.step_dir_name(step) + "\n").encode())
            return f"{self.where.rstrip('/')}/{_mf.step_dir_name(step)}"
        part = _commit.partial_dir(self.root, step)
        _mf.write_manifest(part, manifest, fsync=self.fsync)
        return str(_commit.commit(self.root, step, fsync=self.fsync))

    def abort(self, step: int) -> None:
        if self.url:
            with contextlib.suppress(OSError, DurableError):
                self._remove(self._sdir(step))
        else:
            shutil.rmtree(_commit.partial_dir(self.root, step), ignore_errors=True)

    def _remove(self, d: str) -> None:
        # The manifest first: what is left after a kill never looks committed.
        if self.fs.exists(f"{d}/{_mf.MANIFEST}"):
            self.fs.rm_file(f"{d}/{_mf.MANIFEST}")
        if self.fs.exists(d):
            self.fs.rm(d, recursive=True)

    def prune(self, keep_last: int) -> list[int]:
        """Delete committed steps beyond the newest ``keep_last``; returns their steps."""
        if not self.url:
            return [int(_mf.parse_step(p.name) or 0) for p in _commit.prune(self.root, keep_last, 0)]
        steps = sorted(self.steps())
        doomed = steps[:-keep_last] if keep_last else steps
        for s in doomed:
            self._remove(self._sdir(s))
        return doomed

    # --- reading ----------------------------------------------------------------------
    def steps(self) -> dict[int, dict[str, Any] | str]:
        """Every committed-looking step: its manifest, or why it cannot be read (a string)."""
        out: dict[int, dict[str, Any] | str] = {}
        if not self.url:
            for step, path in _mf.list_committed(self.root):
                try:
                    out[step] = _mf.read_manifest(path)
                except ValueError as e:
                    out[step] = str(e)
            return out
        try:
            names = [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(self.base, detail=False)]
        except FileNotFoundError:
            return out
        for n in names:
            step = _mf.parse_step(n)
            if step is None:
                continue
            mpath = f"{self._sdir(step)}/{_mf.MANIFEST}"
            try:
                if not self.fs.exists(mpath):
                    continue  # an unfinished copy: never a candidate
                size = self.fs.size(mpath)
                if size is not None and size > _mf.MAX_MANIFEST_BYTES:
                    raise ValueError(f"manifest larger than {_mf.MAX_MANIFEST_BYTES >> 20} MiB")
                out[step] = _mf.parse_manifest(self.fs.cat_file(mpath))
            except (OSError, ValueError) as e:
                out[step] = str(e)
        return out

    @contextlib.contextmanager
    def reader(self, step: int, name: str) -> Iterator[BinaryIO]:
        name = _name(name)
        if self.url:
            with self.fs.open(f"{self._sdir(step)}/{name}", "rb") as f:
                yield f
            return
        try:
            path = confined(self.root / _mf.step_dir_name(step), name, what="durable file")
            fd = open_regular(path, what="durable file")
        except PathEscape as e:
            raise DurableError(str(e)) from None
        with open(fd, "rb") as f:
            yield f

    def fetch(self, step: int, name: str, into: Path, want: dict[str, int]) -> int:
        """Copy one file of ``step`` to ``into``; it appears there only with the manifest's
        size and CRC-32 (``DurableError`` otherwise). Returns the bytes copied."""
        tmp = into.with_name(f".{into.name}.durable{os.getpid()}")
        ok = False
        try:
            with self.reader(step, name) as src, open(tmp, "wb") as dst:
                n = _copy(src, dst, want, f"{_mf.step_dir_name(step)}/{name} in {self.where}")
                dst.flush()
                os.fsync(dst.fileno())
            os.replace(tmp, into)
            ok = True
            return n
        finally:
            if not ok:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)


def _copy(src: BinaryIO, dst: BinaryIO, want: dict[str, int], what: str) -> int:
    crc, n = 0, 0
    while True:
        chunk = src.read(_CHUNK)
        if not chunk:
            break
        crc = zlib.crc32(chunk, crc)
        n += len(chunk)
        dst.write(chunk)
    if n != want["size"] or crc != want["crc32"]:
        raise DurableError(f"{what}: {n} bytes CRC-32 {crc:08x}, the manifest says {want['size']} bytes "
                           f"{want['crc32']:08x}")
    return n


def open_tier(ck: "Checkpointer") -> DurableTier | None:
    """The job's durable tier (``None`` when ``persist_dir`` is not set)."""
    return DurableTier(ck.cfg.persist_dir, fsync=ck.cfg.fsync) if ck.cfg.persist_dir else None


# --- save ---------------------------------------------------------------------------------

def persist(ck: "Checkpointer", step: int, own: dict[str, tuple[int, int]], ok: bool, group: Any) -> dict[str, Any] | None:
    """Copy the just-committed checkpoint of ``step`` to the durable tier (see module doc).

    Collective on ``group`` (every rank of the save, whether or not its part of the save
    succeeded: ``ok``). ``own``: the files this rank wrote (name → size, CRC-32). Returns
    ``{"persist_s", "persisted"}`` on every rank, or ``None`` when the save itself had
    failed somewhere. Never raises for a failed copy: ``ckpt.persist_failed`` says why.
    """
    from titan.checkpoint.collectives import broadcast_json, gather_json, world_of

    t0 = time.monotonic()
    tier = open_tier(ck)
    assert tier is not None
    coord = ck.rank == 0
    src = ck.root / _mf.step_dir_name(step)
    manifest = None
    err = None
    if coord and ok:
        try:
            manifest = _mf.read_manifest(src)
            tier.begin(step)
        except (OSError, ValueError, DurableError) as e:
            err = f"rank 0: cannot start: {type(e).__name__}: {e}"[:400]
    flags = gather_json({"ok": ok, "err": err}, group)  # also: rank 0's local commit is done
    if not all(f["ok"] for f in flags):
        if coord and manifest is not None:
            tier.abort(step)
        return None
    start_err = next((f["err"] for f in flags if f["err"]), None)
    receipt: dict[str, Any] = {"rank": ck.rank, "files": {}, "error": None}
    if start_err is None:
        mine = {n: v for n, v in own.items() if not n.startswith(".")}
        if coord:
            mine[".metadata"] = (-1, -1)  # checked against the manifest below
        try:
            for name, (size, crc) in sorted(mine.items()):
                want = {"size": size, "crc32": crc}
                if coord and name == ".metadata":
                    want = manifest["files"][".metadata"]
                with _local(src, name) as f, tier.writer(step, name) as out:
                    _copy(f, out, want, f"{src.name}/{name} on {ck.ctx.node}")
                receipt["files"][name] = [want["size"], want["crc32"]]
        except (OSError, DurableError, PathEscape, KeyError) as e:
            receipt["error"] = f"rank {ck.rank}: {type(e).__name__}: {e}"[:400]
    receipts = gather_json(receipt, group)
    result: dict[str, Any] = {"ok": False, "where": None, "error": start_err, "pruned": []}
    if coord and start_err is None:
        errors = [r["error"] for r in receipts if r["error"]]
        got = {n: v for r in receipts for n, v in r["files"].items()}
        missing = [n for n, w in manifest["files"].items() if got.get(n) != [w["size"], w["crc32"]]]
        if not errors and missing:
            errors = [f"not copied intact by any rank: {', '.join(sorted(missing)[:5])}"]
        if errors:
            result["error"] = "; ".join(errors)[:800]
            tier.abort(step)
        else:
            try:
                result["where"] = tier.commit(step, manifest)
                result["pruned"] = tier.prune(ck.cfg.persist_keep_last)
                result["ok"] = True
            except (OSError, ValueError, RuntimeError, DurableError) as e:
                result["error"] = f"commit: {type(e).__name__}: {e}"[:800]
                tier.abort(step)
    if world_of(group) > 1:
        import torch.distributed as dist

        result = broadcast_json(result, src=0 if group is None else dist.get_global_rank(group, 0), group=group)
    took = round(time.monotonic() - t0, 4)
    if coord:
        if result["ok"]:
            ck.ctx.events.emit("ckpt.persisted", f"checkpoint step {step} copied to durable storage "
                               f"{tier.describe()} ({took:.2f}s)", step=step,
                               data={"step": step, "where": result["where"], "seconds": took,
                                     "bytes": int(manifest.get("bytes", 0)) if manifest else 0,
                                     "pruned": result["pruned"], "dir": tier.describe()})
        else:
            ck.ctx.events.emit("ckpt.persist_failed", f"checkpoint step {step} not copied to durable storage "
                               f"{tier.describe()}: {result['error']}", level="warning", step=step,
                               data={"step": step, "error": result["error"], "dir": tier.describe()})
    return {"persist_s": took, "persisted": bool(result["ok"])}


@contextlib.contextmanager
def _local(step_dir: Path, name: str) -> Iterator[BinaryIO]:
    with open(open_regular(confined(step_dir, _name(name), what="checkpoint file")), "rb") as f:
        yield f


# --- restore ------------------------------------------------------------------------------

def fetch_step(tier: DurableTier, step: int, manifest: dict[str, Any], root: Path, *, fsync: bool = True) -> Path:
    """Copy the whole of ``step`` from the tier into the checkpoint folder ``root`` and commit
    it there (``step-N.partial`` → ``step-N``, ``latest``); every file CRC-checked on
    arrival. For one folder that holds every file (shared storage). Raises on failure,
    leaving no committed-looking directory."""
    part = _commit.partial_dir(root, step)
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    try:
        for name, want in sorted(manifest["files"].items()):
            tier.fetch(step, name, part / _name(name), want)
        _mf.write_manifest(part, manifest, fsync=fsync)
        return _commit.commit(root, step, fsync=fsync)
    except BaseException:
        shutil.rmtree(part, ignore_errors=True)
        raise
