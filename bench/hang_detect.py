"""Hang detection latency and recovery time (RTO), side by side with plain torchrun.

Three jobs of ``tests/watchdog/hang_worker.py`` (2 ranks, gloo, checkpoint every 10 steps),
each with one fault per attempt (``--trials`` faults, a different attempt each):

* ``titan-stall``: ``titan run`` (watchdog on); each attempt a rank sleeps in data loading
  → detection latency (``inject.stall`` → ``hang.detected``) and RTO (stall → first
  completed step of the next attempt); also RTO − detection.
* ``titan-kill``: ``titan run``; each attempt a rank SIGKILLs itself → RTO (kill → first step).
* ``torchrun-kill``: plain ``torchrun`` (with the store fix
  ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``), same kills → RTO. Plain torchrun cannot
  recover from a stall at all (it waits for the 300 s collective timeout), so only kills.

Usage: ``python bench/hang_detect.py [--trials 5] [--json out.json]``; prints a table and
the markdown block for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime as _dt
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

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "watchdog" / "hang_worker.py"
PY = Path(sys.executable)


def _events(rd: Path) -> list[dict]:
    out = []
    for f in list((rd / "events").glob("*.jsonl")) + list(rd.glob("launcher.*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return sorted(out, key=lambda e: e["t"])


def _faults(kind: str, trials: int) -> tuple[list[str], int]:
    args, steps = [], 0
    for a in range(trials):
        steps = 22 + 12 * a
        args += ["--inject", f"{a}:{a % 2}:{steps}:{kind}"]
    return args, steps + 10


def _run(mode: str, kind: str, trials: int, work: Path) -> Path:
    inj, steps = _faults(kind, trials)
    rd = work / "runs" / mode
    env = {**os.environ, "TITAN_WATCHDOG_LEDGER_PATH": str(work / "ledger.sqlite")}
    wargs = [str(WORKER), "--steps", str(steps), *inj]
    if mode.startswith("titan"):
        argv = [str(PY.with_name("titan")), "run", "--nproc-per-node", "2", "--runs-dir", str(work / "runs"),
                "--run-id", mode, "--max-restarts", str(trials), "--set", "watchdog.strike_limit=1000", "--", *wargs]
    else:
        rd.mkdir(parents=True)
        env.update({"TITAN_RUN_DIR": str(rd), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"})
        argv = [str(PY), "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", str(trials),
                "--monitor-interval", "0.1", *wargs]
    t0 = time.time()
    p = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"{mode} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    print(f"  {mode}: {time.time() - t0:.0f} s", file=sys.stderr)
    return rd


def _measure(rd: Path, fault_kind: str) -> list[dict]:
    evs = _events(rd)
    out = []
    for f in (e for e in evs if e["kind"] == fault_kind):
        att = f.get("attempt")
        nxt = [e for e in evs if e["kind"] == "step" and e.get("attempt") == att + 1]
        det = [e for e in evs if e["kind"] == "hang.detected" and e["t"] >= f["t"] and e["data"]["attempt"] == att]
        row = {"attempt": att, "rto_s": (nxt[0]["t"] - f["t"]) if nxt else None}
        if det:
            row["detect_s"] = det[0]["t"] - f["t"]
            row["culprit_ok"] = det[0]["data"]["culprit"]["rank"] == f["rank"]
            row["rto_minus_detect_s"] = row["rto_s"] - row["detect_s"] if row["rto_s"] is not None else None
        out.append(row)
    return out


def _p99_step(rd: Path) -> float:
    xs = sorted(e["data"]["step_time_s"] for e in _events(rd) if e["kind"] == "step")
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))]


def _med(rows: list[dict], key: str) -> float | None:
    xs = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(xs) if xs else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--json", help="write the raw rows here")
    ap.add_argument("--keep", action="store_true", help="keep the run directories")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="titan-bench-hang-"))
    try:
        stall = _run("titan-stall", "data", a.trials, work)
        tkill = _run("titan-kill", "kill", a.trials, work)
        pkill = _run("torchrun-kill", "kill", a.trials, work)
        rows = {"titan-stall": _measure(stall, "inject.stall"), "titan-kill": _measure(tkill, "inject.kill"),
                "torchrun-kill": _measure(pkill, "inject.kill")}
        p99 = _p99_step(stall)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    goal = max(5.0, 3 * p99)
    det = _med(rows["titan-stall"], "detect_s")
    rto_stall = _med(rows["titan-stall"], "rto_s")
    rmd = _med(rows["titan-stall"], "rto_minus_detect_s")
    rto_tk = _med(rows["titan-kill"], "rto_s")
    rto_pk = _med(rows["torchrun-kill"], "rto_s")
    ok = all(r.get("culprit_ok") for r in rows["titan-stall"])
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cmd = f"python bench/hang_detect.py --trials {a.trials}"
    print(f"""
## hang

`{cmd}` — {date}, {platform.node()}, {os.cpu_count()} cores (shared), torch 2.13 CPU, gloo, 2 ranks,
hang_worker.py (3-layer MLP, DDP, checkpoint every 10 steps); median of {a.trials} faults per job.

| measure | titan run (watchdog) | plain torchrun | ratio | goal |
|---|---|---|---|---|
| stall → `hang.detected` (detection latency) | {det:.2f} s | never (300 s pg timeout) | — | ≤ max(5 s, 3 × p99 step = {3 * p99:.3f} s) = {goal:.1f} s |
| stall → first step after restart (RTO) | {rto_stall:.2f} s | — | — | — |
| stall RTO − detection | {rmd:.2f} s | kill RTO {rto_pk:.2f} s | {rmd / rto_pk:.2f} | ≤ 1.5 |
| kill → first step after restart (RTO) | {rto_tk:.2f} s | {rto_pk:.2f} s | {rto_tk / rto_pk:.2f} | ≤ 1.5 |

Culprit right in all stalls: {ok}. p99 step time {p99 * 1000:.1f} ms.
""")
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": rows, "p99_step_s": p99}, indent=2))


if __name__ == "__main__":
    main()
