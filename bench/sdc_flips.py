"""SDC detection rate and latency over randomised bit flips, at the default cadence.

Run: .venv/bin/python bench/sdc_flips.py [--flips 60] [--seed 1] [--every 50] [--dtype fp32|bf16] [--json out.json]

One real `titan run` job (2 ranks, gloo, tinygpt) takes ``--flips`` flips, one per SDC check
interval of ``--every`` steps (the default cadence is 50), each at a random step strictly
between two checks; tensor kind (parameter, local gradient before the all-reduce, AdamW
``exp_avg``/``exp_avg_sq``), bit class (sign, exponent, mantissa) and element drawn at random
(``titan.chaos.flips.random_flips``; the element inside the rank, weighted by tensor size).
Every flip is read back from the run's events: caught by which detector (the SDC round's
``sdc.mismatch``, or the guard when the flip made a value non-finite or spiking), after how
many steps and seconds, or why not. ``--dtype bf16`` trains tinygpt with bf16 parameters (so
bf16 gradients and AdamW moments) and draws the bits in bf16's layout. Prints the detection rate per tensor kind and bit class,
the latency quantiles, and the undetected flips' documented reasons (docs/sdc.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

from titan.chaos.flips import BIT_CLASSES, TENSOR_KINDS, random_flips, run_flips


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flips", type=int, default=60)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--json", default="")
    ap.add_argument("--keep", default="", help="keep the run directory under this folder")
    a = ap.parse_args()
    flips = random_flips(a.flips, every=a.every, seed=a.seed, first_interval=1,
                         dtype=torch.bfloat16 if a.dtype == "bf16" else torch.float32)
    root = (Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="titan-flips-"))).resolve()
    run = run_flips(flips, every=a.every, cwd=root, runs_dir=root / "runs", env=dict(os.environ),
                    timeout_s=max(1800.0, a.flips * 40.0))
    s = run.summary
    if run.launcher_exit != [0] or not s["overall"]["flips"]:
        print(f"the flip job did not finish: exit {run.launcher_exit}, {run.steps} steps; run {run.run_dir}")
        return 1
    print(f"# {len(flips)} random {a.dtype} flips, SDC every {a.every} steps, 2 ranks; run {run.run_dir} "
          f"({run.steps} steps, {run.wall_s:.0f} s, exit {run.launcher_exit})")
    print(f"detected {s['overall']['detected']}/{s['overall']['flips']} = {s['overall']['rate']:.0%} "
          f"(not injected: {s['not_injected']})")
    print(f"latency (steps): median {s['latency_steps']['median']}, p90 {s['latency_steps']['p90']}, "
          f"max {s['latency_steps']['max']}; (s): median {s['latency_s']['median']}, p90 {s['latency_s']['p90']}, "
          f"max {s['latency_s']['max']}")
    print("\n| tensor kind | " + " | ".join(BIT_CLASSES) + " | all |")
    print("|---|" + "---|" * (len(BIT_CLASSES) + 1))
    for k in TENSOR_KINDS:
        cells = []
        for c in BIT_CLASSES:
            r = s["by_kind_class"].get(f"{k}/{c}")
            cells.append(f"{r['detected']}/{r['flips']}" if r else "—")
        tot = s["by_kind"].get(k)
        print(f"| {k} | " + " | ".join(cells) + f" | {tot['detected']}/{tot['flips']} |" if tot else f"| {k} | — |")
    print("\ndetectors:", s["by_detector"])
    print("undetected, by reason:")
    for why, n in s["undetected_reasons"].items():
        print(f"  {n} × {why}")
    if a.json:
        Path(a.json).write_text(json.dumps(run.to_dict(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
