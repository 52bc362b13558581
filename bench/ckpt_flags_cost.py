"""What ``Checkpointer.maybe_save``'s own per-step all-reduce costs an Accelerate loop, and
what letting its flags ride the step guard's vector saves — side by side in one run.

One ``TitanAccelerate`` loop (the 2.4 M-parameter MLP of ``integrations_overhead.py``:
256→1024→1024→1024→16, batch 32 per rank, clipping at 1.0, AdamW), trained in interleaved
blocks of ``--block`` steps: in ``exchange`` blocks ``maybe_save`` all-reduces its three
flags (SIGTERM seen, save due, save running) itself, as it does without a guard; in
``ride`` blocks they travel in the guard's step vector with DDP's last gradient bucket
(what ``TitanAccelerate`` wires). Per step: wall and CPU time (this process, all threads)
from one batch to the next — the loop's whole iteration, the checkpointer's call included.
No disk saves (run it with ``checkpoint.every_steps=0``)::

    .venv/bin/titan run --nproc-per-node 2 --set checkpoint.every_steps=0 -- bench/ckpt_flags_cost.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch import nn


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--blocks", type=int, default=6, help="blocks per variant (they alternate)")
    p.add_argument("--block", type=int, default=30, help="optimizer steps per block")
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batch", type=int, default=32)
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from torch.utils.data import DataLoader, TensorDataset

    from titan.integrations.accelerate import TitanAccelerate

    accelerator = Accelerator(cpu=True)
    set_seed(0)
    w = a.width
    model = nn.Sequential(nn.Linear(256, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(),
                          nn.Linear(w, 16))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    steps = 2 * a.blocks * a.block
    g = torch.Generator().manual_seed(0)
    n = steps * a.batch * accelerator.num_processes
    data = TensorDataset(torch.randn(n, 256, generator=g), torch.randint(0, 16, (n,), generator=g))
    loader = DataLoader(data, batch_size=a.batch, shuffle=False)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    titan = TitanAccelerate(accelerator, model, optimizer)
    if titan.guarded is None:
        raise SystemExit("the step guard is off: nothing rides")
    guard, ckpt = titan.guarded.guard, titan.checkpointer
    rows: dict[str, list[tuple[float, float]]] = {"exchange": [], "ride": []}
    load0 = os.getloadavg()[0]
    prev: tuple[float, float, str] | None = None
    for k, (x, y) in enumerate(titan.batches(loader, 0)):
        now = (time.perf_counter(), time.process_time())
        if prev is not None and (k - 1) % a.block:  # the first step of each block warms up
            rows[prev[2]].append((now[0] - prev[0], now[1] - prev[1]))
        mode = ("exchange", "ride")[(k // a.block) % 2]
        # The bench's switch (private on purpose): with no passenger the guard's vector carries
        # no flags and maybe_save all-reduces them itself.
        guard._passenger = ckpt if mode == "ride" else None
        prev = (now[0], now[1], mode)
        loss = nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    load1 = os.getloadavg()[0]
    if accelerator.is_main_process:
        med = {m: (statistics.median(r[0] for r in v) * 1e3, statistics.median(r[1] for r in v) * 1e3, len(v))
               for m, v in rows.items()}
        for m, (wall, cpu, cnt) in med.items():
            print(f"{m:8s} step {wall:.3f} ms  CPU {cpu:.3f} ms  ({cnt} steps)", flush=True)
        dw, dc = med["exchange"][0] - med["ride"][0], med["exchange"][1] - med["ride"][1]
        print(f"maybe_save's own all-reduce: {dw:+.3f} ms wall ({100 * dw / med['ride'][0]:+.2f} %), {dc:+.3f} ms CPU "
              f"({100 * dc / med['ride'][1]:+.2f} %) per step over riding; flags rode {ckpt.flags_rode}, "
              f"exchanged {ckpt.flags_exchanged}; load average {load0:.1f} -> {load1:.1f}", flush=True)
    titan.close()
    accelerator.end_training()


if __name__ == "__main__":
    main()
