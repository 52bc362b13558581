"""The per-step in-memory tier: this rank's state after each step, in ``/dev/shm``, checksummed.

Crash recovery only (a restarted rank resumes from the last step instead of the last disk
checkpoint); the guard's and SDC's rollbacks use the verified tier (``snapshot.py``) when
SDC is on, because a per-step snapshot may hold state no SDC round has checked.

Layout: ``<snapshot_dir>/<run key>/rank<r>/step/slot{0,1}.{bin,meta,json}``. ``.bin`` holds the
raw bytes of every model and optimizer tensor at fixed, 64-byte-aligned offsets (a
memory-mapped tmpfs file: the copy into it *is* the snapshot); ``.meta`` the rest of the
state (scheduler, sampler, guard, RNG, optimizer hyper-parameters, with placeholders for the
tensors of ``.bin``) as a ``torch.save`` blob, loaded with ``weights_only=True``; ``.json`` the
marker (step, world size, sizes, xxHash3 of both files, tensor table), replaced atomically
and written last. A save writes the slot that does not hold the newest valid snapshot, after
deleting its marker, so a process killed mid-copy leaves the other slot intact.

The critical path is one memcpy of the state (plus under a millisecond for the small state,
measured: ``bench/stepsnap_overhead.py``); hashing, the marker and replication to a buddy
(:class:`Replica` — a hook: nothing sets it yet; issue 20's transport is meant to implement
it) run on a background thread,
and the next save waits for them first (``wait_s``: 0 unless a step is shorter than they
are). The tensor table is cached while the model and optimizer keep their storages (checked
every step from their data pointers: ~100 µs for a few hundred tensors) and rebuilt when they
change (a lazily created optimizer state, a new parameter).

Memory: 2 × this rank's model + optimizer state in tmpfs, which outlives the process (that
is the point) and is lost with the node. When it would take more than ``max_fraction`` of
the tmpfs, the tier turns itself off and says so (restarts then load from disk).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import io
import json
import logging
import mmap
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol

import torch

__all__ = ["StepSnapshots", "SnapshotStats", "SnapshotMismatch", "Replica", "STEP_TIER"]

log = logging.getLogger(__name__)

STEP_TIER = "step"
_PH = "__titan_snapshot_tensor__"
_ALIGN = 64
_VERSION = 2  # 2: .meta = cached static skeleton + per-step part (1: one blob)


class SnapshotMismatch(Exception):
    """The snapshot does not fit the current state's structure (model or optimizer changed)."""


class Replica(Protocol):
    """Where a rank's finished slot is copied so that it survives the node (issue 20's
    replication transport implements it). ``push`` runs on the background thread after the
    marker is written; ``fetch`` writes the newest replicated slot of ``rank`` into
    ``dest`` (the three files) and returns its step, or ``None``."""

    def push(self, rank: int, step: int, files: Mapping[str, Path]) -> None: ...

    def fetch(self, rank: int, dest: Path) -> int | None: ...


@dataclasses.dataclass
class SnapshotStats:
    """Seconds one save spent on each part (the critical path is ``wait_s + copy_s + small_s``)."""

    step: int
    bytes: int
    wait_s: float = 0.0     # waiting for the previous save's background part
    copy_s: float = 0.0     # memcpy of the model/optimizer tensors into the slot
    small_s: float = 0.0    # the rest of the state, serialised
    hash_s: float = 0.0     # background: xxHash3 of the slot
    replicate_s: float = 0.0  # background: Replica.push
    rebuilt: bool = False   # the tensor table was (re)built this step


def _xxh3(buf: Any) -> int:
    import xxhash

    return int(xxhash.xxh3_64_intdigest(buf))


def _leaves(obj: Any, path: tuple = ()) -> Any:
    """(path, tensor) of every tensor leaf of nested dicts/lists/tuples, in a stable order."""
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, path + (k,))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _leaves(v, path + (i,))


def _replace(obj: Any, fn: Callable[[tuple, torch.Tensor], Any], path: tuple = ()) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(path, obj)
    if isinstance(obj, dict):
        return {k: _replace(v, fn, path + (k,)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_replace(v, fn, path + (i,)) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return tuple(_replace(v, fn, path + (i,)) for i, v in enumerate(obj))
    return obj


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor whose bytes are stored: a DTensor's local shard, else the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def _storage_ptrs(app_state: Mapping[str, Any]) -> tuple[int, ...]:
    """Data pointers of every parameter, buffer and optimizer-state tensor (the signature)."""
    out: list[int] = []
    for obj in app_state.values():
        if isinstance(obj, torch.nn.Module):
            out.extend(_local(t).data_ptr() for t in obj.parameters())
            out.extend(_local(t).data_ptr() for t in obj.buffers())
        elif isinstance(obj, torch.optim.Optimizer):
            out.append(len(obj.state))
            for st in obj.state.values():
                out.extend(_local(v).data_ptr() for v in st.values() if isinstance(v, torch.Tensor))
    return tuple(out)


def _only_placeholders(obj: Any, top: bool = True) -> bool:
    """Every leaf is a tensor placeholder (``param_groups`` at the top level excepted)."""
    if isinstance(obj, dict):
        if set(obj) == {_PH}:
            return True
        return all(_only_placeholders(v, False) for k, v in obj.items() if not (top and k == "param_groups"))
    if isinstance(obj, (list, tuple)):
        return all(_only_placeholders(v, False) for v in obj)
    return False


def _big(app_state: Mapping[str, Any]) -> list[str]:
    return [k for k, v in app_state.items() if isinstance(v, (torch.nn.Module, torch.optim.Optimizer))]


@dataclasses.dataclass
class _Layout:
    """The cached tensor table of the model/optimizer part of the state."""

    signature: tuple[int, ...]
    skeleton: dict[str, Any]      # model/optimizer state dicts with placeholders
    sources: list[torch.Tensor]   # live tensors (their storages are the model's/optimizer's)
    table: list[list[Any]]        # [dtype, shape, offset, nbytes] per source
    size: int
    cached: bool                  # sources alias live storage: no collect() needed per step
    static: bytes | None = None   # the skeleton serialised once (``.meta``'s first part)


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


class _Slot:
    """One slot's three files; ``bin`` memory-mapped for writing."""

    def __init__(self, d: Path, k: int) -> None:
        self.k = k
        self.bin, self.meta, self.marker = d / f"slot{k}.bin", d / f"slot{k}.meta", d / f"slot{k}.json"
        self._mm: mmap.mmap | None = None
        self._views: list[torch.Tensor] | None = None
        self._views_of: int | None = None

    def mapped(self, size: int) -> mmap.mmap:
        if self._mm is None or len(self._mm) != max(size, 1):
            self.close()
            fd = os.open(self.bin, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                os.ftruncate(fd, max(size, 1))
                self._mm = mmap.mmap(fd, max(size, 1))
            finally:
                os.close(fd)
        return self._mm

    def views(self, layout: _Layout) -> list[torch.Tensor]:
        if self._views is None or self._views_of != id(layout) or self._mm is None:
            mm = self.mapped(layout.size)
            self._views = [_view(mm, dt, shape, off) for dt, shape, off, _ in
                           ((getattr(torch, d), s, o, n) for d, s, o, n in layout.table)]
            self._views_of = id(layout)
        return self._views

    def close(self) -> None:
        self._views = None
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # a tensor view still exported; dropped with the process
                pass
            self._mm = None


def _view(buf: Any, dtype: torch.dtype, shape: list[int], offset: int) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= int(s)
    if n == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buf, dtype=dtype, count=n, offset=offset).view(shape)


def _copy_out(mm: mmap.mmap, table: list[list[Any]], fills: list[tuple[torch.Tensor, int]]) -> None:
    """Copy each table entry out of ``mm`` into its destination (views die with this frame)."""
    with torch.no_grad():
        for dst, i in fills:
            if dst.numel():
                dt, shape, off, _n = table[i]
                dst.copy_(_view(mm, getattr(torch, dt), shape, off))


class StepSnapshots:
    """This rank's per-step snapshot slots (see the module doc). Not thread-safe: the loop's
    thread calls :meth:`save`; one background thread finishes each save."""

    def __init__(self, base: Path, key: str, rank: int, world: int, *, replica: Replica | None = None,
                 max_fraction: float = 0.5, background: bool = True) -> None:
        self.dir = Path(base) / key / f"rank{rank}" / STEP_TIER
        self.rank, self.world = rank, world
        self.replica = replica
        self.max_fraction = max_fraction
        self.off_reason: str | None = None
        self._layout: _Layout | None = None
        self._slots = [_Slot(self.dir, 0), _Slot(self.dir, 1)]
        self._newest: tuple[int, int] | None = None  # (slot, step) of the newest valid slot this process wrote
        self._pool = cf.ThreadPoolExecutor(1, thread_name_prefix="titan-stepsnap") if background else None
        self._pending: cf.Future | None = None
        self.last: SnapshotStats | None = None

    # --- saving -------------------------------------------------------------------------
    def _build(self, app_state: Mapping[str, Any], rank: int) -> _Layout:
        from titan.checkpoint.state import collect

        sig = _storage_ptrs(app_state)
        big = _big(app_state)
        full = collect({k: app_state[k] for k in big}, rank, with_rng=False) if big else {}
        live = set(sig)
        sources: list[torch.Tensor] = []
        table: list[list[Any]] = []
        off = 0
        cached = True

        def place(path: tuple, t: torch.Tensor) -> dict[str, int]:
            nonlocal off, cached
            loc = _local(t).detach()
            if loc.data_ptr() not in live and loc.numel() > 0:
                cached = False  # a tensor made by state_dict(), not the live one: collect every step
            if not loc.is_contiguous():
                cached, loc = False, loc.contiguous()
            nbytes = loc.numel() * loc.element_size()
            table.append([_dtype_name(loc.dtype), list(loc.shape), off, nbytes])
            sources.append(loc)
            off += -(-nbytes // _ALIGN) * _ALIGN
            return {_PH: len(sources) - 1}

        skeleton = _replace(full, place)
        # Anything but tensors and the optimizer's hyper-parameters (refreshed every step)
        # would go stale in a cached skeleton.
        cached = cached and all(_only_placeholders(skeleton[name]) for name in big)
        return _Layout(sig, skeleton, sources, table, off, cached)

    def _refresh(self, app_state: Mapping[str, Any], rank: int) -> tuple[_Layout, bool]:
        lay = self._layout
        if lay is not None and lay.cached and _storage_ptrs(app_state) == lay.signature:
            return lay, False
        new = self._build(app_state, rank)
        if lay is not None and not new.cached and new.table == lay.table:
            lay.sources, lay.skeleton, lay.static = new.sources, new.skeleton, None  # same table: keep the views
            return lay, False
        self._layout = new
        for s in self._slots:
            s.close()
        return new, True

    def _small(self, app_state: Mapping[str, Any], lay: _Layout, rank: int) -> bytes:
        """``.meta``: the skeleton (tensor placeholders, serialised once per layout) and the
        per-step part — live optimizer hyper-parameters, the other objects' state, the RNG.
        Pickling the skeleton's hundreds of placeholders every step cost ~10 ms (measured)."""
        from titan.checkpoint.state import RNG_KEY, capture_rng

        groups: dict[str, list[dict[str, Any]]] = {}
        other: dict[str, Any] = {}
        for name, obj in app_state.items():
            if name in lay.skeleton:
                if isinstance(obj, torch.optim.Optimizer):
                    groups[name] = [{k: v for k, v in g.items() if k != "params"} for g in obj.param_groups]
            else:
                other[name] = obj.state_dict()
        if lay.static is None:
            buf = io.BytesIO()
            torch.save(lay.skeleton, buf)
            lay.static = buf.getvalue()
        buf = io.BytesIO()
        torch.save({"groups": groups, "other": other, RNG_KEY: {f"rank{rank}": capture_rng()}}, buf)
        return len(lay.static).to_bytes(8, "little") + lay.static + buf.getvalue()

    @staticmethod
    def _read_small(meta: bytes) -> dict[str, Any]:
        """The state dict skeleton of a ``.meta`` (both parts merged; ``weights_only`` loads)."""
        from titan.checkpoint.state import RNG_KEY

        n = int.from_bytes(meta[:8], "little")
        if len(meta) < 8 + n:
            raise ValueError(f"meta of {len(meta)} bytes, its skeleton claims {n}")
        sk = torch.load(io.BytesIO(meta[8:8 + n]), weights_only=True)
        dyn = torch.load(io.BytesIO(meta[8 + n:]), weights_only=True)
        for name, live in dyn["groups"].items():
            part = sk[name]
            part["param_groups"] = [{**g, **lv} for g, lv in zip(part["param_groups"], live)]
        sk.update(dyn["other"])
        sk[RNG_KEY] = dyn[RNG_KEY]
        return sk

    def _pick(self) -> _Slot:
        if self._newest is None:
            marks = {s.k: self._marker(s) for s in self._slots}
            best = max((k for k, m in marks.items() if m), key=lambda k: marks[k]["step"], default=None)
            self._newest = (best, marks[best]["step"]) if best is not None else None
        return self._slots[1 if self._newest is not None and self._newest[0] == 0 else 0]

    def _space_ok(self, size: int) -> bool:
        from titan.checkpoint.snapshot import shm_space

        space = shm_space(self.dir)
        have = sum(s.bin.stat().st_size for s in self._slots if s.bin.exists())
        need = 2 * size - have
        if need > space["free_bytes"] or 2 * size > self.max_fraction * space["total_bytes"]:
            self.off_reason = (f"2 x {size / 2**20:.1f} MiB of state would not fit in {self.dir.parent.parent} "
                               f"({space['free_bytes'] / 2**20:.0f} MiB free of {space['total_bytes'] / 2**20:.0f} MiB, "
                               f"limit {self.max_fraction:.0%})")
            return False
        return True

    def save(self, step: int, app_state: Mapping[str, Any], rank: int | None = None) -> SnapshotStats | None:
        """Snapshot the state after ``step``: copy now, checksum/marker/replica in the background.

        Returns the stats of this save, or ``None`` when the tier is off (``off_reason``).
        Raises ``OSError`` (a full tmpfs); the slot written is then invalid, the other intact.
        """
        if self.off_reason is not None:
            return None
        rank = self.rank if rank is None else rank
        t0 = time.perf_counter()
        self.wait()
        t1 = time.perf_counter()
        self.dir.mkdir(parents=True, exist_ok=True)
        lay, rebuilt = self._refresh(app_state, rank)
        if rebuilt and not self._space_ok(lay.size):
            log.warning("per-step snapshots off: %s", self.off_reason)
            self.remove_files()
            return None
        slot = self._pick()
        slot.marker.unlink(missing_ok=True)
        if self._newest is not None and self._newest[0] == slot.k:
            self._newest = None
        t2 = time.perf_counter()
        for dst, src in zip(slot.views(lay), lay.sources):
            if dst.numel():
                dst.copy_(src)
        if any(s.is_cuda for s in lay.sources[:1]):
            torch.cuda.synchronize()
        t3 = time.perf_counter()
        small = self._small(app_state, lay, rank)
        t4 = time.perf_counter()
        st = SnapshotStats(step=step, bytes=lay.size + len(small), wait_s=t1 - t0, copy_s=t3 - t2,
                           small_s=t4 - t3, rebuilt=rebuilt)
        if self._pool is None:
            self._finish(slot, step, lay, small, st)
        else:
            self._pending = self._pool.submit(self._finish, slot, step, lay, small, st)
        self.last = st
        return st

    def _finish(self, slot: _Slot, step: int, lay: _Layout, small: bytes, st: SnapshotStats) -> SnapshotStats:
        t0 = time.perf_counter()
        mm = slot.mapped(lay.size)
        digest = _xxh3(memoryview(mm)[:lay.size])
        tmp = slot.meta.with_suffix(".meta.tmp")
        tmp.write_bytes(small)
        os.replace(tmp, slot.meta)
        marker = {"v": _VERSION, "step": step, "world": self.world, "rank": self.rank, "size": lay.size,
                  "xxh3": digest, "meta_size": len(small), "meta_xxh3": _xxh3(small), "tensors": lay.table,
                  "t": time.time()}
        tmp = slot.marker.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(marker, separators=(",", ":")))
        os.replace(tmp, slot.marker)
        self._newest = (slot.k, step)
        st.hash_s = time.perf_counter() - t0
        if self.replica is not None:
            t1 = time.perf_counter()
            try:
                self.replica.push(self.rank, step, {"bin": slot.bin, "meta": slot.meta, "json": slot.marker})
            except Exception as e:  # noqa: BLE001 - a lost buddy costs the copy, never the step
                log.warning("per-step snapshot %d not replicated: %s", step, e)
            st.replicate_s = time.perf_counter() - t1
        return st

    def wait(self) -> None:
        """Wait for the background part of the last save (re-raises what it raised)."""
        fut, self._pending = self._pending, None
        if fut is not None:
            fut.result()

    # --- reading ------------------------------------------------------------------------
    def _marker(self, slot: _Slot) -> dict[str, Any] | None:
        try:
            m = json.loads(slot.marker.read_text())
        except (OSError, ValueError):
            return None
        ok = isinstance(m, dict) and m.get("v") == _VERSION and m.get("world") == self.world \
            and isinstance(m.get("step"), int) and isinstance(m.get("size"), int)
        return m if ok else None

    def _valid(self, slot: _Slot) -> dict[str, Any] | None:
        m = self._marker(slot)
        if m is None:
            return None
        try:
            with open(slot.bin, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size < m["size"]:
                    raise ValueError(f"{slot.bin.name} is {size} bytes, the marker says {m['size']}")
                with mmap.mmap(f.fileno(), max(size, 1), access=mmap.ACCESS_READ) as mm:
                    bad = _xxh3(memoryview(mm)[:m["size"]]) != m["xxh3"]
            meta = slot.meta.read_bytes()
            bad = bad or len(meta) != m.get("meta_size") or _xxh3(meta) != m.get("meta_xxh3")
        except (OSError, ValueError) as e:
            log.warning("per-step snapshot slot %d of rank %d unreadable: %s", slot.k, self.rank, e)
            return None
        if bad:
            log.warning("per-step snapshot slot %d of rank %d fails its checksum; ignored", slot.k, self.rank)
            return None
        return m

    def valid_steps(self) -> list[int]:
        """Steps of the slots that pass their checksums (cost: one xxHash3 pass per slot)."""
        self.wait()
        return sorted(m["step"] for s in self._slots if (m := self._valid(s)) is not None)

    def discard_newer_than(self, step: int) -> None:
        """Invalidate slots newer than ``step`` (the run resumed from an older state: they
        belong to a trajectory that no longer leads here)."""
        self.wait()
        for s in self._slots:
            m = self._marker(s)
            if m is not None and m["step"] > step:
                s.marker.unlink(missing_ok=True)
        self._newest = None

    def fetch_from_replica(self) -> int | None:
        """No valid local slot: ask the :class:`Replica` for this rank's newest copy."""
        if self.replica is None:
            return None
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            return self.replica.fetch(self.rank, self.dir)
        except Exception as e:  # noqa: BLE001 - no copy: the disk checkpoint it is
            log.warning("per-step snapshot of rank %d not fetched from its replica: %s", self.rank, e)
            return None

    def load(self, step: int, app_state: Mapping[str, Any]) -> dict[str, Any]:
        """Load this rank's snapshot of ``step`` into ``app_state`` (local; no collective).

        Raises ``FileNotFoundError`` (no valid slot of that step) or :class:`SnapshotMismatch`
        (the state's structure changed) before anything is modified.
        """
        from titan.checkpoint.state import apply, collect

        self.wait()
        for slot in self._slots:
            m = self._valid(slot)
            if m is not None and m["step"] == step:
                break
        else:
            raise FileNotFoundError(f"no valid per-step snapshot of step {step} for rank {self.rank} in {self.dir}")
        sk = self._read_small(slot.meta.read_bytes())
        big = {k: app_state[k] for k in _big(app_state)}
        template = collect(big, self.rank, with_rng=False) if big else {}
        flat = dict(_leaves(template))
        table = m["tensors"]
        with open(slot.bin, "rb") as f, mmap.mmap(f.fileno(), max(m["size"], 1), access=mmap.ACCESS_COPY) as mm:
            fills: list[tuple[torch.Tensor, int]] = []

            def resolve(obj: Any, path: tuple = ()) -> Any:
                if isinstance(obj, dict) and set(obj) == {_PH}:
                    i = int(obj[_PH])
                    dt, shape, off, _n = table[i]
                    dst = flat.get(path)
                    if dst is None or list(_local(dst).shape) != list(shape) or _dtype_name(_local(dst).dtype) != dt:
                        raise SnapshotMismatch(f"{'/'.join(map(str, path))}: snapshot {dt}{shape}, state "
                                               f"{None if dst is None else (_local(dst).dtype, list(_local(dst).shape))}")
                    fills.append((_local(dst), i))
                    return dst
                if isinstance(obj, dict):
                    return {k: resolve(v, path + (k,)) for k, v in obj.items()}
                if isinstance(obj, list):
                    return [resolve(v, path + (i,)) for i, v in enumerate(obj)]
                if isinstance(obj, tuple):
                    return tuple(resolve(v, path + (i,)) for i, v in enumerate(obj))
                return obj

            sd = resolve(sk)
            missing = [k for k in app_state if k not in sd]
            if missing:
                raise SnapshotMismatch(f"the snapshot has no state for {missing}")
            _copy_out(mm, table, fills)
        apply(app_state, sd)
        self._newest = (slot.k, step)
        return {"bytes": m["size"] + m["meta_size"], "slot": slot.k}

    # --- housekeeping -------------------------------------------------------------------
    def close(self) -> None:
        """Finish the save in flight and stop the background thread (slots stay)."""
        try:
            self.wait()
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
            for s in self._slots:
                s.close()

    def remove_files(self) -> None:
        """Delete this rank's per-step slots (the job is over, or the tier turned off)."""
        for s in self._slots:
            s.close()
        shutil.rmtree(self.dir, ignore_errors=True)
