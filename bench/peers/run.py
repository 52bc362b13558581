"""Titan side by side with its peers: one command, one run, ratios to Titan (issue 22).

    python bench/peers/run.py [--quick | --tiny] [--json] [--systems titan,torchft,…] [--measures 1,2,3,4,5,6]

The same tinygpt workload (2 and 4 ranks on gloo; same model, data, seed) and the same
fault schedule for titan, torchft, lm_resiliency, nvrx and torchrun, each wired as its own
docs say (``configs/<name>.toml`` cites the source of every setting), each peer in its own
virtual environment (``venvs.py``). Measures:

1. recovery from a killed rank (RTO, RPO, survivors restarted) — ``bench/rto.py``;
2. hang: detection, culprit named, recovery — ``bench/rto.py`` with SIGSTOP;
3. goodput under the schedule (a kill, a hang, a NaN, a slow rank) — ``scheduled.py``,
   by each system's own means and by ml-goodput-measurement (``goodput_adapter.py``);
4. in-memory capture stall per step, 100m preset — ``capture.py``;
5. silent data corruption: detection rate, latency, overhead — ``sdc.py``;
6. lines a user adds to the same loop — ``lines.py``.

Profiles (``configs/workload.toml``): ``--tiny`` is the behaviour check of the tests
(every system at once, tiny schedule, measures 1-3 and 6; measure 5 with 3 flips per
detector and dtype); ``--quick`` (≤ 15 min) takes (1) and (2) from the scheduled run's own
kill and hang, with fewer captures and flips;
the default full profile (≤ 60 min; 32.4 min measured) adds one separate kill and one hang trial
per system at 2 and 4 ranks (``trials`` in configs/workload.toml).
Neither runs in CI. Prints ``{"systems": {NAME: {"rto_s", "rpo_steps", "goodput",
"survivors_restarted", …}}}``; a system that cannot run here has ``"skipped": reason``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import rto  # noqa: E402
from peers import capture, lines, scheduled, sdc  # noqa: E402
from peers.systems import SYSTEMS, get  # noqa: E402
from peers.venvs import ROOT, load_config  # noqa: E402

__all__ = ["main", "ratios", "run_all"]

#: what each system's row takes from measure (4): its own in-memory capture, or the one it would use
CAPTURE_OF = {"titan": "titan_step", "lm_resiliency": "gemini", "torchrun": "dcp_async", "nvrx": "dcp_async"}
HEADLINE = ("rto_s", "rpo_steps", "survivors_restarted", "hang_detection_s", "hang_culprit_named",
            "hang_recovery_s", "goodput", "goodput_own", "goodput_lib", "schedule_finish_s", "capture_stall_s",
            "lines_added")
LOWER_IS_BETTER = ("rto_s", "rto_full_s", "rpo_steps", "hang_detection_s", "hang_recovery_s", "schedule_finish_s",
                   "capture_stall_s", "lines_added")


def _cpu_s() -> float:
    """CPU seconds of every finished child process so far (launchers and the workers they
    reaped): with the wall time, how much of a measure is computing and how much waiting,
    which is what a quieter box shortens (a lower bound: a process reaped by init is missed)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


class _Clock:
    """Wall and child-CPU seconds of one span."""

    def __init__(self) -> None:
        self.t, self.c = time.monotonic(), _cpu_s()

    def lap(self) -> dict[str, float]:
        return {"wall": round(time.monotonic() - self.t, 1), "cpu": round(_cpu_s() - self.c, 1)}


def _scheduled_row(name: str, wl: dict[str, Any], prof: dict[str, Any], root: Path) -> dict[str, Any]:
    s = get(name)
    why = s.unavailable()
    if why:
        return {"skipped": why}
    r = scheduled.scheduled_run(s, 2, prof["goodput_steps"], wl=wl, profile=prof, job_dir=root / f"schedule-{name}")
    r["versions"] = s.versions()
    return r


def _headline(name: str, sched: dict[str, Any] | None, trials: dict[str, Any]) -> dict[str, Any]:
    """The row of one system: trials' medians (full) or the scheduled run's kill/hang (quick, tiny)."""
    row: dict[str, Any] = {}
    kill = (trials.get("kill", {}).get(name, {}) or {}).get("world2") or (sched or {}).get("kill") or {}
    stop = (trials.get("stop", {}).get(name, {}) or {}).get("world2") or (sched or {}).get("stop") or {}
    row.update({"rto_s": kill.get("rto_s"), "rto_full_s": kill.get("rto_full_s"), "rpo_steps": kill.get("rpo_steps"),
                "survivors_restarted": kill.get("survivors_restarted"), "kill_detection_s": kill.get("detection_s"),
                "kill_phases_s": kill.get("phases"),
                "hang_detection_s": stop.get("detection_s"), "hang_culprit_named": stop.get("culprit_named"),
                "hang_recovery_s": stop.get("rto_s"), "hang_rpo_steps": stop.get("rpo_steps"),
                "hang_survivors_restarted": stop.get("survivors_restarted"),
                "hang_released_after_s": stop.get("released_after_s")})
    if sched and "skipped" not in sched:
        own = sched.get("goodput_own") or {}
        row.update({"goodput": sched.get("goodput_lib_finite"), "goodput_lib": sched.get("goodput_lib"),
                    "goodput_own": own.get("goodput"), "goodput_own_means": own.get("means"),
                    "nan_detected": sched.get("nan", {}).get("detected_by") is not None,
                    "nan_weights_poisoned": sched.get("nan", {}).get("weights_poisoned"),
                    "slow_detected": sched.get("slow", {}).get("detected_by") is not None,
                    "schedule_completed": sched.get("completed"), "final_loss": sched.get("final_loss"),
                    "schedule_finish_s": sched.get("finish_s")})
        if "goodput_lib_from_titan_events" in sched:
            row["goodput_lib_from_titan_events"] = sched["goodput_lib_from_titan_events"]
    return row


def ratios(systems: dict[str, Any]) -> dict[str, Any]:
    """Each peer's numeric headline fields divided by Titan's (``> 1``: the peer's figure is larger)."""
    base = systems.get("titan", {})
    out: dict[str, Any] = {}
    for name, row in systems.items():
        if name == "titan" or "skipped" in row:
            continue
        r = {}
        for k in ("rto_s", "rto_full_s", "rpo_steps", "hang_detection_s", "hang_recovery_s", "goodput",
                  "schedule_finish_s", "capture_stall_s", "lines_added"):
            a, b = row.get(k), base.get(k)
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and b:
                r[k] = round(a / b, 2)
        out[name] = r
    return out


_TABLE = (("rto_s", "(1) kill → first step after recovery, s"), ("rto_full_s", "(1) kill → every rank stepping again, s"),
          ("rpo_steps", "(1) steps lost"), ("survivors_restarted", "(1) survivors restarted"),
          ("hang_detection_s", "(2) stall → detected, s"), ("hang_culprit_named", "(2) culprit named"),
          ("hang_recovery_s", "(2) stall → first step after recovery, s"),
          ("goodput", "(3) goodput, ml-goodput-measurement (non-finite steps = badput)"),
          ("goodput_lib", "(3) goodput, ml-goodput-measurement as fed"),
          ("goodput_own", "(3) goodput, the system's own accounting"),
          ("schedule_finish_s", "(3) time to finish the schedule (launch → job end), s"),
          ("nan_detected", "(3) NaN detected"), ("nan_weights_poisoned", "(3) NaN reached the weights"),
          ("slow_detected", "(3) slow rank detected"), ("capture_stall_s", "(4) capture stall per step, 100m, s"),
          ("sdc_detection_rate", "(5) SDC flips detected, fp32"), ("sdc_detection_rate_bf16", "(5) SDC flips detected, bf16"),
          ("sdc_latency_steps_median", "(5) SDC latency, steps (median), fp32"),
          ("sdc_latency_steps_median_bf16", "(5) SDC latency, steps (median), bf16"),
          ("sdc_false_positives", "(5) false positives in clean rounds, fp32"),
          ("sdc_false_positives_bf16", "(5) false positives in clean rounds, bf16"),
          ("sdc_overhead", "(5) SDC overhead (in-run), fp32"), ("sdc_overhead_bf16", "(5) SDC overhead (in-run), bf16"),
          ("lines_added", "(6) lines added to the loop"))


def markdown(doc: dict[str, Any]) -> str:
    """The system × measure table of ``doc`` (ratios to Titan in brackets where numeric)."""
    names = [n for n in SYSTEMS if n in doc["systems"]]
    rows = ["| measure | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    base = doc["systems"].get("titan", {})

    def cell(n: str, k: str) -> str:
        row = doc["systems"][n]
        if "skipped" in row:
            return "skipped"
        v = row.get(k)
        if v is None:
            return "–"
        if isinstance(v, bool):
            return "yes" if v else "no"
        if isinstance(v, float):
            pct = k.startswith(("goodput", "sdc_detection_rate", "sdc_overhead"))
            txt = f"{v:.1%}" if pct and not k.startswith("sdc_overhead") else f"{v:.2%}" if pct else f"{v:.3g}"
        else:
            txt = str(v)
        b = base.get(k)
        if n != "titan" and isinstance(b, (int, float)) and not isinstance(b, bool) and b and isinstance(v, (int, float)):
            txt += f" ({v / b:.2g}×)"
        return txt
    for k, label in _TABLE:
        rows.append(f"| {label} | " + " | ".join(cell(n, k) for n in names) + " |")
    return "\n".join(rows)


def run_all(profile_name: str, names: list[str], measures: set[int], root: Path,
            log=lambda m: None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every requested measure for every requested system; the JSON document.
    ``overrides``: profile keys replaced for this run (e.g. ``sdc_flips``)."""
    wl = load_config("workload")
    prof = {**wl["profiles"][profile_name], **(overrides or {})}
    clk0 = _Clock()
    doc: dict[str, Any] = {"profile": profile_name, "profile_overrides": overrides or {}, "started": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                           "load_avg_start": os.getloadavg(), "workload": {k: v for k, v in wl.items() if k != "profiles"},
                           "systems": {}, "measures": {}}
    avail = {n: get(n).unavailable() for n in names}
    systems: dict[str, dict[str, Any]] = {n: ({"skipped": why} if why else {}) for n, why in avail.items()}
    runnable = [n for n in names if not avail[n]]

    timing: dict[str, Any] = {}  # wall seconds per measure (and per system where they run one by one)
    trials: dict[str, Any] = {}
    if measures & {1, 2} and prof.get("trials", 0) > 0:
        for fault, m in (("kill", 1), ("stop", 2)):
            if m in measures:
                log(f"measure {m}: {fault} trials, worlds {prof['worlds']}, {prof['trials']} each")
                clk = _Clock()
                trials[fault] = rto.run(runnable, fault=fault, worlds=prof["worlds"], trials=prof["trials"],
                                        profile=prof, wl=wl, root=root, progress=log)
                timing[f"{m}_trials"] = clk.lap()
        doc["measures"]["trials"] = rto._strip(trials)
    sched: dict[str, Any] = {}
    if measures & {1, 2, 3}:
        log(f"measure 3: the schedule ({prof['goodput_steps']} steps) on {', '.join(runnable)}")
        clk3, timing["3"] = _Clock(), {}
        if profile_name == "tiny":  # behaviour only: every system at once
            with concurrent.futures.ThreadPoolExecutor(max_workers=len(runnable) or 1) as ex:
                futs = {n: ex.submit(_scheduled_row, n, wl, prof, root) for n in runnable}
                sched = {n: f.result() for n, f in futs.items()}
        else:
            for n in runnable:
                clk = _Clock()
                sched[n] = _scheduled_row(n, wl, prof, root)
                timing["3"][n] = clk.lap()
                log(f"  {n}: goodput {sched[n].get('goodput_lib_finite')} (own {(sched[n].get('goodput_own') or {}).get('goodput')}),"
                    f" kill rto {sched[n].get('kill', {}).get('rto_s')} s, hang detected "
                    f"{sched[n].get('stop', {}).get('detection_s')} s, {sched[n].get('wall_s')} s")
        doc["measures"]["schedule"] = sched
        timing["3"]["total"] = clk3.lap()
    for n in runnable:
        systems[n].update(_headline(n, sched.get(n), trials))
        if n in sched and "versions" in sched[n]:
            systems[n]["versions"] = sched[n]["versions"]
        elif "versions" not in systems[n]:
            systems[n]["versions"] = get(n).versions()
    if 4 in measures and prof.get("captures", 0) > 0:
        log(f"measure 4: capture stall, 100m preset, {prof['captures']} captures each")
        clk = _Clock()
        cap = capture.run_capture(root, captures=prof["captures"], systems=prof.get("capture_systems"))
        doc["measures"]["capture"] = cap
        timing["4"] = {"total": clk.lap(), **{n: c.get("wall_s") for n, c in cap.items()}}
        for n in runnable:
            c = cap.get(CAPTURE_OF.get(n, ""), {})
            systems[n]["capture_stall_s"] = c.get("stall_s")
            systems[n]["capture_of"] = CAPTURE_OF.get(n, "none: torchft heals from a live peer, it keeps no in-memory copy")
    if 5 in measures and prof.get("sdc_flips", 0) > 0:
        dtypes = tuple(prof.get("sdc_dtypes", sdc.DTYPES))
        log(f"measure 5: SDC, {prof['sdc_flips']} flips + {prof['sdc_controls']} clean controls per detector "
            f"and dtype ({', '.join(dtypes)})")
        clk = _Clock()
        res = sdc.run_sdc(root, flips=prof["sdc_flips"], controls=prof["sdc_controls"], dtypes=dtypes, log=log)
        doc["measures"]["sdc"] = res
        timing["5"] = {"total": clk.lap(), **{n: {dt: r.get("wall_s") for dt, r in by.items()} for n, by in res.items()}}
        for n in runnable:
            if n in res:
                systems[n]["sdc"] = {dt: {k: v for k, v in r.items() if k != "outcomes"} for dt, r in res[n].items()}
                for dt, r in res[n].items():
                    sfx = "" if dt == "fp32" else f"_{dt}"
                    s = r.get("summary", {})
                    systems[n][f"sdc_detection_rate{sfx}"] = (s.get("overall") or {}).get("rate")
                    systems[n][f"sdc_latency_steps_median{sfx}"] = (s.get("latency_steps") or {}).get("median")
                    systems[n][f"sdc_false_positives{sfx}"] = r.get("false_positives")
                    systems[n][f"sdc_overhead{sfx}"] = (r.get("overhead") or {}).get("fraction")
            else:
                systems[n]["sdc"] = {"skipped": f"{n} has no silent-data-corruption detection"}
    if 6 in measures:
        doc["measures"]["lines"] = {n: lines.lines_added(n) for n in names}
        for n in names:
            systems[n]["lines_added"] = doc["measures"]["lines"][n]["lines"]
    doc["systems"] = systems
    doc["ratios_to_titan"] = ratios(systems)
    doc["wall_s"] = clk0.lap()["wall"]
    doc["timing_s"] = timing  # {"wall", "cpu"} per measure (and per system in (3)); see _cpu_s
    doc["cpu_s"] = clk0.lap()["cpu"]
    doc["load_avg_end"] = os.getloadavg()
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="≤ 15 min: (1), (2) from the scheduled run; fewer captures/flips")
    g.add_argument("--tiny", action="store_true", help="the tests' behaviour check: tiny schedule, all systems at once")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--measures", default="1,2,3,4,5,6")
    ap.add_argument("--keep", help="keep every job directory under this folder")
    ap.add_argument("--out", help="also write the JSON document to this file")
    ap.add_argument("--json", action="store_true", help="print the JSON document (else a progress log and a summary)")
    ap.add_argument("--markdown", help="also write the system × measure table (markdown) to this file")
    ap.add_argument("--sdc-flips", type=int, help="measure 5: flips per detector and dtype (the profile's otherwise)")
    ap.add_argument("--sdc-controls", type=int, help="measure 5: clean intervals per detector and dtype")
    a = ap.parse_args(argv)
    names = [s.strip() for s in a.systems.split(",") if s.strip()]
    try:
        measures = {int(m) for m in a.measures.split(",") if m.strip()}
    except ValueError:
        measures = {0}
    bad = [n for n in names if n not in SYSTEMS]
    overrides = {k: v for k, v in (("sdc_flips", a.sdc_flips), ("sdc_controls", a.sdc_controls)) if v is not None}
    if any(v < 1 for v in overrides.values()):
        print("peers: error: --sdc-flips and --sdc-controls must be >= 1\nhint: e.g. --sdc-flips 50 --sdc-controls 20",
              file=sys.stderr)
        return 2
    if bad or not measures <= {1, 2, 3, 4, 5, 6} or not names:
        what = f"unknown system {bad[0]!r}" if bad else ("no system" if not names else f"bad --measures {a.measures!r}")
        print(f"peers: error: {what}\nhint: --systems from {','.join(SYSTEMS)}; --measures from 1,2,3,4,5,6",
              file=sys.stderr)
        return 2
    profile = "tiny" if a.tiny else "quick" if a.quick else "full"
    log = (lambda m: print(m, file=sys.stderr, flush=True)) if not a.json else (lambda m: None)
    with tempfile.TemporaryDirectory(prefix="peers-", dir=os.environ.get("TMPDIR")) as tmp:
        root = Path(a.keep).resolve() if a.keep else Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        doc = run_all(profile, names, measures, root, log=log, overrides=overrides)
    doc["command"] = "python bench/peers/run.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = json.dumps(doc, indent=1, default=str)
    if a.out:
        Path(a.out).write_text(text)
    if a.markdown:
        Path(a.markdown).write_text(markdown(doc) + "\n")
    if a.json:
        print(text)
    else:
        for n, row in doc["systems"].items():
            print(n, json.dumps({k: row.get(k) for k in ("skipped", *HEADLINE) if k in row}, default=str))
        print("ratios to titan:", json.dumps(doc["ratios_to_titan"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
