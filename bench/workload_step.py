"""tinygpt step time side by side: intra-op threads 1 vs 2, DataLoader workers 0 vs 2.

    .venv/bin/python bench/workload_step.py [--steps 60] [--preset tiny]

Single process, in-process loop (model + AdamW + the real DataLoader/ResumableSampler),
median step time after 5 warm-up steps. Prints one JSON line per configuration and ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from torch.utils.data import DataLoader

from titan.workloads.tinygpt import GPT, PRESETS, MarkovCorpus, ResumableSampler


def measure(preset: str, steps: int, threads: int, workers: int, batch: int) -> float:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = PRESETS[preset]
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    corpus = MarkovCorpus(cfg.vocab_size, cfg.seq_len, seed=0)
    sampler = ResumableSampler(len(corpus), batch, seed=0, rank=0, world_size=1, commit="advance")
    it = iter(DataLoader(corpus, batch_size=batch, sampler=sampler, num_workers=workers,
                         generator=torch.Generator().manual_seed(0)))
    times = []
    for _ in range(steps + 5):
        t0 = time.perf_counter()
        x, y = next(it)
        model(x, y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sampler.advance(batch)
        times.append(time.perf_counter() - t0)
    del it
    return statistics.median(times[5:])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--batch-size", type=int, default=8)
    a = p.parse_args()
    res = {}
    for threads, workers in ((1, 0), (2, 0), (1, 2)):
        res[(threads, workers)] = measure(a.preset, a.steps, threads, workers, a.batch_size)
        print(json.dumps({"preset": a.preset, "threads": threads, "num_workers": workers,
                          "median_step_s": round(res[(threads, workers)], 5)}))
    base = res[(1, 0)]
    print(json.dumps({"ratio_threads2_vs_1": round(res[(2, 0)] / base, 3),
                      "ratio_workers2_vs_0": round(res[(1, 2)] / base, 3),
                      "loadavg_1m": os.getloadavg()[0]}))


if __name__ == "__main__":
    main()
