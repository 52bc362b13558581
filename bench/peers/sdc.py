"""Measure (5): silent data corruption — Titan's fingerprints/canary vs LM Resiliency's SCOUT.

Both take flips drawn by the project's one bit-flip harness, ``titan.chaos.flips`` (issue
21): one flip per check interval at a random step strictly between two checks, tensor kind
(parameter, local gradient, AdamW ``exp_avg``/``exp_avg_sq``) and bit class (sign,
exponent, mantissa) drawn uniformly, in the bit layout of the trained dtype. Both detectors
run twice: tinygpt in fp32, and in bf16 (bf16 parameters, hence bf16 gradients and AdamW
moments; the loss in fp32), from the same seed (the draws part ways at the first bit
drawn: fp32 and bf16 have different bit counts, so each run takes its own flips of the same
distribution). Each system checks at its own documented cadence: Titan
``sdc.every_steps = 50`` (its default), SCOUT ``interval = 10`` (docs/api.md). The first
``controls`` intervals of each run carry no flip: they are the clean controls (a detection
there is a false positive), and the overhead is measured in them, in-run.

* Titan: ``titan.chaos.flips.run_flips`` (tinygpt under ``titan run``, 2 ranks; Titan
  repairs each caught flip itself by rolling back to a verified snapshot);
* SCOUT: ``scripts/scout_sdc.py`` under torchrun, 4 ranks (SCOUT localises only with three
  or more equivalent peers), with a CUDA shim (``torch.cuda.synchronize`` made a no-op: its
  replay calls it unconditionally).

Overhead, in-run (two separate on/off runs differ by more than either detector costs on a
loaded box): Titan from its events (fingerprint round, verified snapshot, per step); SCOUT
from the step times of the positions in its interval (its check runs inside the optimizer
step).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

import torch

from peers.systems import free_port, run_bounded
from peers.venvs import HERE, ROOT, load_config, python_for, status

__all__ = ["DTYPES", "run_sdc", "titan_sdc", "scout_sdc"]

TITAN_EVERY, SCOUT_EVERY = 50, 10
#: The two trainings measure (5) runs each detector on: fp32, and bf16 *parameters* (so
#: gradients and AdamW moments are bf16 too) — not autocast, which keeps every persistent
#: tensor fp32 and leaves no bf16 state to flip (docs/peers.md).
DTYPES = ("fp32", "bf16")
_TORCH_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _env(log_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TITAN_", "PEERS_", "TORCHELASTIC_"))}
    env.update({"PYTHONPATH": f"{ROOT / 'src'}:{ROOT / 'bench'}", "PEERS_LOG_DIR": str(log_dir),
                "CUDA_VISIBLE_DEVICES": "", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "OMP_NUM_THREADS": "1"})
    return env


def _titan_overhead(events: list[Any], every: int, controls: int) -> dict[str, Any]:
    """In-run cost of Titan's SDC work over the clean control intervals, from its own events:
    each fingerprint round (``sdc.round`` seconds: hash + all-gather) and the verified snapshot
    it takes when the replicas agree (``ckpt.snapshot``, the repair's in-memory copy), against
    the median step (``step_time_s``: forward, backward, update). The canary (one 128×128
    GEMM per round) is not timed separately (0.05 ms, bench/sdc_overhead.py)."""
    last = controls * every
    steps = [float(e.data["step_time_s"]) for e in events if e.kind == "step" and e.data.get("step_time_s") is not None
             and 0 < (e.step or 0) <= last and not e.data.get("replay")]
    rounds = [float(e.data["seconds"]) for e in events if e.kind == "sdc.round" and e.data.get("agree")
              and 0 < (e.step or 0) <= last]
    snaps = [float(e.data["seconds"]) for e in events if e.kind == "ckpt.snapshot" and 0 < (e.step or 0) <= last
             and (e.step or 0) % every == 0]
    if not steps or not rounds:
        return {"fraction": None, "note": "no clean steps or rounds recorded"}
    t_step, t_round = statistics.median(steps), statistics.median(rounds)
    t_snap = statistics.median(snaps) if snaps else 0.0
    return {"step_s": round(t_step, 4), "round_s": round(t_round, 5), "snapshot_s": round(t_snap, 5),
            "fraction": round(t_round / (every * t_step), 5),
            "fraction_with_snapshot": round((t_round + t_snap) / (every * t_step), 5),
            "how": f"in-run: median fingerprint round (+ verified snapshot) per {every} steps / median step, "
                   f"clean intervals (steps 1-{last})"}


def titan_sdc(root: Path, flips: int, controls: int, *, dtype: str = "fp32", seed: int = 1) -> dict[str, Any]:
    """Titan's fingerprints/canary against ``flips`` flips after ``controls`` clean intervals,
    tinygpt trained in ``dtype`` (``bf16``: bf16 parameters, gradients and AdamW moments)."""
    from titan.chaos.flips import random_flips, run_flips
    from titan.events import read_run

    root.mkdir(parents=True, exist_ok=True)
    specs = random_flips(flips, every=TITAN_EVERY, ranks=2, seed=seed, first_interval=controls,
                         dtype=_TORCH_DTYPE[dtype])
    env = _env(root / "log")
    env["XDG_STATE_HOME"] = str(root / "state")
    env["TITAN_WATCHDOG_LEDGER_PATH"] = str(root / "ledger.sqlite")
    # Every flip lands on this one node on purpose: Titan's exclusion of a node that corrupts
    # twice within sdc.escalate_window_steps (1000) would end the run after two named culprits
    # (it did in the first full run: 7 of 50 flips never injected), so each flip is judged on
    # its own (a window of 1 step).
    run = run_flips(specs, every=TITAN_EVERY, cwd=root, runs_dir=root / "runs", env=env, nproc=2,
                    ckpt_every=TITAN_EVERY, timeout_s=3000, seed=0,
                    workload_args=("--threads", "1", "--set", "sdc.escalate_window_steps=1"))
    events = read_run(run.run_dir).events
    inj_t = min((e.t for e in events if e.kind == "inject.bitflip"), default=None)
    false_pos = [e for e in events if e.kind in ("sdc.mismatch", "sdc.canary") and (e.step or 0) <= controls * TITAN_EVERY
                 and (inj_t is None or e.t < inj_t)]
    steps = [e for e in events if e.kind == "step" and e.data.get("step_time_s") is not None]
    return {"detector": "cross-replica fingerprints + GEMM canary (titan.sdc)", "every_steps": TITAN_EVERY,
            "world": 2, "dtype": dtype, "flips": flips, "controls": controls, "false_positives": len(false_pos),
            "summary": run.summary, "wall_s": round(run.wall_s, 1), "run_steps": run.steps,
            "launcher_exit": run.launcher_exit, "outcomes": [o.to_dict() for o in run.outcomes],
            "steps_recorded": len(steps), "overhead": _titan_overhead(events, TITAN_EVERY, controls)}


def _scout_run(root: Path, flips: list[dict[str, Any]], steps: int, *, dtype: str, world: int,
               timeout_s: float) -> dict[str, Any]:
    cfg = load_config("lm_resiliency")
    root.mkdir(parents=True, exist_ok=True)
    (root / "flips.json").write_text(json.dumps(flips))
    cmd = [str(python_for(cfg)), "-m", "torch.distributed.run", "--nproc-per-node", str(world), "--rdzv-backend",
           "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", str(HERE / "scripts" / "scout_sdc.py"),
           "--flips", str(root / "flips.json"), "--steps", str(steps), "--interval", str(SCOUT_EVERY),
           "--threads", "1", "--dtype", dtype]
    rc = run_bounded(cmd, cwd=root, env=_env(root), out=root / "torchrun.out", timeout_s=timeout_s)
    ranks = [json.loads(f.read_text()) for f in sorted(root.glob("scout.rank*.json"))]
    if len(ranks) < world:
        raise RuntimeError(f"SCOUT run exited {rc} with {len(ranks)}/{world} results: "
                           + (root / "torchrun.out").read_text(errors="replace")[-1200:])
    return {"ranks": ranks, "exit": rc}


def _scout_overhead(ranks: list[dict[str, Any]], controls: int) -> dict[str, Any]:
    """In-run cost of SCOUT's checks over the clean intervals: SCOUT works inside the
    optimizer step of its check steps (capture, layer replay, exchange), so per position in
    the interval the median step time over the clean intervals (the first, warm-up,
    excluded), slowest rank; the extra time of the positions above the typical step is the
    check's cost per interval."""
    first = 1 if controls > 1 else 0
    per_pos: list[float] = []
    for j in range(SCOUT_EVERY):
        ts = [max(r["step_times"][i * SCOUT_EVERY + j] for r in ranks) for i in range(first, controls)
              if all(len(r["step_times"]) > i * SCOUT_EVERY + j for r in ranks)]
        if not ts:
            return {"fraction": None, "note": "too few clean intervals"}
        per_pos.append(statistics.median(ts))
    base = statistics.median(per_pos)
    extra = sum(max(0.0, t - base) for t in per_pos)
    return {"step_s": round(base, 4), "check_interval_extra_s": round(extra, 4),
            "per_position_s": [round(t, 4) for t in per_pos], "fraction": round(extra / (SCOUT_EVERY * base), 4),
            "how": f"in-run: per position in the {SCOUT_EVERY}-step interval the median step over the clean "
                   "intervals; the extra above the typical step / the interval's time"}


def scout_sdc(root: Path, flips: int, controls: int, *, dtype: str = "fp32", seed: int = 1, world: int = 4,
              timeout_s: float = 1800) -> dict[str, Any]:
    """SCOUT against the same kind of flips (its own cadence), after ``controls`` clean intervals."""
    from titan.chaos.flips import FlipOutcome, random_flips, summarize

    st = status(load_config("lm_resiliency"))
    if not st["ok"]:
        return {"skipped": st["reason"]}
    specs = random_flips(flips, every=SCOUT_EVERY, ranks=world, seed=seed, first_interval=controls,
                         dtype=_TORCH_DTYPE[dtype])
    steps = (controls + flips + 1) * SCOUT_EVERY
    t0 = time.monotonic()
    res = _scout_run(root / f"scout-{dtype}", [asdict(s) for s in specs], steps, dtype=dtype, world=world,
                     timeout_s=timeout_s)
    wall = time.monotonic() - t0
    flipped = {(f["step"], f["rank"]): f for r in res["ranks"] for f in r["flips"]}
    reports = sorted((rep for r in res["ranks"] for rep in r["reports"] if any(rep["sdc_bitmap"])),
                     key=lambda x: x["t"])
    outcomes, named = [], 0
    for s in specs:
        f = flipped.get((s.step, s.rank))
        o = FlipOutcome(step=s.step, rank=s.rank, kind=s.kind, tensor=s.tensor, index=s.index, bit=s.bit,
                        bit_class=s.bit_class, injected=f is not None, dtype=s.dtype)
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
    return {"detector": "SCOUT layer replay (lm_resiliency 0.2.0)", "every_steps": SCOUT_EVERY, "world": world,
            "dtype": dtype, "flips": flips, "controls": controls, "false_positives": len({r["step"] for r in false_pos}),
            "summary": summarize(outcomes), "culprit_named": named, "wall_s": round(wall, 1),
            "shim": res["ranks"][0]["shim"], "overhead": _scout_overhead(res["ranks"], controls),
            "outcomes": [o.to_dict() for o in outcomes], "versions": st["versions"]}


def run_sdc(root: Path, *, flips: int, controls: int, dtypes: tuple[str, ...] = DTYPES,
            log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """``{"titan": {dtype: {...}}, "lm_resiliency": {dtype: {...}}}`` (each may be
    ``{"skipped": why}`` or ``{"error": …}``); ``flips`` and ``controls`` per dtype."""
    out: dict[str, Any] = {"titan": {}, "lm_resiliency": {}}
    for dtype in dtypes:
        log(f"  titan, {dtype}: {flips} flips after {controls} clean rounds, every {TITAN_EVERY} steps")
        t0 = time.monotonic()
        try:
            out["titan"][dtype] = titan_sdc(root / f"sdc-titan-{dtype}", flips, controls, dtype=dtype)
        except Exception as e:  # noqa: BLE001 - a benchmark reports what failed and goes on
            out["titan"][dtype] = {"error": f"{type(e).__name__}: {e}"[:1500]}
        log(f"    {time.monotonic() - t0:.0f} s")
        log(f"  lm_resiliency (SCOUT), {dtype}: {flips} flips after {controls} clean rounds, every {SCOUT_EVERY} "
            "steps, 4 ranks")
        t0 = time.monotonic()
        try:
            out["lm_resiliency"][dtype] = scout_sdc(root / "sdc-scout", flips, controls, dtype=dtype)
        except Exception as e:  # noqa: BLE001
            out["lm_resiliency"][dtype] = {"error": f"{type(e).__name__}: {e}"[:1500]}
        log(f"    {time.monotonic() - t0:.0f} s")
    return out
