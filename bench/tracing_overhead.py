"""Step-time overhead of tracing: off vs default sampling vs 100 %, side by side.

Run: .venv/bin/python bench/tracing_overhead.py [--steps 300] [--rounds 3]
Each round runs the three configurations back to back (2 ranks, tinygpt, file exporter) so
drift on this noisy machine hits them alike; reports the median step time of each and the
ratios to "off". Writes nothing outside a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from titan.events import read_run

CONFIGS = {
    "off": [],
    "default sampling": ["tracing.enabled=true"],
    "100 %": ["tracing.enabled=true", "tracing.sample_ratio=1.0"],
}


def _run(tmp: Path, name: str, sets: list[str], steps: int) -> list[float]:
    run_id = f"{name.replace(' ', '_').replace('%', 'pct')}-{len(list(tmp.iterdir()))}"
    cmd = [sys.executable, "-m", "titan", "run", "--nproc-per-node", "2", "--runs-dir", str(tmp), "--run-id", run_id,
           "--max-restarts", "0"]
    for s in sets:
        cmd += ["--set", s]
    cmd += ["--", "-m", "titan.workloads.tinygpt", "--steps", str(steps), "--no-ckpt", "--threads", "1"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=1800, env=dict(os.environ))
    evs = read_run(tmp / run_id).events
    return [e.data["step_time_s"] for e in evs if e.kind == "step" and e.step and e.step > 20]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    times: dict[str, list[float]] = {k: [] for k in CONFIGS}
    with tempfile.TemporaryDirectory() as d:
        for _ in range(a.rounds):
            for name, sets in CONFIGS.items():
                times[name] += _run(Path(d), name, sets, a.steps)
    base = statistics.median(times["off"])
    print(f"{'config':<18} {'median step ms':>15} {'vs off':>8}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<18} {med * 1e3:>15.2f} {med / base:>8.3f}")


if __name__ == "__main__":
    main()
