"""Cost of the per-step in-memory snapshot in a clean run, interleaved A/B in one process (issue 23).

One process trains tinygpt (``--preset``, AdamW) and alternates steps without (A) and with (B)
a per-step snapshot (``titan.checkpoint.stepsnap.StepSnapshots``, the tier
``checkpoint.snapshot_every_steps`` turns on), so that a change in the machine's load hits both
alike. Reported: the median step time of A and B and their difference; the snapshot's parts
(median ``copy_s`` and ``small_s`` on the loop's thread, ``wait_s`` for the previous save's
background part, ``hash_s`` of that background part — it overlaps the next step's compute on
another core); and the floor: one ``memcpy`` of the same bytes (the model and optimizer
tensors copied into a preallocated buffer of the same size).

    .venv/bin/python bench/stepsnap_overhead.py [--preset 100m] [--pairs 20] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from titan.checkpoint.stepsnap import StepSnapshots
from titan.workloads.tinygpt import GPT, PRESETS


def _floor(app_state: dict, reps: int = 5) -> tuple[float, int]:
    """Median seconds of one copy of every model/optimizer tensor into preallocated memory."""
    src = [t for t in app_state["model"].state_dict().values()]
    src += [v for s in app_state["optim"].state.values() for v in s.values() if torch.is_tensor(v) and v.dim()]
    dst = [torch.empty_like(t) for t in src]
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for d, s in zip(dst, src):
            d.copy_(s)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), sum(t.numel() * t.element_size() for t in src)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="100m", choices=sorted(PRESETS))
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shm", default="/dev/shm")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = PRESETS[a.preset]
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    app_state = {"model": model, "optim": opt}
    x = torch.randint(0, cfg.vocab_size, (a.batch, cfg.seq_len))

    def step() -> None:
        model(x, x).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    base = Path(tempfile.mkdtemp(prefix="titan-snapbench-", dir=a.shm))
    tier = StepSnapshots(base, "bench", 0, 1, max_fraction=1.0)
    for _ in range(3):  # warm-up: the optimizer state exists, the tensor table is built
        step()
        tier.save(0, app_state)
    a_times, b_times, stats = [], [], []
    try:
        for i in range(a.pairs):
            for kind in ("A", "B") if i % 2 == 0 else ("B", "A"):
                t0 = time.perf_counter()
                step()
                if kind == "B":
                    stats.append(tier.save(i + 1, app_state))
                (b_times if kind == "B" else a_times).append(time.perf_counter() - t0)
        tier.wait()
        floor_s, nbytes = _floor(app_state)
    finally:
        tier.close()
        tier.remove_files()
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    med = {f: statistics.median(getattr(s, f) for s in stats) for f in ("wait_s", "copy_s", "small_s", "hash_s")}
    a_med, b_med = statistics.median(a_times), statistics.median(b_times)
    out = {
        "preset": a.preset, "params": sum(p.numel() for p in model.parameters()), "state_bytes": stats[-1].bytes,
        "pairs": a.pairs, "threads": a.threads,
        "step_s": {"A_no_snapshot": round(a_med, 4), "B_snapshot": round(b_med, 4)},
        "overhead_s": round(b_med - a_med, 4), "overhead_pct": round(100 * (b_med - a_med) / a_med, 2),
        "parts_s": {k: round(v, 5) for k, v in med.items()},
        "critical_path_s": round(med["wait_s"] + med["copy_s"] + med["small_s"], 5),
        "memcpy_floor_s": round(floor_s, 5), "memcpy_floor_bytes": nbytes,
        "copy_vs_floor": round(med["copy_s"] / floor_s, 3) if floor_s else None,
        "critical_path_pct_of_step": round(100 * (med["wait_s"] + med["copy_s"] + med["small_s"]) / a_med, 2),
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a stopped run still frees its tmpfs slots
    raise SystemExit(main())
