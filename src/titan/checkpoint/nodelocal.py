"""Checkpoints on node-local storage: each node writes its own shards, a buddy keeps a copy.

Save (every rank, on the save's process group), after DCP wrote each rank's shard into
its own node's ``step-N.partial/`` and the coordinator wrote ``.metadata`` on its node:

1. every rank sends its files to the buddy domain's replica server (``titan.replica``;
   set ``ckpt/step-N/rank<r>``, CRC-32 checked on arrival; disk or memory there);
2. every rank's sums and replication receipt are gathered (JSON over the process group —
   no node reads another node's files); the coordinator builds the manifest (version 2,
   with ``placement``) only when every copy was acknowledged, and broadcasts it with the
   ``.metadata`` bytes;
3. each domain's leader writes both into its partial directory and commits locally
   (rename, ``latest``), prunes, and drops the replicas of pruned steps it holds.

A step counts as saved only after step 1 succeeded on every rank.

Restore: every domain's leader reports what it holds (committed steps with their manifests,
the replicas in its server); all ranks choose the same newest step whose every file exists
somewhere, and each leader assembles a complete local copy — its own verified files, the
rest fetched (and CRC-checked) from other nodes' folders or from the replicas their buddies
keep, a file that fails its check on disk fetched again. Then DCP loads as on shared storage.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from titan.checkpoint import commit as _commit
from titan.checkpoint import manifest as _mf
from titan.checkpoint.collectives import broadcast_bytes, gather_json
from titan.checkpoint.commit import ReplicationFailed
from titan.checkpoint.layout import REPLICA_PREFIX, Layout, replica_key_from_env

if TYPE_CHECKING:
    from titan.checkpoint.checkpointer import Checkpointer

__all__ = ["save_nodelocal", "restore_nodelocal", "ReplicationFailed", "replica_set"]

log = logging.getLogger(__name__)


def replica_set(step: int, rank: int) -> str:
    return f"{REPLICA_PREFIX}/{_mf.step_dir_name(step)}/rank{rank}"


def _client(ck: "Checkpointer") -> Any:
    from titan.replica import ReplicaClient

    key = replica_key_from_env()
    if key is None:
        raise ReplicationFailed("no replication key (TITAN_REPLICA_KEY): not started by titan run")
    return ReplicaClient(key, context=ck.ctx.run_dir.run_id, timeout_s=ck.cfg.replica_timeout_s)


# --- save ---------------------------------------------------------------------------------

def save_nodelocal(ck: "Checkpointer", lay: Layout, step: int, writer: Any, group: Any) -> dict[str, Any]:
    """Steps 1-3 of the module doc, after ``dcp.save`` returned on every rank.

    Collective on ``group``. Returns ``path`` (this node's committed directory on a domain
    leader, else ``None``), ``replica_s`` (the slowest rank's buddy copy) and
    ``replica_bytes``; raises ``ReplicationFailed`` on every rank when any copy failed.
    """
    import torch.distributed as dist

    part = _commit.partial_dir(ck.root, step)
    mine = {n: {"size": s, "crc32": c} for n, (s, c) in writer.fs.sums.items() if not n.startswith(".")}
    buddy = lay.buddy(lay.domain)
    target = lay.endpoint_of(buddy)
    receipt: dict[str, Any] = {"to": lay.name_of(buddy), "endpoint": target, "error": None, "bytes": 0, "s": 0.0}
    t0 = time.monotonic()
    try:
        with _client(ck) as cl:
            for name, want in sorted(mine.items()):
                got = cl.put(target, replica_set(step, lay.rank), name, part / name, crc32=want["crc32"])
                receipt["bytes"] += got.size
    except Exception as e:  # noqa: BLE001 - reported to every rank below
        receipt["error"] = f"{type(e).__name__}: {e}"[:400]
    receipt["s"] = round(time.monotonic() - t0, 4)
    everyone = gather_json({"rank": lay.rank, "node": lay.nodes[lay.rank], "files": mine, "replica": receipt}, group)
    failed = [f"rank {e['rank']} → {e['replica']['to']}: {e['replica']['error']}" for e in everyone
              if e["replica"]["error"]]
    if failed:
        raise ReplicationFailed("buddy copy not acknowledged: " + "; ".join(failed))
    coordinator = dist.get_rank(group) == 0 if group is not None else lay.rank == 0
    meta = (part / ".metadata").read_bytes() if coordinator else None
    meta = broadcast_bytes(meta, src=_global_rank0(group), group=group)
    manifest_raw = None
    if coordinator:
        files: dict[str, dict[str, int]] = {}
        placement: dict[str, dict[str, Any]] = {}
        for e in everyone:
            for name, sums in e["files"].items():
                files[name] = sums
                placement[name] = {"rank": e["rank"], "node": e["node"], "replica": e["replica"]["to"]}
        placement[".metadata"] = {"rank": lay.rank, "node": lay.nodes[lay.rank], "replica": None}
        info = {"step": step, "world_size": len(lay.nodes), "seed": ck.seed, "mode": ck.cfg.mode}
        layout = {"storage": "node-local", "domains": [lay.name_of(k) for k in range(len(lay.domains))],
                  "placement": placement, "replicate": lay.replicate}
        manifest = _mf.build_manifest(part, info, metadata_sum=(len(meta), zlib.crc32(meta)), files=files,
                                      layout=layout)
        manifest_raw = json.dumps(manifest, indent=1, sort_keys=True).encode()
    manifest = json.loads(broadcast_bytes(manifest_raw, src=_global_rank0(group), group=group))
    final: Path | None = None
    problem = None
    if lay.is_leader:
        try:
            final = _commit_local(ck, part, step, meta, manifest)
            _prune_local(ck, lay)
        except Exception as e:  # noqa: BLE001 - gathered below
            problem = f"{lay.name_of(lay.domain)}: {type(e).__name__}: {e}"[:400]
    problems = [p for p in gather_json(problem, group) if p]
    if problems:
        raise ReplicationFailed("local commit failed on " + "; ".join(problems))
    return {"path": final, "replica_s": max(e["replica"]["s"] for e in everyone),
            "replica_bytes": sum(e["replica"]["bytes"] for e in everyone),
            "replicated_to": sorted({e["replica"]["to"] for e in everyone})}


def _global_rank0(group: Any) -> int:
    import torch.distributed as dist

    return 0 if group is None else dist.get_global_rank(group, 0)


def _commit_local(ck: "Checkpointer", part: Path, step: int, meta: bytes, manifest: dict[str, Any]) -> Path:
    """Write ``.metadata`` (unless this node wrote it) and the manifest, then commit here."""
    mpath = part / ".metadata"
    if not mpath.is_file() or mpath.read_bytes() != meta:
        _write_file(mpath, meta, ck.cfg.fsync)
    _mf.write_manifest(part, manifest, fsync=ck.cfg.fsync)
    return _commit.commit(ck.root, step, fsync=ck.cfg.fsync)


def _prune_local(ck: "Checkpointer", lay: Layout) -> None:
    removed = _commit.prune(ck.root, ck.cfg.keep_last, ck.cfg.keep_every)
    if removed:
        log.info("retention removed %s", ", ".join(p.name for p in removed))
    kept = {p.name for _, p in _mf.list_committed(ck.root)}
    ep = lay.endpoint_of(lay.domain)
    try:
        with _client(ck) as cl:
            held = cl.list(ep, REPLICA_PREFIX)
            keep = [s for s in held if s.split("/")[1] in kept]
            dropped = cl.retain(ep, REPLICA_PREFIX, keep)
        if dropped:
            log.info("dropped %d replica set(s) of pruned steps", len(dropped))
    except Exception as e:  # noqa: BLE001 - stale replicas cost space, not correctness
        log.warning("could not prune the replicas on %s: %s", ep, e)


def _write_file(path: Path, data: bytes, fsync: bool) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


# --- restore ------------------------------------------------------------------------------

def _inventory(ck: "Checkpointer", lay: Layout) -> dict[str, Any] | None:
    """What this domain holds (leaders only): committed steps with manifests, replicas."""
    if not lay.is_leader:
        return None
    for p in _commit.clean_partials(ck.root):
        log.info("removed unfinished save %s", p.name)
    steps: dict[str, Any] = {}
    for step, path in _mf.list_committed(ck.root):
        try:
            m = _mf.read_manifest(path)
        except ValueError as e:
            steps[str(step)] = {"manifest": None, "problem": str(e), "files": {}}
            continue
        present = {}
        for name in m["files"]:
            try:
                present[name] = (path / name).stat().st_size
            except OSError:
                continue
        steps[str(step)] = {"manifest": m, "files": present}
    replicas: dict[str, dict[str, list[int]]] = {}
    ep = lay.endpoint_of(lay.domain)
    if ep:
        try:
            with _client(ck) as cl:
                for set_id, blobs in cl.list(ep, REPLICA_PREFIX).items():
                    replicas[set_id] = {n: [i.size, i.crc32] for n, i in blobs.items()}
        except Exception as e:  # noqa: BLE001 - this node's server is gone: no replicas here
            log.warning("replica server %s not listed: %s", ep, e)
    export_ok = bool(lay.exports[lay.rank]) and Path(lay.exports[lay.rank] or "").resolve() == Path(ck.root).resolve()
    return {"domain": lay.domain, "node": lay.name_of(lay.domain), "endpoint": ep, "export": export_ok,
            "steps": steps, "replicas": replicas, "durable": _durable_steps(ck) if lay.rank == 0 else {}}


def _durable_steps(ck: "Checkpointer") -> dict[str, Any]:
    """The durable tier's committed steps with their manifests (listed once, by rank 0)."""
    from titan.checkpoint.durable import open_tier

    tier = open_tier(ck)
    if tier is None:
        return {}
    try:
        return {str(s): m for s, m in tier.steps().items() if isinstance(m, dict)}
    except Exception as e:  # noqa: BLE001 - an unreachable store: the nodes' copies still count
        log.warning("durable tier %s not listed: %s", tier.describe(), e)
        return {}


def _choose_manifest(invs: list[dict[str, Any]], step: int) -> dict[str, Any] | None:
    votes: dict[str, list[dict[str, Any]]] = {}
    for inv in invs:
        m = (inv["steps"].get(str(step)) or {}).get("manifest")
        if m:
            votes.setdefault(json.dumps(m, sort_keys=True), []).append(m)
    if not votes:  # no node holds it: the durable tier's copy, if any
        return next((i["durable"][str(step)] for i in invs if str(step) in i.get("durable", {})), None)
    return max(votes.values(), key=len)[0]


def _holders(invs: list[dict[str, Any]], step: int, name: str, want: dict[str, int], me: int) -> list[tuple[str, str]]:
    """(endpoint, set id) that can hand out ``name`` of ``step``: other nodes' committed copies,
    then replicas (this node's own server first)."""
    out = []
    dname = _mf.step_dir_name(step)
    for inv in invs:
        if inv["domain"] == me or not inv["endpoint"]:
            continue
        st = inv["steps"].get(str(step)) or {}
        if inv["export"] and st.get("files", {}).get(name) == want["size"]:
            out.append((inv["endpoint"], f"@ckpt/{dname}"))
    # Replicas: the ones this node's own server keeps for its buddy first (no network hop).
    for inv in sorted(invs, key=lambda i: i["domain"] != me):
        if not inv["endpoint"]:
            continue
        for set_id, blobs in inv["replicas"].items():
            if set_id.split("/")[1:2] == [dname] and blobs.get(name) == [want["size"], want["crc32"]]:
                out.append((inv["endpoint"], set_id))
    # Last resort: the durable tier (a lost node *and* its buddy, or every node replaced).
    for inv in invs:
        files = (inv.get("durable", {}).get(str(step)) or {}).get("files") or {}
        if files.get(name) == want:
            out.append((DURABLE, str(step)))
    return out


#: The holder name of the durable tier in ``_holders`` and ``fetched_from``.
DURABLE = "durable"


def _assemble(ck: "Checkpointer", lay: Layout, invs: list[dict[str, Any]], step: int,
              manifest: dict[str, Any]) -> dict[str, Any]:
    """Make ``step`` complete and verified in this node's folder (leaders). Never raises."""
    from titan.replica import BlobInfo

    dname = _mf.step_dir_name(step)
    final = ck.root / dname
    out: dict[str, Any] = {"problems": [], "fetched": {}, "bytes": 0, "repaired": [], "verified_bytes": 0}
    work = final if final.is_dir() else _commit.partial_dir(ck.root, step)
    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        out["problems"].append(f"{lay.name_of(lay.domain)}: cannot assemble {dname}: {e}")
        return out
    try:
        cl = _client(ck)
    except ReplicationFailed as e:  # no replicas to ask; the durable tier may still serve
        cl, no_client = None, str(e)
    tier = None
    with cl or contextlib.nullcontext():
        for name, want in sorted(manifest["files"].items()):
            local = work / name
            bad = None
            if local.is_file():
                size, crc = _mf.crc32_file(local) if ck.cfg.verify_on_load else (local.stat().st_size, want["crc32"])
                if size == want["size"] and crc == want["crc32"]:
                    out["verified_bytes"] += size
                    continue
                bad = f"size {size} CRC-32 {crc:08x}"
            tried = []
            for endpoint, set_id in _holders(invs, step, name, want, lay.domain):
                try:
                    if endpoint == DURABLE:
                        from titan.checkpoint.durable import open_tier

                        tier = tier or open_tier(ck)
                        assert tier is not None
                        tier.fetch(step, name, local, want)
                    elif cl is None:
                        raise ReplicationFailed(no_client)
                    else:
                        cl.get(endpoint, set_id, name, into=local, expect=BlobInfo(want["size"], want["crc32"]))
                except Exception as e:  # noqa: BLE001 - try the next holder
                    tried.append(f"{set_id} on {endpoint}: {e}")
                    continue
                src = DURABLE if endpoint == DURABLE else next(
                    (i["node"] for i in invs if i["endpoint"] == endpoint), endpoint)
                out["fetched"][src] = out["fetched"].get(src, 0) + 1
                out["bytes"] += want["size"]
                if bad:
                    out["repaired"].append(f"{name} ({bad} here)")
                break
            else:
                why = f"damaged here ({bad})" if bad else "missing here"
                out["problems"].append(f"{lay.name_of(lay.domain)}: {name} {why} and on no other node"
                                       + (f" ({'; '.join(tried)[:300]})" if tried else ""))
    if out["problems"]:
        return out
    try:
        if work != final:
            _mf.write_manifest(work, manifest, fsync=ck.cfg.fsync)
            _commit.commit(ck.root, step, fsync=ck.cfg.fsync)
        elif _mf.read_manifest(final) != manifest:
            _mf.write_manifest(final, manifest, fsync=ck.cfg.fsync)
    except (OSError, ValueError, RuntimeError) as e:
        out["problems"].append(f"{lay.name_of(lay.domain)}: could not commit the assembled {dname}: {e}")
    return out


def restore_nodelocal(ck: "Checkpointer", lay: Layout, app_state: Mapping[str, Any], snap_step: int,
                      load_disk: Any, corrupt: Any, memory_note: str | None = None) -> tuple[int, bool, int]:
    """Choose and load the newest step every file of which exists on some node.

    Collective on ``ck._ctl``. Returns (step loaded or 0, whether a load touched the live
    state, how many candidates were tried). ``load_disk(path, manifest)`` and
    ``corrupt(paths, problems)`` are the shared-storage restore's own steps;
    ``memory_note`` says why a newer in-memory snapshot was not used (``ckpt.loaded``'s ``memory``).
    """
    from torch.distributed.checkpoint.api import CheckpointException

    invs = [i for i in gather_json(_inventory(ck, lay), ck._ctl) if i is not None]
    steps = sorted({int(s) for inv in invs for s, st in inv["steps"].items() if st.get("manifest")}
                   | {int(s) for inv in invs for s in inv.get("durable", {})}, reverse=True)
    touched = False
    tried = 0
    for step in steps:
        if snap_step > step:
            break
        tried += 1
        t0 = time.monotonic()
        manifest = _choose_manifest(invs, step)
        res = _assemble(ck, lay, invs, step, manifest) if lay.is_leader and manifest else None
        reports = [r for r in gather_json(res, ck._ctl) if r is not None]
        problems = [p for r in reports for p in r["problems"]]
        assemble_s = time.monotonic() - t0
        path = ck.root / _mf.step_dir_name(step)
        if not problems:
            t1 = time.monotonic()
            err = None
            touched = True
            try:
                info = load_disk(path, manifest)
            except (Exception, CheckpointException) as e:  # CheckpointException is a BaseException
                err = f"load failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"
                info = {}
            errs = gather_json(err, ck._ctl)
            problems = [f"rank {r}: {e}" for r, e in enumerate(errs) if e]
            if not problems:
                fetched: dict[str, int] = {}
                for r in reports:
                    for n, k in r["fetched"].items():
                        fetched[n] = fetched.get(n, 0) + k
                names = [f"durable storage {ck.cfg.persist_dir}" if n == DURABLE else n for n in sorted(fetched)]
                ck.ctx.events.emit("ckpt.loaded", f"resumed from {path.name} (node-local"
                                   + (f"; {sum(fetched.values())} file(s) fetched from {', '.join(names)}"
                                      if fetched else "") + ")" + (f" (in memory: {memory_note})" if memory_note else ""),
                                   step=step, data={
                    "step": step, "path": str(path), "source": DURABLE if DURABLE in fetched else "disk",
                    "storage": "node-local", "memory": memory_note,
                    "verify_s": assemble_s, "load_s": time.monotonic() - t1, "bytes": manifest.get("bytes", 0),
                    "verified_bytes": sum(r["verified_bytes"] for r in reports),
                    "fetched_files": sum(fetched.values()), "fetched_from": fetched,
                    "fetched_bytes": sum(r["bytes"] for r in reports),
                    "repaired": [x for r in reports for x in r["repaired"]], **info})
                return step, True, tried
        corrupt(path if path.is_dir() and lay.is_leader else None, problems or ["no manifest agreed"])
    return 0, touched, tried


def drop_partial(ck: "Checkpointer", lay: Layout, step: int) -> None:
    """A failed save: its leader removes this node's partial directory."""
    if lay.is_leader:
        shutil.rmtree(_commit.partial_dir(ck.root, step), ignore_errors=True)
