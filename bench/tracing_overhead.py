"""Step-time overhead of tracing: traced vs untraced steps side by side in one run.

Run: .venv/bin/python bench/tracing_overhead.py [--steps 400]

Separate runs (off / on) differ by more than tracing costs on this noisy 2-core machine, so
the comparison is made inside ONE 2-rank run with ``tracing.sample_ratio=0.5``: the
sampler keeps or drops whole steps at random, so traced and untraced steps interleave under
the same load. Reports the median step time of each, the cost of tracing a step (100 %
sampling), and the expected overhead at the default ratio (ratio × per-step cost). A
second, ``tracing.enabled=false`` run of the same length is reported for reference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from titan.events import read_run
from titan.settings import load_settings


def _run(root: Path, run_id: str, sets: list[str], steps: int) -> Path:
    cmd = [sys.executable, "-m", "titan", "run", "--nproc-per-node", "2", "--runs-dir", str(root), "--run-id", run_id,
           "--max-restarts", "0", "--no-agent"]
    for s in sets:
        cmd += ["--set", s]
    cmd += ["--", "-m", "titan.workloads.tinygpt", "--steps", str(steps), "--no-ckpt", "--threads", "1", "--log-every", "0"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=1800, env=dict(os.environ))
    return root / run_id


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=400)
    a = ap.parse_args()
    default_ratio = load_settings(env={}).tracing.sample_ratio
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        traced_run = _run(root, "half", ["tracing.enabled=true", "tracing.sample_ratio=0.5"], a.steps)
        off_run = _run(root, "off", [], a.steps)
        times = {(e.rank, e.step): e.data["step_time_s"] for e in read_run(traced_run).events
                 if e.kind == "step" and e.step and e.step > 20}
        sampled = set()
        for f in (traced_run / "traces").glob("*.jsonl"):
            for line in f.read_text().splitlines():
                sp = json.loads(line)
                if sp["name"] == "step":
                    sampled.add((sp["attributes"]["titan.rank"], sp["attributes"]["titan.step"]))
        on = [t for k, t in times.items() if k in sampled]
        off = [t for k, t in times.items() if k not in sampled]
        off_run_t = [e.data["step_time_s"] for e in read_run(off_run).events if e.kind == "step" and e.step and e.step > 20]
    m_on, m_off = statistics.median(on), statistics.median(off)
    per_step = m_on / m_off - 1
    print(f"one run, sample ratio 0.5: {len(on)} traced and {len(off)} untraced rank-steps")
    print(f"  median step, traced:   {m_on * 1e3:.2f} ms")
    print(f"  median step, untraced: {m_off * 1e3:.2f} ms")
    print(f"  cost of tracing a step (= overhead at 100 % sampling): {per_step * 100:+.2f} %")
    print(f"  expected overhead at the default ratio {default_ratio:g}: {default_ratio * per_step * 100:+.3f} % (goal <= 1 %)")
    print(f"reference, a separate run with tracing off: median step {statistics.median(off_run_t) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
