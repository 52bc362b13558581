"""Benchmark: triage a synthetic job of 1,000 rank logs totalling ~1 GB.

The data is generated under /tmp (deleted afterwards unless --keep): each rank logs
progress lines with timestamps, NCCL INFO noise and benign fp16-overflow warnings; rank 613
hits a CUDA OOM, and 15 minutes later every other rank's NCCL watchdog fires (late errors).
Runs ``titan triage --json`` as a subprocess (wall and CPU seconds: the CPU rate is what a
loaded machine does not change much), side by side with ``--jobs 1`` and ``--jobs 2``
and with a plain ``grep -c`` over the same files (the raw-read floor), and reports wall time,
throughput, peak RSS (largest process) and the verdict.

    .venv/bin/python bench/triage_scale.py [--ranks 1000] [--total-mb 1000] [--keep]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

T0 = dt.datetime(2026, 11, 30, 8, 0, 0, tzinfo=dt.timezone.utc).timestamp()
BAD = 613


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]


def generate(root: Path, ranks: int, total_bytes: int) -> int:
    bad = bad_rank(ranks)
    per_rank = total_bytes // ranks
    written = 0
    for r in range(ranks):
        host = f"node{r // 8:03d}"
        d = root / host
        d.mkdir(parents=True, exist_ok=True)
        lines = [f"{host}:{4000 + r}:{4000 + r} [{r % 8}] NCCL INFO comm 0x55d0 rank {r} nranks {ranks} cudaDev {r % 8} "
                 f"nvmlDev {r % 8} busId {r % 8}b000 commId 0x77 - Init COMPLETE"]
        size = len(lines[0]) + 1
        step = 0
        t = T0
        while size < per_rank - 400:
            step += 1
            t += 0.5
            if step % 500 == 0:
                line = (f"[{_iso(t)}] [INFO] [fused_optimizer.py:354] [deepspeed] OVERFLOW! Rank {r} Skipping step. "
                        f"Attempted loss scale: 65536, reducing to 32768")
            elif step % 97 == 0:
                line = f"{host}:{4000 + r}:{4100 + r} [{r % 8}] NCCL INFO Channel 03/0 : {r} -> {(r + 1) % ranks} via P2P/IPC"
            else:
                line = (f"{_iso(t)} [rank{r}] INFO step {step} loss {3.0 - step * 1e-4:.4f} grad_norm 1.02 "
                        f"lr 3.0e-04 step_time 0.500s tokens/s 16384")
            lines.append(line)
            size += len(line) + 1
        if r == bad:
            lines += [f"[rank{r}]: Traceback (most recent call last):", f'[rank{r}]:   File "train.py", line 88, in step',
                      f"[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB. GPU {r % 8} "
                      f"has a total capacity of 79.11 GiB of which 1.02 GiB is free."]
        else:
            w = dt.datetime.fromtimestamp(t + 900, tz=dt.timezone.utc)
            lines.append(f"[rank{r}]:[E{w:%m%d %H:%M:%S}.{w.microsecond:06d}000 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID 0(default_pg) "
                         f"Rank {r}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9001, OpType=ALLREDUCE, "
                         f"NumelIn=1, NumelOut=1, Timeout(ms)=900000) ran for 900017 milliseconds before timing out.")
        data = ("\n".join(lines) + "\n").encode()
        (d / f"rank{r}.log").write_bytes(data)
        written += len(data)
    return written


def bad_rank(ranks: int) -> int:
    return BAD if ranks > BAD else ranks // 2 + 1


def _timed(cmd: list[str]) -> tuple[float, int, float, subprocess.CompletedProcess[str]]:
    """Wall seconds, peak RSS (KiB, largest child so far), CPU seconds (user+sys of the command and its children)."""
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return wall, max(ru1.ru_maxrss, ru0.ru_maxrss), cpu, r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=1000)
    ap.add_argument("--total-mb", type=int, default=1000)
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="titan_triage_bench_", dir="/tmp"))
    titan = str(Path(sys.executable).with_name("titan"))
    try:
        t = time.perf_counter()
        size = generate(root, a.ranks, a.total_mb * 1_000_000)
        print(f"generated {a.ranks} rank logs, {size / 1e9:.3f} GB in {time.perf_counter() - t:.1f}s under {root}")
        g_wall, _, _, _ = _timed(["sh", "-c", f"cat {root}/*/*.log | grep -c 'NCCL WARN\\|Error'"])
        print(f"baseline  cat|grep -c over the files: {g_wall:6.1f}s  ({size / 1e6 / g_wall:6.0f} MB/s)")
        results = {}
        for jobs in (2, 1):
            wall, rss, cpu, r = _timed([titan, "triage", str(root), "--json", "--jobs", str(jobs)])
            v = json.loads(r.stdout)
            results[jobs] = wall
            print(f"titan triage --jobs {jobs}: {wall:6.1f}s  ({size / 1e6 / wall:6.0f} MB/s)  CPU {cpu:.1f}s ({size / 1e6 / cpu:.0f} MB/s per CPU-second)  "
                  f"peak RSS {rss / 1024:.0f} MiB  "
                  f"exit {r.returncode}  verdict {v['class']}/{v['culprit']}/{v['action']}  "
                  f"first anomaly {v['first_anomaly']['file']}:{v['first_anomaly']['line']}")
            ok = v["class"] == "oom" and v["culprit"]["rank"] == bad_rank(a.ranks)
            print(f"  verdict {'correct' if ok else 'WRONG'}; ≤ 60 s: {'yes' if wall <= 60 else 'NO'}")
        print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
        print(f"ratios: jobs1/jobs2 = {results[1] / results[2]:.2f}; jobs2/grep = {results[2] / g_wall:.2f}")
    finally:
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
