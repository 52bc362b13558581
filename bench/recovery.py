"""Recovery from a killed rank, side by side in one run: Titan fast path vs cold path vs torchrun (issue 23).

Every trial runs the same tinygpt job (2 local ranks, gloo, checkpoint every ``--ckpt-every``
steps, the same seed and flags) and SIGKILLs rank 1 once it has completed ``--kill-after``
steps (the chaos gate of ``titan.chaos``: the rank waits at the start of the next step until
the signal is sent, so every system loses the same work). Three systems:

* ``titan_fast``  ``titan run`` with per-step in-memory snapshots
  (``checkpoint.snapshot_every_steps=1``) and warm workers (``warm.enabled=true``);
* ``titan_cold``  ``titan run`` with both off (disk checkpoint, cold interpreter);
* ``torchrun``    plain ``torchrun --standalone`` of the same script with the store setting
  Titan uses (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``) and the same monitor interval.

The trials are interleaved (fast, cold, torchrun, fast, …) so that a change in the machine's
load hits every system alike. From the run directory's events, per trial, in seconds from
the kill (``inject.kill``):

* ``restart``   the launcher decided the restart (``launcher.restart``; Titan only);
* ``announce``  the first worker of the new attempt announced itself (``worker.started``:
  the interpreter, its imports, the worker context);
* ``loaded``    every rank restored its state (``ckpt.loaded``);
* ``rto_s``     the first step *completed* after the recovery (a ``step`` event of the new
  attempt), as in ``titan drill``;
* ``rpo_steps`` the furthest step completed before the kill minus the step resumed from;
* ``bitwise``   the final parameters equal those of one clean run of the same job.

    .venv/bin/python bench/recovery.py --trials 5 [--kill-after 18] [--json]

``--json`` prints ``{"titan_fast": {"rto_s": median, "rpo_steps": median, …}, "titan_cold": …,
"torchrun": …}``. Results and the command: docs/benchmarks.md ("recovery").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from titan.chaos.drills import PlanDrill, _base_sets
from titan.chaos.jobs import final_state, job_cmd, stop_tree
from titan.chaos.oslevel import send_signal
from titan.chaos.plan import Plan
from titan.chaos.reference import clean_run
from titan.checkpoint.digest import compare_digests, read_digests
from titan.settings.env import TITAN_FINAL_STATE
from titan.chaos.runtime import chaos_dir
from titan.events import RunDir, read_run
from titan.events.tail import EventTail

SYSTEMS = ("titan_fast", "titan_cold", "torchrun")
_SETS = {
    "titan_fast": ["checkpoint.snapshot_every_steps=1", "warm.enabled=true"],
    "titan_cold": ["checkpoint.snapshot_every_steps=0", "warm.enabled=false"],
}


def _cfg(a: argparse.Namespace, root: Path) -> PlanDrill:
    # The chaos plan counts steps from 1 at the gate: "kill at step S+1" fires once S completed.
    return PlanDrill(plan=Plan(name="kill").kill(rank=1, step=a.kill_after + 1), steps=a.steps,
                     ckpt_every=a.ckpt_every, runs_dir=root / "runs", timeout_s=a.timeout, reference=False)


def _command(system: str, cfg: PlanDrill, rd: RunDir, out: Path) -> list[str]:
    if system != "torchrun":
        return job_cmd(cfg, rd, sets=_base_sets(cfg, rd) + _SETS[system])
    # The same workload arguments as titan run's (job_cmd's tail after "--").
    tail = job_cmd(cfg, rd)
    tail = tail[tail.index("--") + 1:]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(cfg.nproc),
            "--max-restarts", "3", "--monitor-interval", "0.1", *tail]


def trial(system: str, cfg: PlanDrill, root: Path, i: int) -> dict[str, Any]:
    """One run of ``system`` with one kill; returns its figures (``error`` when it failed)."""
    rd = RunDir.create(cfg.runs_dir, f"{system}-{i}")
    plan_file = cfg.plan.save(chaos_dir(rd.path) / "plan.json")
    out = rd.path / "final.pt"
    env = {**os.environ, "TITAN_CHAOS_PLAN": str(plan_file), "TITAN_WATCHDOG_LEDGER_PATH": str(rd.path / "ledger.sqlite"),
           TITAN_FINAL_STATE: str(final_state(rd))}
    if system == "torchrun":  # what titan run sets for its workers, by hand
        env.update(TITAN_RUN_DIR=str(rd.path), TITAN_NODE_ID="node0", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    t0 = time.monotonic()
    with open(rd.path / "console.log", "ab") as log:
        proc = subprocess.Popen(_command(system, cfg, rd, out), cwd=root, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        tail = EventTail(rd)
        problem = None
        killed = False
        try:
            while proc.poll() is None:
                if time.monotonic() - t0 > cfg.timeout_s:
                    problem = f"timed out after {cfg.timeout_s:g} s"
                    break
                for ev in tail.poll():
                    if ev.kind == "chaos.gate" and not killed and ev.pid:
                        killed = True
                        try:
                            send_signal(rd, "node0", ev.pid, "SIGKILL", rank=ev.rank, step=ev.step, attempt=ev.attempt)
                        except Exception as e:  # noqa: BLE001 - reported as this trial's failure
                            problem = f"kill failed: {e}"
                        (chaos_dir(rd.path) / f"go.{ev.data.get('fault')}").touch()
                time.sleep(0.01)
        finally:
            stop_tree(proc, grace_s=10)
    res = figures(rd)
    res["exit"] = proc.returncode
    if problem or proc.returncode != 0:
        res["error"] = problem or f"exit {proc.returncode}"
    res["out"] = str(out)
    res["final"] = str(final_state(rd))
    return res


def figures(rd: RunDir) -> dict[str, Any]:
    """The phase breakdown of the one kill in ``rd`` (seconds from the kill)."""
    evs = read_run(rd).events
    kills = [e for e in evs if e.kind == "inject.kill"]
    if not kills:
        return {"error": "no kill"}
    tk, ka = kills[0].t, kills[0].data.get("attempt") or 0
    after = [e for e in evs if (e.attempt or 0) > ka and e.rank is not None and e.t >= tk]

    def first(kind: str, evs_: list = after) -> float | None:
        ts = [e.t for e in evs_ if e.kind == kind]
        return round(min(ts) - tk, 3) if ts else None

    loaded = [e for e in after if e.kind == "ckpt.loaded"]
    steps_before = [e.step for e in evs if e.kind == "step" and (e.attempt or 0) == ka and e.step is not None]
    resumed = int(loaded[0].data.get("step", loaded[0].step or 0)) if loaded else None
    spawn = sorted({str(e.data.get("spawn", "cold")).split(":")[0] for e in after if e.kind == "worker.started"})
    return {
        "restart": first("launcher.restart", [e for e in evs if e.t >= tk]),
        "announce": first("worker.started"),
        "loaded": round(max(e.t for e in loaded) - tk, 3) if loaded else None,
        "rto_s": first("step"),
        "rpo_steps": (max(steps_before) - resumed) if steps_before and resumed is not None else None,
        "resumed_from": resumed,
        "source": sorted({str(e.data.get("source")) for e in loaded}),
        "spawn": spawn,
    }


def _median(xs: list[Any]) -> float | None:
    xs = [x for x in xs if isinstance(x, (int, float))]
    return round(statistics.median(xs), 3) if xs else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--kill-after", type=int, default=18)
    ap.add_argument("--timeout", type=float, default=180.0)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    systems = [s for s in a.systems.split(",") if s]
    bad = [s for s in systems if s not in SYSTEMS]
    if bad or a.trials < 1 or not (0 < a.kill_after < a.steps):
        print(f"bench/recovery.py: error: systems {bad} unknown or --trials/--kill-after out of range", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="titan-rto-"))
    cfg = _cfg(a, root)
    ref = clean_run(cfg, {}, cwd=root, env=dict(os.environ), cache=False)
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    for i in range(a.trials):
        for s in systems:
            r = trial(s, cfg, root, i)
            r["bitwise"] = (compare_digests(read_digests(Path(r["final"])), ref.digests)[0]
                            if ref.digests else None)
            runs[s].append(r)
            if not a.json:
                print(f"{s:<11} trial {i}: " + ", ".join(f"{k} {r.get(k)}" for k in
                      ("restart", "announce", "loaded", "rto_s", "rpo_steps", "source", "spawn", "bitwise", "error")),
                      file=sys.stderr, flush=True)
    summary: dict[str, Any] = {}
    for s, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        summary[s] = {k: _median([r.get(k) for r in ok]) for k in ("restart", "announce", "loaded", "rto_s", "rpo_steps")}
        summary[s].update(trials=len(rs), failed=len(rs) - len(ok), bitwise=sum(1 for r in ok if r.get("bitwise")),
                          rto_all=[r.get("rto_s") for r in rs], errors=[r["error"] for r in rs if "error" in r])
    fast, cold, tr = (summary.get(s, {}).get("rto_s") for s in SYSTEMS)
    ratios = {"fast/torchrun": round(fast / tr, 3) if fast and tr else None,
              "fast/cold": round(fast / cold, 3) if fast and cold else None,
              "cold/torchrun": round(cold / tr, 3) if cold and tr else None}
    load = [round(x, 1) for x in os.getloadavg()]
    if a.json:
        print(json.dumps({**summary, "ratios": ratios, "loadavg_at_end": load}, indent=1))
    else:
        print(f"{'system':<11} {'restart':>8} {'announce':>9} {'loaded':>8} {'RTO':>7} {'RPO':>5} bitwise failed")
        for s, m in summary.items():
            cells = [m.get(k) for k in ("restart", "announce", "loaded", "rto_s")]
            print(f"{s:<11} " + " ".join(f"{c:>8.3f}" if c is not None else f"{'—':>8}" for c in cells)
                  + f" {m['rpo_steps'] if m['rpo_steps'] is not None else '—':>5} {m['bitwise']}/{m['trials'] - m['failed']}"
                  f" {m['failed']}")
        print("ratios (median RTO): " + ", ".join(f"{k} {v}" for k, v in ratios.items()))
        print(f"load average at the end (1, 5, 15 min): {load}")
    return 0 if all(not m["failed"] for m in summary.values()) else 1


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
