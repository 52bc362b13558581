"""What the buddy copy of node-local checkpoints costs, side by side in one run.

Two "nodes" × one rank each (gloo over loopback, ``torch.multiprocessing``), the reference
workload's state (+ AdamW), asynchronous saves, three storage set-ups in turn:

- **shared**: both ranks write into one folder (no replication: today's shared storage);
- **node-local, disk**: each node its own folder, every shard copied to the buddy node's
  replica server, which keeps it on its disk (``checkpoint.replicate=auto``);
- **node-local, memory**: the same, the buddy keeps the copy in memory (``=memory``).

Per save each rank measures, right before it, the in-memory copy of its state (the staging
floor: ``Stager.stage`` into reused buffers) and, right after it, an in-memory copy of as
many bytes as its own shard (what the buddy copy moves); the save's training stall, its
background total and the buddy copy's time come from its ``ckpt.saved`` event. The replica
servers run in this process, as ``titan run`` hosts them.

Usage: ``python bench/replication_cost.py [--preset 100m] [--saves 3] [--dir DIR] [--json]``.
Prints a Markdown block for ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

KEY = b"b" * 32
RUN = "bench"
NODES = ("nodeA", "nodeB")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, spec: dict[str, Any]) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(Path(__file__).parent))
    from checkpoint_stall import _state  # the same state as the checkpoint-stall bench

    from titan.checkpoint import Checkpointer
    from titan.checkpoint.staging import Stager
    from titan.checkpoint.state import collect
    from titan.events import read_run
    from titan.settings import load_settings
    from titan.worker import WorkerContext

    node = NODES[rank]
    os.environ.update(spec["env"].get(node, {}), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    cfg = {"TITAN_CHECKPOINT_MODE": "async", "TITAN_CHECKPOINT_EVERY_STEPS": "0", "TITAN_CHECKPOINT_KEEP_LAST": "2",
           "TITAN_CHECKPOINT_SAVE_ON_SIGTERM": "false", "TITAN_CHECKPOINT_REPLICATE": spec["replicate"]}
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "TITAN_NODE_ID": node}
    run_dir = Path(spec["run_dirs"][node])
    ctx = WorkerContext.from_env(load_settings(env=cfg), run_dir=run_dir, env=env)
    st, _ = _state(spec["preset"])
    ck = Checkpointer(ctx, root=spec["roots"][node])
    stager = Stager()
    stager.stage(collect(st, 0))  # page-fault the staging buffers once
    floors, shard_copies = [], []
    for step in range(1, spec["saves"] + 1):
        t0 = time.monotonic()
        stager.stage(collect(st, 0))
        floors.append(time.monotonic() - t0)
        ck.save(step, st, blocking=False)
        ck.wait()
        own = sum(p.stat().st_size for p in (Path(spec["roots"][node]) / f"step-{step:08d}").glob(f"__{rank}_*.distcp"))
        src = torch.empty(max(own, 1), dtype=torch.uint8).fill_(1)
        t0 = time.monotonic()
        src.clone()
        shard_copies.append(time.monotonic() - t0)
    ck.close()
    stager.close()
    saved = [e.data for e in read_run(run_dir).events if e.kind == "ckpt.saved" and e.rank == rank]
    Path(spec["out"], f"rank{rank}.json").write_text(json.dumps(
        {"floors": floors, "shard_copy": shard_copies, "saved": saved, "shard_bytes": own}))
    dist.destroy_process_group()


def _setup(base: Path, name: str, replicate: str) -> tuple[dict[str, Any], list[Any]]:
    from titan.replica import DiskStore, MemoryStore, ReplicaServer

    servers: list[Any] = []
    # The replication context is the job's run id, the name of each node's run directory.
    if replicate == "off":  # shared storage: one folder for both nodes
        run_dirs = {n: str(base / name / "shared" / RUN) for n in NODES}
        env: dict[str, dict[str, str]] = {}
    else:
        run_dirs = {n: str(base / name / n / RUN) for n in NODES}
        env = {}
    roots = {n: str(Path(run_dirs[n]) / "checkpoints") for n in NODES}
    for n in NODES:
        Path(roots[n]).mkdir(parents=True, exist_ok=True)
        if replicate == "off":
            continue
        store = MemoryStore() if replicate == "memory" else DiskStore(base / name / n / "replicas")
        srv = ReplicaServer(store, key=KEY, context=RUN, exports={"ckpt": Path(roots[n])}, node=n).start()
        servers.append(srv)
        env[n] = {"TITAN_REPLICA_ENDPOINT": srv.endpoint, "TITAN_REPLICA_KEY": KEY.hex(),
                  "TITAN_REPLICA_EXPORT": roots[n]}
    return {"roots": roots, "run_dirs": run_dirs, "env": env, "replicate": replicate}, servers


def _measure(base: Path, name: str, replicate: str, preset: str, saves: int) -> dict[str, Any]:
    import torch.multiprocessing as mp

    spec, servers = _setup(base, name, replicate)
    out = base / name / "out"
    out.mkdir(parents=True, exist_ok=True)
    spec.update(preset=preset, saves=saves, out=str(out))
    try:
        ctx = mp.start_processes(_rank, args=(2, _port(), spec), nprocs=2, join=False, start_method="spawn")
        try:
            while not ctx.join(timeout=1800):
                pass
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
    finally:
        for s in servers:
            s.close()
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    steady = lambda xs: xs[1:] or xs  # noqa: E731 - the first save page-faults its buffers
    saved = [s for r in ranks for s in steady(r["saved"])]
    return {
        "stall_s": statistics.median(s["stall_s"] for s in saved),
        "total_s": statistics.median(s["total_s"] for s in saved),
        "replica_s": statistics.median(s.get("replica_s", 0.0) for s in saved),
        "replica_bytes": statistics.median(s.get("replica_bytes", 0) for s in saved),
        "floor_s": statistics.median(x for r in ranks for x in steady(r["floors"])),
        "shard_copy_s": statistics.median(x for r in ranks for x in steady(r["shard_copy"])),
        "shard_bytes": max(r["shard_bytes"] for r in ranks),
        "storage": sorted({s.get("storage", "shared") for s in saved}),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="100m")
    ap.add_argument("--saves", type=int, default=3)
    ap.add_argument("--dir", default=None, help="folder for the checkpoints (default: a temp dir)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="titan-repl-bench-"))
    res: dict[str, Any] = {"preset": args.preset, "saves": args.saves, "machine": f"{platform.node()} "
                           f"{os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    import torch

    res["torch"] = torch.__version__
    for name, mode in (("shared", "off"), ("disk", "auto"), ("memory", "memory")):
        res[name] = _measure(base, name, mode, args.preset, args.saves)
    res["load_avg"] = os.getloadavg()[0]
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(res, indent=1) if args.json else _markdown(res, " ".join(sys.argv)))


def _markdown(r: dict[str, Any], cmd: str) -> str:
    sh = r["shared"]
    rows = []
    for name, label in (("shared", "shared folder, no buddy copy"), ("disk", "node-local, buddy copy on disk"),
                        ("memory", "node-local, buddy copy in memory")):
        m = r[name]
        rows.append(f"| {label} | {m['stall_s']:.3f} | {m['stall_s'] - sh['stall_s']:+.3f} | {m['total_s']:.3f} | "
                    f"{m['replica_s']:.3f} | {m['replica_s'] / max(m['shard_copy_s'], 1e-9):.1f}× | "
                    f"{m['floor_s']:.3f} |")
    table = "\n".join(rows)
    return f"""
### buddy-copy cost ({r['date']}, {r['machine']}, torch {r['torch']})
`{cmd}` — preset {r['preset']}, 2 nodes × 1 rank (gloo, loopback), async saves, medians of saves 2…{r['saves']}
of both ranks; each rank's shard {r['disk']['shard_bytes'] / 1e6:.0f} MB, its in-memory copy
{r['disk']['shard_copy_s']:.3f} s; 1-min load average at the end {r['load_avg']:.1f} (shared machine).

| storage | training stall s | stall vs shared | save total s (background) | buddy copy s | buddy copy / in-memory copy of the shard | staging floor s |
|---|---|---|---|---|---|---|
{table}
"""


if __name__ == "__main__":
    main()
