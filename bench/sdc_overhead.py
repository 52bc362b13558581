"""Cost of silent-data-corruption checks at the default K and M, and fingerprint throughput.

Run: .venv/bin/python bench/sdc_overhead.py [--presets tiny,100m] [--steps 5]

For each preset, side by side in one process: the median time of a training step (forward,
backward, AdamW) and of one fingerprint round over the full state (parameters + Adam
moments), one canary GEMM, and the overhead they add at the defaults
(round every sdc.every_steps, canary every sdc.canary_every_steps). Also the fingerprint's
throughput against one plain read of the same bytes (numpy sum) and a memcpy — how close
it gets to one read of the state.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from titan.sdc.canary import GemmCanary
from titan.sdc.fingerprint import named_state, state_fingerprints
from titan.settings import load_settings
from titan.workloads.tinygpt.config import PRESETS
from titan.workloads.tinygpt.model import GPT


def _median_time(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default="tiny,100m")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    a = ap.parse_args()
    cfg = load_settings(env={}).sdc
    torch.manual_seed(0)
    print(f"defaults: every_steps={cfg.every_steps} canary_every_steps={cfg.canary_every_steps} "
          f"threads={torch.get_num_threads()}")
    for name in a.presets.split(","):
        mcfg = PRESETS[name]
        model = GPT(mcfg)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        seq = min(a.seq, mcfg.seq_len)
        x = torch.randint(0, mcfg.vocab_size, (a.batch, seq))

        def step() -> None:
            loss = model(x, x)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        step()  # creates the Adam state
        t_step = _median_time(step, a.steps)
        t_round = _median_time(lambda: state_fingerprints(model, opt, "xxhash"), 5)
        t_cs = _median_time(lambda: state_fingerprints(model, opt, "checksum"), 2)
        canary = GemmCanary(torch.device("cpu"), cfg.canary_size)
        t_canary = _median_time(canary.checksum, 20)
        nbytes = sum(t.numel() * t.element_size() for _, t in named_state(model, opt))
        arrays = [t.detach().reshape(-1).view(torch.uint8).numpy() for _, t in named_state(model, opt)]
        t_read = _median_time(lambda: [np.add.reduce(b.view(np.uint64) if b.size % 8 == 0 else b) for b in arrays], 5)
        t_copy = _median_time(lambda: [b.copy() for b in arrays], 5)
        over = (t_round / cfg.every_steps + t_canary / max(cfg.canary_every_steps, 1)) / t_step
        print(f"\n[{name}] {sum(p.numel() for p in model.parameters()):,} params, state {nbytes / 1e6:.1f} MB")
        print(f"  training step (median of {a.steps}): {t_step * 1e3:.1f} ms")
        print(f"  fingerprint round, xxhash: {t_round * 1e3:.2f} ms ({nbytes / t_round / 1e9:.2f} GB/s)")
        print(f"  fingerprint round, torch checksum: {t_cs * 1e3:.1f} ms ({nbytes / t_cs / 1e9:.3f} GB/s)")
        print(f"  one plain read of the state (numpy sum): {t_read * 1e3:.2f} ms ({nbytes / t_read / 1e9:.2f} GB/s); "
              f"memcpy {t_copy * 1e3:.2f} ms ({nbytes / t_copy / 1e9:.2f} GB/s)")
        print(f"  canary GEMM {cfg.canary_size}x{cfg.canary_size}: {t_canary * 1e3:.3f} ms")
        print(f"  overhead at the defaults: {over * 100:.3f} % of step time (goal <= 0.5 %)")


if __name__ == "__main__":
    main()
