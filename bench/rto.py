"""Recovery from a killed or stalled rank, side by side: the one RTO harness (issues 22, 23).

One engine (:func:`run_schedule`, :func:`analyse`) for two uses:

* **issue 23** (the default): Titan fast path vs Titan cold path vs plain torchrun *on the same
  script* (``rto_systems.py``: ``titan_fast`` = ``titan run`` + per-step in-memory snapshots +
  warm workers; ``titan_cold`` = both off; ``torchrun`` = plain ``torchrun --standalone`` of the
  same module with the store setting Titan uses), 30 steps, disk checkpoint every 10, rank 1
  signalled at the chaos gate once it completed step 18, trials interleaved; each trial runs to
  the end and its final weights are compared with one clean run's (``bitwise``);
* **bench/peers** (``--peers``, or :func:`run` from ``bench/peers/run.py``): each peer system
  on its own script (bench/peers/systems.py), signalled at a random point of the step.

A run launches a system and drives a fault schedule by step: when the target rank has
completed step S it gets SIGKILL (a crash) or SIGSTOP (a hang); NaN and slow-rank faults are
planned in-process (bench/peers/common/faults.py). For every signal, from the records of
every worker (the peers' step log, or Titan's events turned into the same records):

* ``rto_s``      signal -> the first step completed after recovery (by any rank: a survivor
  that stepped past the fault, or a new process);
* ``rto_full_s`` signal -> every rank has completed a step after recovery (full strength);
* ``rpo_steps``  steps lost: the furthest step completed before the signal minus the step
  the job resumed from;
* ``survivors_restarted`` whether the ranks that were not signalled got new processes;
* ``detection_s`` / ``culprit_named``: the system's own first notice of the fault (Titan's
  events; the others' output lines, stamped when the harness saw them), and whether its
  notices of that kind in the first 2 s name the signalled rank and no other;
* ``phases`` (:data:`PHASES`): signal -> failure seen / restart decided (``restart``), the
  replacement process exists (``start``), it announced itself (``announce``: interpreter and
  imports), formed its process group (``ready``), restored its state (``restored``), completed
  its first step (``first_step``).

A SIGSTOP that the system never handles ends (SIGCONT) after ``hang_release_s``, as a
transient stall would. Every system gets the same schedule, flags and records.

    .venv/bin/python bench/rto.py --trials 5 [--fault kill|hang] [--json]      # issue 23
    .venv/bin/python bench/rto.py --peers --systems titan,torchrun --trials 5  # peers

``--json`` prints ``{"titan_fast": {"rto_s": median, "rpo_steps": median, "phases": {…}, …},
"titan_cold": {…}, "torchrun": {…}, "ratios": {…}, "load": {…}}``. Results: docs/benchmarks.md.
"""


from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peers.systems import SYSTEMS, Job, System, get  # noqa: E402
from peers.venvs import load_config  # noqa: E402

__all__ = ["Fired", "analyse", "run_schedule", "fault_report", "trial", "summarise", "run", "main"]

EXTERNAL = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}
#: Seconds from the signal, in order: the launcher decided the restart (or the harness saw the
#: failure line), the replacement process exists, it announced itself (imports done), formed
#: its process group, restored its state, completed its first step.
PHASES = ("restart", "start", "announce", "ready", "restored", "first_step")


@dataclass
class Fired:
    """An external fault the harness delivered."""

    kind: str
    rank: int
    step: int
    t: float
    pid: int
    released_t: float | None = None


@dataclass
class ScheduleResult:
    job: Job
    fired: list[Fired] = field(default_factory=list)
    t_launch: float = 0.0
    t_end: float = 0.0
    completed: bool = False
    error: str | None = None


def _rank_step(job: Job, rank: int) -> int:
    pid = job.pid_of(rank)
    return max((r["step"] for r in job.steps() if r["rank"] == rank and r["pid"] == pid), default=0)


def _stopped(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    except (OSError, IndexError):
        return False


def _step_time(job: Job, rank: int) -> float:
    pid = job.pid_of(rank)
    ts = [r["t"] - r["t_start"] for r in job.steps()[-40:] if r["rank"] == rank and r["pid"] == pid]
    return statistics.median(ts) if ts else 0.1


def run_schedule(system: System, world: int, steps: int, external: list[dict[str, Any]],
                 internal: list[dict[str, Any]], *, job_dir: Path, wl: dict[str, Any], hang_release_s: float,
                 timeout_s: float, done: Callable[[ScheduleResult], bool] | None = None,
                 poll_s: float = 0.05, seed: int = 0) -> ScheduleResult:
    """Launch ``system`` and deliver ``external`` faults (``{"kind": "kill"|"stop", "rank", "step"}``,
    in order) as the target rank reaches each step; ``internal`` ones go to the workers.

    A signal lands at a random point of the step after step S (a delay drawn uniformly from
    one median step time, seeded): a real crash or stall can strike anywhere in the loop,
    not only at a step boundary. A system with a gate (``system.gated(job, fault)`` true while
    the rank waits at the start of step S+1; ``system.after_fault(job, fault)`` opens it, as
    the same-script systems of ``rto_systems.py`` do) is signalled at the gate instead, so
    that every system loses exactly the same work. Ends when the job exits, ``done(result)`` is true, or
    after ``timeout_s`` without a new step record; always stops every process it started.
    """
    rng = random.Random(seed)
    gated, after = getattr(system, "gated", None), getattr(system, "after_fault", None)
    gates = list(external) if gated is not None else []  # a gated system places them itself
    res = ScheduleResult(job=system.launch(job_dir, world, steps, wl, [*internal, *gates]), t_launch=time.time())
    job = res.job
    pending = list(external)
    last_progress, n_records = time.monotonic(), 0
    due: float | None = None
    try:
        while True:
            job.poll()
            if len(job.records) != n_records:
                n_records, last_progress = len(job.records), time.monotonic()
            if pending and due is None:
                if gated is not None:  # the rank waits at the start of step S+1: signal it there
                    if gated(job, pending[0]):
                        due = time.monotonic()
                elif _rank_step(job, pending[0]["rank"]) >= pending[0]["step"]:
                    due = time.monotonic() + rng.uniform(0.0, _step_time(job, pending[0]["rank"]))
            if pending and due is not None and time.monotonic() >= due:
                f, due = pending.pop(0), None
                pid = job.pid_of(f["rank"])
                system.before_fault(job, f["kind"], f["rank"], pid)
                fired = Fired(kind=f["kind"], rank=f["rank"], step=_rank_step(job, f["rank"]), t=time.time(), pid=pid)
                os.kill(pid, EXTERNAL[f["kind"]])
                res.fired.append(fired)
                if after is not None:
                    after(job, f)
            for fz in res.fired:  # a stall nobody handled ends by itself
                if fz.kind == "stop" and fz.released_t is None and time.time() - fz.t >= hang_release_s:
                    if _stopped(fz.pid):
                        os.kill(fz.pid, signal.SIGCONT)
                        fz.released_t = time.time()
                    else:
                        fz.released_t = -1.0  # the system ended it
            if not job.alive():
                job.poll()
                res.completed = any(r["kind"] == "mark" and r["what"] == "done" for r in job.records)
                break
            if done is not None and done(res):
                break
            if time.monotonic() - last_progress > timeout_s:
                res.error = f"no step record for {timeout_s:.0f} s"
                break
            time.sleep(poll_s)
    finally:
        res.t_end = time.time()
        job.stop()
    return res


def analyse(records: list[dict[str, Any]], t_fault: float | None, pid: int | None, rank: int,
            world: int, t_next: float | None = None) -> dict[str, Any]:
    """RTO, RPO, survivors and phases of one fault from the step log (a pure function).

    Only records before ``t_next`` (the next fault) count.
    """
    if t_fault is None:
        return {}
    records = [r for r in records if t_next is None or r["t"] < t_next]
    steps = [r for r in records if r["kind"] == "step"]
    s_max = max((r["step"] for r in steps if r["t"] <= t_fault), default=0)
    pids_before: dict[int, int] = {}
    for r in records:
        if r["t"] <= t_fault and r.get("rank") is not None:
            pids_before[r["rank"]] = r["pid"]
    old = set(pids_before.values())
    # Recovered progress: a step of a new process, or a survivor's step past every step
    # completed before the fault that also *began* after it (a step in flight at the fault
    # can still complete on a survivor when the signalled rank had already contributed).
    after = [r for r in steps if r["t"] > t_fault and (r["pid"] not in old or (r["step"] > s_max and
                                                                               r["t_start"] > t_fault))]
    out: dict[str, Any] = {"steps_before": s_max, "rto_s": None, "rto_full_s": None, "rpo_steps": None,
                           "survivors_restarted": None, "post_min_steps": 0, "phases": {}}
    if not after:
        return out
    first = after[0]
    out["rto_s"] = round(first["t"] - t_fault, 3)
    out["resumed_from"] = first["step"] - 1
    out["rpo_steps"] = max(0, s_max - (first["step"] - 1))
    per_rank: dict[int, list[dict[str, Any]]] = {}
    for r in after:
        per_rank.setdefault(r["rank"], []).append(r)
    if all(k in per_rank for k in range(world)):
        out["rto_full_s"] = round(max(per_rank[k][0]["t"] for k in range(world)) - t_fault, 3)
    out["post_min_steps"] = min(len(per_rank.get(k, [])) for k in range(world))
    survivors = [k for k in range(world) if k != rank]
    restarted = [k for k in survivors if any(r["pid"] != pids_before.get(k) for r in per_rank.get(k, []))]
    out["survivors_restarted"] = True if restarted else (False if all(k in per_rank for k in survivors) else None)
    out["survivors_restarted_ranks"] = restarted
    # Phases of the signalled rank's next process (its replacement).
    nxt = next((r["pid"] for r in records if r["t"] > t_fault and r.get("rank") == rank and r["pid"] != pid), None)
    marks: dict[str, float] = {}
    for r in records:
        if r["t"] > t_fault and r["kind"] == "mark" and r["what"] == "restart" and r.get("rank") is None:
            marks.setdefault("restart", round(r["t"] - t_fault, 3))  # the launcher decided (when it says so)
        if r["t"] > t_fault and r["pid"] == nxt:
            marks.setdefault(r["what"] if r["kind"] == "mark" else "first_step", round(r["t"] - t_fault, 3))
            if r["kind"] == "mark" and r["what"] == "restored":
                out.setdefault("restored_source", r.get("source"))
            if r["kind"] == "mark" and r["what"] == "announce" and r.get("spawn"):
                out.setdefault("spawn", str(r["spawn"]).split(":")[0])
    out["phases"] = {k: marks[k] for k in PHASES if k in marks}
    return out


def fault_report(res: ScheduleResult, i: int, world: int, t_next: float | None = None) -> dict[str, Any]:
    """:func:`analyse` of the i-th delivered fault plus what the system said about it
    (until the next fault, ``t_next``; by default the next delivered signal)."""
    f = res.fired[i]
    if t_next is None and i + 1 < len(res.fired):
        t_next = res.fired[i + 1].t
    out = analyse(res.job.records, f.t, f.pid, f.rank, world, t_next)
    dets = [d for d in res.job.system.detections(res.job, f.t)
            if (t_next is None or d.t < t_next) and not d.numeric]
    first = dets[0] if dets else None
    # Whom the system blamed: the notices of the same kind as its first one, within 2 s (a
    # remedy's own consequences — the workers a watchdog kills — are other kinds).
    kind = first.what.split(" (")[0] if first else None
    early = {d.culprit for d in dets if first and d.t <= first.t + 2.0 and d.culprit is not None
             and d.what.split(" (")[0] == kind}
    named = [d for d in dets if d.culprit == f.rank]
    out.update({
        "fault": f.kind, "world": world, "signalled_rank": f.rank, "at_step": f.step,
        "released_after_s": round(f.released_t - f.t, 1) if f.released_t and f.released_t > 0 else None,
        "detection_s": round(first.t - f.t, 3) if first else None,
        "detected_by": first.what if first else None,
        "detection_text": first.text if first else None,
        "culprit_named": early == {f.rank},
        "culprit_named_s": round(named[0].t - f.t, 3) if named and early == {f.rank} else None,
        "blamed": sorted(early),
    })
    if out.get("phases") and "restart" not in out["phases"] and out["detection_s"] is not None:
        out["phases"] = {"restart": out["detection_s"], **out["phases"]}  # failure seen (the system's words)
    return out


def trial(system: System, world: int, *, fault: str, rank: int, at_step: int, job_dir: Path,
          wl: dict[str, Any], post_steps: int, hang_release_s: float, timeout_s: float) -> dict[str, Any]:
    """One run with one signal; ends ``post_steps`` steps after every rank recovered."""

    def recovered(res: ScheduleResult) -> bool:
        if not res.fired:
            return False
        a = analyse(res.job.records, res.fired[0].t, res.fired[0].pid, rank, world)
        return a.get("rto_full_s") is not None and a["post_min_steps"] >= post_steps

    res = run_schedule(system, world, at_step + 60 + post_steps, [{"kind": fault, "rank": rank, "step": at_step}], [],
                       job_dir=job_dir, wl=wl, hang_release_s=hang_release_s, timeout_s=timeout_s, done=recovered)
    if not res.fired:
        return {"error": res.error or f"rank {rank} never reached step {at_step} (it reached "
                                      f"{_rank_step(res.job, rank)}; the job {'ran' if res.job.alive() else 'ended'})"}
    out = fault_report(res, 0, world)
    if out.get("rto_s") is None:
        out["error"] = res.error or "no step completed after the fault"
    return out


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the trials that recovered; counts of the others."""
    ok = [r for r in rows if "error" not in r]

    def med(k: str) -> float | None:
        v = [r[k] for r in ok if r.get(k) is not None]
        return round(statistics.median(v), 3) if v else None

    out: dict[str, Any] = {"trials": len(rows), "recovered": len(ok),
                           "errors": [r["error"] for r in rows if "error" in r]}
    for k in ("rto_s", "rto_full_s", "rpo_steps", "detection_s", "culprit_named_s"):
        out[k] = med(k)
    for k in ("survivors_restarted", "culprit_named"):
        vals = [r[k] for r in ok if r.get(k) is not None]
        out[k] = (vals[0] if vals and len(set(vals)) == 1 else (f"{sum(vals)}/{len(vals)}" if vals else None))
    phases = [r["phases"] for r in ok if r.get("phases")]
    out["phases"] = {k: round(statistics.median([p[k] for p in phases if k in p]), 3)
                     for k in PHASES if any(k in p for p in phases)}
    out["detected_by"] = next((r["detected_by"] for r in ok if r.get("detected_by")), None)
    return out


def run(systems: list[str], *, fault: str, worlds: list[int], trials: int, profile: dict[str, Any],
        wl: dict[str, Any], root: Path, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every system x world x trial, interleaved (trial i of every system before trial i+1)."""
    out: dict[str, Any] = {}
    rows: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for i in range(trials):
        for world in worlds:
            for name in systems:
                sysm = get(name)
                why = sysm.unavailable()
                if why:
                    out.setdefault(name, {"skipped": why})
                    continue
                t0 = time.monotonic()
                r = trial(sysm, world, fault=fault, rank=1, at_step=profile.get("kill_step" if fault == "kill" else "hang_step", 30),
                          wl=wl, job_dir=root / f"{fault}-{name}-w{world}-{i}", post_steps=profile["post_steps"],
                          hang_release_s=profile["hang_release_s"], timeout_s=profile["trial_timeout_s"])
                r["wall_s"] = round(time.monotonic() - t0, 1)
                rows.setdefault((name, world), []).append(r)
                if progress:
                    progress(f"{fault} {name} world {world} trial {i + 1}/{trials}: rto {r.get('rto_s')} s, "
                             f"rpo {r.get('rpo_steps')}, survivors restarted {r.get('survivors_restarted')}, "
                             f"detected {r.get('detection_s')} s by {r.get('detected_by')}"
                             + (f" — {r['error']}" if "error" in r else ""))
    for (name, world), rs in rows.items():
        out.setdefault(name, {})[f"world{world}"] = {**summarise(rs), "rows": rs}
    return out


# -- the recovery comparison of issue 23: one script, Titan fast vs Titan cold vs torchrun --------

def recovery(systems: list[str], *, fault: str = "kill", trials: int = 5, steps: int = 30, ckpt_every: int = 10,
             at_step: int = 18, world: int = 2, root: Path, hang_release_s: float = 20.0, timeout_s: float = 120.0,
             progress: Callable[[str], None] | None = None, reference: bool = True,
             sets: list[str] | None = None) -> dict[str, Any]:
    """Trials of ``systems`` (names of ``rto_systems.SAME_SCRIPT``), interleaved (trial i of every
    system before trial i+1), each a full run of ``steps`` steps with one ``fault`` (``kill`` or
    ``stop``) to rank 1 once it completed ``at_step`` steps; the final weights are compared with
    those of one clean run first. Returns per system the medians of :func:`summarise`,
    ``bitwise`` ("k/n") and the rows; plus ``ratios`` of the median RTOs."""
    from rto_systems import SameScript, reference_digests
    from titan.checkpoint.digest import compare_digests

    wl = {"ckpt_every": ckpt_every, "sets": list(sets or [])}
    sig = "stop" if fault in ("stop", "hang") else "kill"

    def one(name: str, faults: list[dict[str, Any]], d: Path) -> tuple[ScheduleResult, int | None]:
        res = run_schedule(SameScript(name), world, steps, faults, [], job_dir=d, wl=wl, hang_release_s=hang_release_s,
                           timeout_s=timeout_s)
        rc = res.job.procs[0].returncode if res.job.procs else None
        return res, rc

    ref: dict[str, Any] = {}
    if reference:
        ref_res, ref_rc = one("titan_cold", [], root / "reference")
        ref = reference_digests(ref_res.job) or {}
    if reference and (ref_rc != 0 or not ref):
        raise RuntimeError(f"the clean reference run failed (exit {ref_rc}; {ref_res.error or 'no final state'}): "
                           f"{ref_res.job.dir}")
    rows: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    for i in range(trials):
        for name in systems:
            t0 = time.monotonic()
            res, rc = one(name, [{"kind": sig, "rank": 1, "step": at_step}], root / f"{fault}-{name}-{i}")
            r = fault_report(res, 0, world) if res.fired else {"error": res.error or f"rank 1 never reached step {at_step}"}
            digests = reference_digests(res.job) or {}
            r["bitwise"] = (compare_digests(digests, ref)[0] if digests else False) if reference else None
            r["exit"] = rc
            if "error" not in r and (r.get("rto_s") is None or rc != 0):
                r["error"] = res.error or (f"exit {rc}" if rc != 0 else "no step completed after the fault")
            r["wall_s"] = round(time.monotonic() - t0, 1)
            rows[name].append(r)
            if progress:
                ph = r.get("phases") or {}
                progress(f"{name:<10} trial {i + 1}/{trials}: rto {r.get('rto_s')} s, rpo {r.get('rpo_steps')}, "
                         + ", ".join(f"{k} {ph[k]}" for k in PHASES if k in ph)
                         + f", source {r.get('restored_source')}, spawn {r.get('spawn')}, bitwise {r['bitwise']}"
                         + (f", detected {r.get('detection_s')} s by {r.get('detected_by')}" if sig == "stop" else "")
                         + (f" — {r['error']}" if "error" in r else ""))
    out: dict[str, Any] = {}
    for name, rs in rows.items():
        ok = [r for r in rs if "error" not in r]
        s = summarise(rs)
        s.update(bitwise=f"{sum(1 for r in ok if r['bitwise'])}/{len(rs)}" if reference else "—", rto_all=[r.get("rto_s") for r in rs],
                 source=sorted({str(r.get("restored_source")) for r in ok}), spawn=sorted({str(r.get("spawn")) for r in ok}))
        if sig == "stop":
            gap = [r["rto_s"] - r["detection_s"] for r in ok if r.get("rto_s") is not None and r.get("detection_s") is not None]
            s["resumed_after_detection_s"] = round(statistics.median(gap), 3) if gap else None
        out[name] = {**s, "rows": rs}
    med = {n: out.get(n, {}).get("rto_s") for n in ("titan_fast", "titan_cold", "torchrun")}
    out["ratios"] = {f"{a}/{b}": (round(med[a] / med[b], 3) if med[a] and med[b] else None)
                     for a, b in (("titan_fast", "torchrun"), ("titan_fast", "titan_cold"), ("titan_cold", "torchrun"))}
    return out


def _strip(res: dict[str, Any]) -> dict[str, Any]:
    return {k: {w: ({kk: vv for kk, vv in v.items() if kk != "rows"} if isinstance(v, dict) else v)
                for w, v in d.items()} for k, d in res.items()}


def _table(res: dict[str, Any]) -> str:
    head = ["failure seen", "started", "announce", "pg ready", "restored", "RTO"]
    keys = ["restart", "start", "announce", "ready", "restored", "first_step"]
    lines = [f"{'seconds from the signal':<24}" + "".join(f"{h:>13}" for h in head) + f"{'RPO':>6}  bitwise  source"]
    for name, m in res.items():
        if name == "ratios" or not isinstance(m, dict):
            continue
        ph = m.get("phases") or {}
        cells = [ph.get(k) for k in keys[:-1]] + [m.get("rto_s")]
        lines.append(f"{name:<24}" + "".join(f"{c:>13.3f}" if c is not None else f"{'—':>13}" for c in cells)
                     + f"{m.get('rpo_steps') if m.get('rpo_steps') is not None else '—':>6}  {m.get('bitwise'):>7}  "
                     + ",".join(m.get("source") or []) + (f"  errors: {m['errors']}" if m.get("errors") else ""))
    lines.append("ratios (median RTO): " + ", ".join(f"{k} {v}" for k, v in res.get("ratios", {}).items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--systems", help="comma list; default titan_fast,titan_cold,torchrun (the same script), "
                                      f"with --peers titan,torchrun (of {','.join(SYSTEMS)})")
    ap.add_argument("--peers", action="store_true", help="the peer systems, each on its own script (bench/peers)")
    ap.add_argument("--fault", choices=("kill", "hang", "stop"), default="kill", help="SIGKILL, or SIGSTOP (hang)")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30, help="steps of each run (same-script systems)")
    ap.add_argument("--ckpt-every", type=int, default=10, help="disk-checkpoint cadence (same-script systems)")
    ap.add_argument("--at-step", type=int, default=18, help="signal rank 1 once it completed this many steps")
    ap.add_argument("--hang-release", type=float, default=20.0, help="SIGCONT an unhandled SIGSTOP after this long")
    ap.add_argument("--world", type=int, action="append", help="ranks (repeatable; default 2)")
    ap.add_argument("--profile", default="quick", choices=("tiny", "quick", "full"),
                    help="--peers: fault step, release and time limits (bench/peers/configs/workload.toml)")
    ap.add_argument("--keep", help="keep the trial directories here")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra titan run setting for titan_fast and titan_cold (repeatable)")
    ap.add_argument("--no-reference", action="store_true", help="skip the clean run (no bitwise check; profiling)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    from rto_systems import SAME_SCRIPT

    known = SYSTEMS if a.peers else SAME_SCRIPT
    names = [s.strip() for s in (a.systems or ("titan,torchrun" if a.peers else ",".join(SAME_SCRIPT))).split(",")
             if s.strip()]
    bad = [n for n in names if n not in known]
    if bad or a.trials < 1 or not (0 < a.at_step < a.steps):
        what = (f"unknown system {bad[0]!r}" if bad else "--trials must be >= 1" if a.trials < 1
                else "--at-step must be between 0 and --steps")
        print(f"rto: error: {what}\nhint: systems are {', '.join(known)}"
              + ("" if a.peers else " (--peers for the peer systems)"), file=sys.stderr)
        return 2
    load_before = [round(x, 1) for x in os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="rto-") as tmp:
        root = Path(a.keep).resolve() if a.keep else Path(tmp)
        if a.peers:
            wl = load_config("workload")
            res = run(names, fault="stop" if a.fault == "hang" else a.fault, worlds=a.world or [2], trials=a.trials,
                      profile=wl["profiles"][a.profile], wl=wl, root=root, progress=None if a.json else print)
            print(json.dumps(_strip(res), indent=1))
            return 0
        res = recovery(names, fault=a.fault, trials=a.trials, steps=a.steps, ckpt_every=a.ckpt_every,
                       at_step=a.at_step, world=(a.world or [2])[0], root=root, hang_release_s=a.hang_release,
                       progress=None if a.json else (lambda m: print(m, file=sys.stderr, flush=True)),
                       reference=not a.no_reference, sets=a.set)
    out = {k: ({kk: vv for kk, vv in v.items() if kk != "rows"} if k != "ratios" else v) for k, v in res.items()}
    out["load"] = {"before": load_before, "after": [round(x, 1) for x in os.getloadavg()]}
    out["command"] = "bench/rto.py " + " ".join(argv if argv is not None else sys.argv[1:])
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        print(_table(res))
        print(f"load average (1, 5, 15 min): before {out['load']['before']}, after {out['load']['after']}")
    failed = any(isinstance(m, dict) and (m.get("errors") or (not a.no_reference and
                                                               m.get("bitwise", "").split("/")[0] != str(m.get("trials"))))
                 for k, m in res.items() if k != "ratios")
    return 1 if failed else 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    sys.exit(main())
