"""Measure (5): silent data corruption — Titan's fingerprints/canary vs LM Resiliency's SCOUT.

Both take flips drawn by the project's one bit-flip harness, ``titan.chaos.flips`` (issue
21): one flip per check interval at a random step strictly between two checks, tensor kind
(parameter, local gradient, AdamW ``exp_avg``/``exp_avg_sq``) and bit class (sign,
exponent, mantissa) drawn uniformly, fp32 (tinygpt trains in fp32 here; no bf16 run). Each
system checks at its own documented cadence: Titan ``sdc.every_steps = 50`` (its default),
SCOUT ``interval = 10`` (docs/api.md). The first ``controls`` intervals of each run carry no
flip: they are the clean controls (a detection there is a false positive).

* Titan: ``titan.chaos.flips.run_flips`` (tinygpt under ``titan run``, 2 ranks; Titan
  repairs each caught flip itself by rolling back to a verified snapshot);
* SCOUT: ``scripts/scout_sdc.py`` under torchrun, 4 ranks (SCOUT localises only with three
  or more equivalent peers), with a CUDA shim (``torch.cuda.synchronize`` made a no-op: its
  replay calls it unconditionally).

Overhead: the same loop with and without the detector, median step time (A/B, back to back).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from peers.systems import free_port, run_bounded
from peers.venvs import HERE, ROOT, load_config, python_for, status

__all__ = ["run_sdc", "titan_sdc", "scout_sdc"]

TITAN_EVERY, SCOUT_EVERY = 50, 10


def _env(log_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TITAN_", "PEERS_", "TORCHELASTIC_"))}
    env.update({"PYTHONPATH": f"{ROOT / 'src'}:{ROOT / 'bench'}", "PEERS_LOG_DIR": str(log_dir),
                "CUDA_VISIBLE_DEVICES": "", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "OMP_NUM_THREADS": "1"})
    return env


def titan_sdc(root: Path, flips: int, controls: int, seed: int = 1) -> dict[str, Any]:
    """Titan's fingerprints/canary against ``flips`` flips after ``controls`` clean intervals."""
    from titan.chaos.flips import random_flips, run_flips
    from titan.events import read_run

    root.mkdir(parents=True, exist_ok=True)
    specs = random_flips(flips, every=TITAN_EVERY, ranks=2, seed=seed, first_interval=controls)
    env = _env(root / "log")
    env["XDG_STATE_HOME"] = str(root / "state")
    env["TITAN_WATCHDOG_LEDGER_PATH"] = str(root / "ledger.sqlite")
    run = run_flips(specs, every=TITAN_EVERY, cwd=root, runs_dir=root / "runs", env=env, nproc=2,
                    ckpt_every=TITAN_EVERY, timeout_s=3000, seed=0, workload_args=("--threads", "1"))
    events = read_run(run.run_dir).events
    inj_t = min((e.t for e in events if e.kind == "inject.bitflip"), default=None)
    false_pos = [e for e in events if e.kind in ("sdc.mismatch", "sdc.canary") and (e.step or 0) <= controls * TITAN_EVERY
                 and (inj_t is None or e.t < inj_t)]
    steps = [e for e in events if e.kind == "step" and e.data.get("step_time_s") is not None]
    return {"detector": "cross-replica fingerprints + GEMM canary (titan.sdc)", "every_steps": TITAN_EVERY,
            "world": 2, "flips": flips, "controls": controls, "false_positives": len(false_pos),
            "summary": run.summary, "wall_s": round(run.wall_s, 1), "run_steps": run.steps,
            "launcher_exit": run.launcher_exit, "outcomes": [o.to_dict() for o in run.outcomes],
            "steps_recorded": len(steps)}


def _scout_run(root: Path, flips: list[dict[str, Any]], steps: int, *, detection: bool, world: int,
               timeout_s: float) -> dict[str, Any]:
    cfg = load_config("lm_resiliency")
    root.mkdir(parents=True, exist_ok=True)
    (root / "flips.json").write_text(json.dumps(flips))
    cmd = [str(python_for(cfg)), "-m", "torch.distributed.run", "--nproc-per-node", str(world), "--rdzv-backend",
           "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", str(HERE / "scripts" / "scout_sdc.py"),
           "--flips", str(root / "flips.json"), "--steps", str(steps), "--interval", str(SCOUT_EVERY),
           "--threads", "1", *(["--no-detection"] if not detection else [])]
    rc = run_bounded(cmd, cwd=root, env=_env(root), out=root / "torchrun.out", timeout_s=timeout_s)
    ranks = [json.loads(f.read_text()) for f in sorted(root.glob("scout.rank*.json"))]
    if len(ranks) < world:
        raise RuntimeError(f"SCOUT run exited {rc} with {len(ranks)}/{world} results: "
                           + (root / "torchrun.out").read_text(errors="replace")[-1200:])
    return {"ranks": ranks, "exit": rc}


def scout_sdc(root: Path, flips: int, controls: int, seed: int = 1, world: int = 4,
              timeout_s: float = 1800) -> dict[str, Any]:
    """SCOUT against the same kind of flips (its own cadence), after ``controls`` clean intervals."""
    from titan.chaos.flips import bit_class, random_flips, summarize, FlipOutcome

    st = status(load_config("lm_resiliency"))
    if not st["ok"]:
        return {"skipped": st["reason"]}
    specs = random_flips(flips, every=SCOUT_EVERY, ranks=world, seed=seed, first_interval=controls)
    steps = (controls + flips + 1) * SCOUT_EVERY
    t0 = time.monotonic()
    res = _scout_run(root / "scout", [asdict(s) for s in specs], steps, detection=True, world=world,
                     timeout_s=timeout_s)
    wall = time.monotonic() - t0
    flipped = {(f["step"], f["rank"]): f for r in res["ranks"] for f in r["flips"]}
    reports = sorted((rep for r in res["ranks"] for rep in r["reports"] if any(rep["sdc_bitmap"])),
                     key=lambda x: x["t"])
    outcomes, named = [], 0
    for s in specs:
        f = flipped.get((s.step, s.rank))
        o = FlipOutcome(step=s.step, rank=s.rank, kind=s.kind, tensor=s.tensor, index=s.index, bit=s.bit,
                        bit_class=s.bit_class, injected=f is not None)
        if f is None:
            o.why_not = "not injected"
        else:
            o.tensor, o.index, o.before, o.after = f["tensor"], f["index"], f["before"], f["after"]
            check = (s.step // SCOUT_EVERY + 1) * SCOUT_EVERY
            hit = next((rep for rep in reports if s.step <= rep["step"] <= check), None)
            if hit is None:
                o.why_not = ("gradient flip: all-reduced into identical replicas" if s.kind == "grad"
                             else "no SCOUT report at the interval's check")
            else:
                o.detected, o.detector = True, "scout (layer replay, C3)"
                o.detected_step, o.latency_steps = hit["step"], hit["step"] - s.step
                o.latency_s = round(hit["t"] - f["t"], 4)
                named += hit["sdc_bitmap"][s.rank] == 1 and sum(hit["sdc_bitmap"]) == 1
        outcomes.append(o)
    false_pos = [rep for rep in reports if rep["step"] <= controls * SCOUT_EVERY]
    base = _scout_run(root / "scout-off", [], min(steps, 12 * SCOUT_EVERY), detection=False, world=world,
                      timeout_s=timeout_s)
    on_t = statistics.median([t for r in res["ranks"] for t in r["step_times"][:controls * SCOUT_EVERY] or r["step_times"]])
    off_t = statistics.median([t for r in base["ranks"] for t in r["step_times"][5:]])
    return {"detector": "SCOUT layer replay (lm_resiliency 0.2.0)", "every_steps": SCOUT_EVERY, "world": world,
            "flips": flips, "controls": controls, "false_positives": len({r["step"] for r in false_pos}),
            "summary": summarize(outcomes), "culprit_named": named, "wall_s": round(wall, 1),
            "shim": res["ranks"][0]["shim"], "overhead": {"step_s_on": round(on_t, 4), "step_s_off": round(off_t, 4),
                                                         "fraction": round(on_t / off_t - 1, 3) if off_t else None},
            "outcomes": [o.to_dict() for o in outcomes], "versions": st["versions"]}


def _titan_overhead(root: Path, steps: int = 120) -> dict[str, Any]:
    """tinygpt under titan run with and without SDC (default cadence), median step time."""
    from titan.events import read_run

    out = {}
    for name, extra in (("on", []), ("off", ["--no-sdc"])):
        env = _env(root / f"ovh-{name}")
        env["TITAN_WATCHDOG_LEDGER_PATH"] = str(root / "ledger.sqlite")
        cmd = [str(ROOT / ".venv" / "bin" / "python"), "-m", "titan", "run", "--nproc-per-node", "2", "--no-agent",
               "--runs-dir", str(root / "ovh"), "--run-id", name, "--", "-m", "titan.workloads.tinygpt",
               "--steps", str(steps), "--threads", "1", "--ckpt-every", "0", *extra]
        (root / f"ovh-{name}").mkdir(parents=True, exist_ok=True)
        run_bounded(cmd, cwd=root / f"ovh-{name}", env=env, out=root / f"ovh-{name}" / "titan.out", timeout_s=900)
        ts = [float(e.data["step_time_s"]) for e in read_run(root / "ovh" / name).events
              if e.kind == "step" and (e.step or 0) > 10 and e.data.get("step_time_s") is not None]
        out[f"step_s_{name}"] = round(statistics.median(ts), 4) if ts else None
    on, off = out.get("step_s_on"), out.get("step_s_off")
    out["fraction"] = round(on / off - 1, 3) if on and off else None
    out["note"] = "median step time; the fingerprint round runs every 50 steps, so most steps carry none of it"
    return out


def run_sdc(root: Path, *, flips: int, controls: int, log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """``{"titan": {...}, "lm_resiliency": {...}}`` (each may be ``{"skipped": why}``)."""
    out: dict[str, Any] = {}
    log(f"  titan: {flips} flips after {controls} clean rounds, every {TITAN_EVERY} steps")
    try:
        out["titan"] = titan_sdc(root / "sdc-titan", flips, controls)
        out["titan"]["overhead"] = _titan_overhead(root / "sdc-titan")
    except Exception as e:  # noqa: BLE001 - a benchmark reports what failed and goes on
        out["titan"] = {"error": f"{type(e).__name__}: {e}"[:1500]}
    log(f"  lm_resiliency (SCOUT): {flips} flips after {controls} clean rounds, every {SCOUT_EVERY} steps, 4 ranks")
    try:
        out["lm_resiliency"] = scout_sdc(root / "sdc-scout", flips, controls)
    except Exception as e:  # noqa: BLE001
        out["lm_resiliency"] = {"error": f"{type(e).__name__}: {e}"[:1500]}
    return out
