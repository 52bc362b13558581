"""Cost of the node agent: CPU share of one core and RSS at 1 Hz, per-collector tick time.

Usage: .venv/bin/python bench/agent_cost.py [--duration-s 300] [--interval-s 1.0]

Side by side in one run:
  A. each collector's ``collect()`` time in-process (median / p99 over N calls);
  B. ``titan agent`` as a real subprocess (all collectors, a run directory, the
     Prometheus endpoint scraped every 5 s by this script) for ``--duration-s``:
     CPU seconds / wall seconds (share of one core) and peak RSS, against the budget
     (≤ 1 % of a core, ≤ 80 MB) as ratios;
  C. for scale, the RSS of a bare ``python -c "import torch"`` (why the agent never
     imports torch).
Prints a Markdown block for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def per_collector(n: int) -> list[tuple[str, float, float]]:
    from titan.monitor.agent import build_collectors
    from titan.settings import load_settings

    cfg = load_settings(env={}).agent
    cols = build_collectors(cfg, "bench", None)
    out = []
    try:
        for c in cols:
            c.collect(time.time())
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                c.collect(time.time())
                times.append(time.perf_counter() - t0)
            times.sort()
            out.append((c.name, statistics.median(times), times[int(0.99 * (len(times) - 1))]))
    finally:
        for c in cols:
            c.close()
    return out


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agent_subprocess(duration: float, interval: float) -> dict[str, float]:
    from titan.events import RunDir

    tmp = Path(tempfile.mkdtemp(prefix="titan-agent-bench-"))
    rd = RunDir.create(tmp, "bench")
    port = free_port()
    env = {**os.environ, "XDG_STATE_HOME": str(tmp / "state"), "TITAN_NODE_ID": "bench"}
    cmd = [str(BIN / "titan"), "agent", "--run-dir", str(rd.path), "--interval-s", str(interval),
           "--duration-s", str(duration), "--prometheus-port", str(port)]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    proc = psutil.Process(p.pid)
    time.sleep(5.0)  # leave start-up (imports) out of the steady-state figure
    c0 = proc.cpu_times()
    t0 = time.monotonic()
    peak = 0
    scrapes = 0
    try:
        while p.poll() is None:
            try:
                peak = max(peak, proc.memory_info().rss)
                c1 = proc.cpu_times()
                t1 = time.monotonic()
            except psutil.Error:
                break
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
                scrapes += 1
            except OSError:
                pass
            time.sleep(5.0)
    finally:
        if p.poll() is None:
            p.terminate()
        p.wait(30)
    cpu = (c1.user + c1.system) - (c0.user + c0.system)
    wall = t1 - t0
    samples = (rd.metrics / "agent.bench.jsonl").read_bytes()
    return {"cpu_share": cpu / wall, "wall_s": wall, "peak_rss_mb": peak / 2**20, "scrapes": scrapes,
            "sample_bytes_per_tick": len(samples) / max(1, samples.count(b"\n")), "rc": p.returncode}


def torch_rss() -> float | None:
    code = "import torch, psutil; print(psutil.Process().memory_info().rss)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return int(r.stdout.strip()) / 2**20 if r.returncode == 0 else None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration-s", type=float, default=300.0)
    ap.add_argument("--interval-s", type=float, default=1.0)
    ap.add_argument("--calls", type=int, default=200)
    a = ap.parse_args()
    rows = per_collector(a.calls)
    res = agent_subprocess(a.duration_s, a.interval_s)
    trss = torch_rss()
    print(f"### agent cost ({dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
          f"{psutil.cpu_count()} cores, shared with other jobs)\n")
    print(f"Command: `.venv/bin/python bench/agent_cost.py --duration-s {a.duration_s:g} --interval-s {a.interval_s:g}`\n")
    print("| collector | collect() median | p99 |\n|---|---|---|")
    for name, med, p99 in rows:
        print(f"| {name} | {med * 1e3:.2f} ms | {p99 * 1e3:.2f} ms |")
    total = sum(m for _, m, _ in rows)
    print(f"| all | {total * 1e3:.2f} ms | |\n")
    print("| measure | value | budget | ratio |\n|---|---|---|---|")
    print(f"| CPU, share of one core ({res['wall_s']:.0f} s at {1 / a.interval_s:g} Hz, {res['scrapes']} scrapes) "
          f"| {res['cpu_share'] * 100:.2f} % | 1 % | {res['cpu_share'] / 0.01:.2f} |")
    print(f"| peak RSS | {res['peak_rss_mb']:.1f} MB | 80 MB | {res['peak_rss_mb'] / 80:.2f} |")
    print(f"| sample file growth | {res['sample_bytes_per_tick']:.0f} B/tick | | |")
    if trss is not None:
        print(f"| for scale: `python -c 'import torch'` RSS | {trss:.0f} MB | | {trss / res['peak_rss_mb']:.1f}x the agent |")
    return 0 if res["rc"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
