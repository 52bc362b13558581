"""Checkpoint stall and throughput, side by side in one run.

Measures on the reference workload's ``100m`` preset (+ AdamW state):
- the floor: one in-memory copy of the state (fresh buffers, and into reused buffers);
- the training stall per checkpoint: Titan async (first save separately: it page-faults
  the staging buffers), Titan sync (DCP), and plain ``torch.save`` of everything from rank 0;
- save and load throughput against ``dd`` on the same folder, and verify time on load.

Usage: ``python bench/checkpoint_stall.py [--preset 100m] [--dir DIR] [--saves 3] [--json]``
(single process; run under ``torchrun`` for several ranks). Prints a Markdown block for
``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def _state(preset: str):
    from titan.workloads.tinygpt.config import PRESETS
    from titan.workloads.tinygpt.model import GPT

    cfg = PRESETS[preset]
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, cfg.vocab_size, (1, min(cfg.seq_len, 32)))
    out = model(x)
    loss = out[0] if isinstance(out, tuple) else out
    (loss.float().mean() if loss.dim() else loss).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

    class Pos:
        consumed = 0

        def state_dict(self):
            return {"consumed": self.consumed}

        def load_state_dict(self, d):
            self.consumed = d["consumed"]

    n = sum(p.numel() for p in model.parameters())
    return {"model": model, "optimizer": opt, "sampler": Pos()}, n


def _ctx(run: Path, mode: str):
    from titan.settings import load_settings
    from titan.worker import WorkerContext

    env = {"TITAN_CHECKPOINT_MODE": mode, "TITAN_CHECKPOINT_EVERY_STEPS": "0", "TITAN_CHECKPOINT_KEEP_LAST": "2",
           "TITAN_CHECKPOINT_SAVE_ON_SIGTERM": "false"}
    return WorkerContext.from_env(load_settings(env=env), run_dir=run, env=dict(os.environ, **env))


def _events(run: Path, kind: str):
    from titan.events import read_run

    return [e for e in read_run(run).events if e.kind == kind]


def _dd(folder: Path, mb: int) -> float:
    target = folder / "dd.bin"
    t0 = time.monotonic()
    subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=16M", f"count={max(1, mb // 16)}", "conv=fsync"],
                   check=True, capture_output=True)
    s = time.monotonic() - t0
    target.unlink()
    return (max(1, mb // 16) * 16 * 2**20) / s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="100m")
    ap.add_argument("--dir", default=None, help="folder for the checkpoints (default: a temp dir under /tmp)")
    ap.add_argument("--saves", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    from titan.checkpoint import Checkpointer
    from titan.checkpoint.staging import Stager
    from titan.checkpoint.state import collect

    base = Path(args.dir or tempfile.mkdtemp(prefix="titan-ckpt-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    st, nparams = _state(args.preset)
    res: dict = {"preset": args.preset, "params": nparams, "torch": torch.__version__,
                 "machine": f"{platform.node()} {os.cpu_count()} cores", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}

    # Floor: one in-memory copy (fresh allocation vs reused buffers).
    sd = collect(st, 0)
    tensors = [t for t in _leaves(sd) if isinstance(t, torch.Tensor)]
    res["state_bytes"] = sum(t.nbytes for t in tensors)
    t0 = time.monotonic()
    clones = [t.clone() for t in tensors]
    res["copy_fresh_s"] = time.monotonic() - t0
    del clones
    stager = Stager()
    stager.stage(sd)
    t0 = time.monotonic()
    stager.stage(collect(st, 0))
    res["copy_reused_s"] = time.monotonic() - t0
    stager.close()

    # Titan async; the floor copy is re-measured right before each save, so that a shared,
    # noisy machine affects both sides of each ratio alike.
    run = base / "async"
    ck = Checkpointer(_ctx(run, "async"))
    stalls, floors = [], []
    stager = Stager()
    stager.stage(collect(st, 0))
    for step in range(1, args.saves + 1):
        t0 = time.monotonic()
        stager.stage(collect(st, 0))
        floors.append(time.monotonic() - t0)
        t0 = time.monotonic()
        ck.save(step, st, blocking=False)
        stalls.append(time.monotonic() - t0)
        ck.wait()
    ck.close()
    stager.close()
    ratios = [a / f for a, f in zip(stalls[1:], floors[1:])] or [stalls[0] / floors[0]]
    res["async_vs_copy_per_save"] = [round(r, 2) for r in ratios]
    saved = _events(run, "ckpt.saved")
    res["async_first_stall_s"] = stalls[0]
    res["async_stall_s"] = statistics.median(stalls[1:]) if len(stalls) > 1 else stalls[0]
    res["async_total_s"] = statistics.median(e.data["total_s"] for e in saved[1:] or saved)
    res["ckpt_bytes"] = saved[-1].data["bytes"]

    # Titan sync (plain DCP write path + manifest).
    run = base / "sync"
    ck = Checkpointer(_ctx(run, "sync"))
    sync = []
    for step in range(1, max(2, args.saves) + 1):
        t0 = time.monotonic()
        ck.save(step, st, blocking=True)
        sync.append(time.monotonic() - t0)
    ck.close()
    res["sync_stall_s"] = statistics.median(sync[1:])

    # torch.save of everything from rank 0.
    ts = []
    for i in range(2):
        p = base / f"torch_save_{i}.pt"
        t0 = time.monotonic()
        with open(p, "wb") as f:
            torch.save({"model": st["model"].state_dict(), "optimizer": st["optimizer"].state_dict()}, f)
            f.flush()
            os.fsync(f.fileno())
        ts.append(time.monotonic() - t0)
        p.unlink()
    res["torch_save_stall_s"] = ts[-1]

    # Load (verify + DCP load) into fresh objects.
    st2, _ = _state(args.preset)
    ck = Checkpointer(_ctx(base / "sync", "sync"))
    ck.restore(st2)
    ck.close()
    (loaded,) = _events(base / "sync", "ckpt.loaded")
    res["verify_s"], res["load_s"] = loaded.data["verify_s"], loaded.data["load_s"]
    res["save_MBps"] = res["ckpt_bytes"] / res["sync_stall_s"] / 1e6
    res["load_MBps"] = res["ckpt_bytes"] / res["load_s"] / 1e6
    res["verify_MBps"] = loaded.data["verified_bytes"] / max(res["verify_s"], 1e-9) / 1e6
    res["dd_MBps"] = _dd(base, max(256, res["ckpt_bytes"] // 2**20)) / 1e6
    res["async_vs_copy"] = statistics.median(ratios)
    res["load_avg"] = os.getloadavg()[0]
    res["sync_vs_async"] = res["sync_stall_s"] / res["async_stall_s"]
    res["torch_save_vs_async"] = res["torch_save_stall_s"] / res["async_stall_s"]
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)
    print(json.dumps(res, indent=1) if args.json else _markdown(res, " ".join(sys.argv)))


def _leaves(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _leaves(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _leaves(v)
    else:
        yield obj


def _markdown(r: dict, cmd: str) -> str:
    return f"""
### checkpoint stall ({r['date']}, {r['machine']}, torch {r['torch']})
`{cmd}` — preset {r['preset']}: {r['params'] / 1e6:.1f} M parameters, state {r['state_bytes'] / 1e6:.0f} MB,
checkpoint {r['ckpt_bytes'] / 1e6:.0f} MB, one process; 1-min load average at the end {r['load_avg']:.1f} (shared machine).

| what | seconds | vs async stall |
|---|---|---|
| in-memory copy, fresh buffers | {r['copy_fresh_s']:.3f} | |
| in-memory copy, reused buffers (floor) | {r['copy_reused_s']:.3f} | steady async stall / floor measured just before it: median {r['async_vs_copy']:.2f}× (per save {r['async_vs_copy_per_save']}) |
| **async stall, first save** (page-faults the staging buffers) | {r['async_first_stall_s']:.3f} | |
| **async stall, steady state** | {r['async_stall_s']:.3f} | 1.00 |
| async save total (background) | {r['async_total_s']:.3f} | |
| sync DCP save stall | {r['sync_stall_s']:.3f} | {r['sync_vs_async']:.1f}× |
| `torch.save` from rank 0 (+fsync) | {r['torch_save_stall_s']:.3f} | {r['torch_save_vs_async']:.1f}× |
| verify on load (CRC-32 of every file) | {r['verify_s']:.3f} | {r['verify_MBps']:.0f} MB/s |
| DCP load after verify | {r['load_s']:.3f} | {r['load_MBps']:.0f} MB/s |

Save {r['save_MBps']:.0f} MB/s and load {r['load_MBps']:.0f} MB/s against `dd conv=fsync` {r['dd_MBps']:.0f} MB/s on the same folder.
"""


if __name__ == "__main__":
    main()
