"""bench/peers: the side-by-side harness runs every system on a tiny schedule (behaviour, not timings).

One ``python bench/peers/run.py --tiny --json`` (every system at once: a kill at step 24,
a SIGSTOP at 48, a NaN at 56, a slow rank; checkpoints every 20 steps) feeds the
per-system tests. That run takes ~5 min, so those tests are ``slow`` (``make test-slow``,
after ``make peers-venvs``); a system whose virtual environment is missing is skipped with
the reason (``python bench/peers/venvs.py --build``). The harness's pure parts (the RTO
analysis, the ml-goodput-measurement adapter's records, the line counter, the configs,
the table) run in the default suite without any run or peer environment.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import rto  # noqa: E402
from peers import goodput_adapter, lines  # noqa: E402
from peers.systems import SYSTEMS, get  # noqa: E402

PEERS = ("torchft", "lm_resiliency", "nvrx")
CKPT = 20  # configs/workload.toml ckpt_every


def _missing(name: str) -> str | None:
    return get(name).unavailable()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    missing = {n: why for n in SYSTEMS if (why := _missing(n))}
    names = [n for n in SYSTEMS if n not in missing]
    out = tmp_path_factory.mktemp("peers") / "tiny.json"
    keep = out.parent / "jobs"
    cmd = [sys.executable, str(ROOT / "bench" / "peers" / "run.py"), "--tiny", "--json", "--measures", "1,2,3,6",
           "--systems", ",".join(names), "--keep", str(keep), "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1100, cwd=ROOT)
    assert p.returncode == 0, f"run.py --tiny exited {p.returncode}:\n{p.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    doc["_missing"] = missing
    return doc


def _row(doc: dict[str, Any], name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    if name in doc["_missing"]:
        pytest.skip(f"{name}: {doc['_missing'][name]}")
    row, sched = doc["systems"][name], doc["measures"]["schedule"][name]
    assert "skipped" not in row, row
    if "goodput_lib_error" in sched:  # ml-goodput-measurement lives in the peers' environments
        pytest.skip(f"{name}: ml-goodput-measurement unavailable ({sched['goodput_lib_error'][:200]}); "
                    "run `make peers-venvs`")
    return row, sched


def _assert_resumed_from_checkpoint(sched: dict[str, Any], every: int = CKPT) -> None:
    kill = sched["kill"]
    assert kill["rto_s"] is not None, f"no step after the kill: {kill}"
    if every == CKPT:
        assert kill["resumed_from"] == CKPT, f"expected a resume from the step-{CKPT} checkpoint, saw {kill}"
    else:  # a tier that may still be writing the newest copy: an older complete one
        assert 0 < kill["resumed_from"] <= CKPT and kill["resumed_from"] % every == 0, kill
    assert kill["rpo_steps"] == kill["steps_before"] - kill["resumed_from"], kill
    assert kill["survivors_restarted"] is True, f"a group restart replaces the survivors too: {kill}"


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_titan_recovers_detects_and_accounts(tiny: dict[str, Any]) -> None:
    """Titan: group restart from its per-step in-memory tier (snapshot_every_steps = 1: at
    most one step lost, not the 20-step disk cadence); the hang named by the watchdog; the
    NaN skipped by the guard; its goodput accounting and ml-goodput-measurement fed from
    its events agree within 1 point."""
    row, sched = _row(tiny, "titan")
    assert sched["completed"], f"the scheduled run did not finish: {sched.get('error')}"
    kill = sched["kill"]
    assert kill["rto_s"] is not None and kill["survivors_restarted"] is True, kill
    assert kill["steps_before"] - 1 <= kill["resumed_from"] <= kill["steps_before"], \
        f"expected a resume from the last step (per-step tier), saw {kill}"
    assert kill["rpo_steps"] <= 1, kill
    stop = sched["stop"]
    assert stop["detected_by"] == "hang.detected" and stop["culprit_named"], f"hang not named: {stop}"
    assert stop["released_after_s"] is None, "the watchdog, not the harness, ended the stall"
    assert sched["nan"]["detected_by"] == "guard.nonfinite" and not sched["nan"]["weights_poisoned"], sched["nan"]
    own, lib = sched["goodput_own"]["goodput"], sched["goodput_lib_from_titan_events"]
    assert 0 < own < 1 and abs(own - lib) <= 0.01, f"titan accounting {own} vs ml-goodput-measurement {lib}"


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_torchrun_restarts_group_and_waits_out_a_hang(tiny: dict[str, Any]) -> None:
    """Plain torchrun + DCP: group restart from the checkpoint; a stalled rank is never
    detected (30-minute gloo timeout), the job waits until the stall ends; the NaN poisons
    the weights (nothing checks)."""
    row, sched = _row(tiny, "torchrun")
    assert sched["completed"], sched.get("error")
    _assert_resumed_from_checkpoint(sched)
    stop = sched["stop"]
    assert stop["detection_s"] is None and stop["released_after_s"] is not None, stop
    assert stop["rto_s"] >= stop["released_after_s"], f"progress before the stall ended? {stop}"
    assert sched["nan"]["weights_poisoned"] and sched["nonfinite_steps"] > 0, sched["nan"]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_nvrx_heartbeats_detect_the_stall(tiny: dict[str, Any]) -> None:
    """NVRx ft_launcher: group restart from the checkpoint on a kill; the heartbeat timeout
    (calculated after the first checkpoint) detects the stall and the group restarts."""
    row, sched = _row(tiny, "nvrx")
    assert sched["completed"], sched.get("error")
    _assert_resumed_from_checkpoint(sched)
    stop = sched["stop"]
    assert stop["detected_by"] in ("heartbeat timeout", "worker failed"), stop
    assert stop["released_after_s"] is None and stop["survivors_restarted"] is True, stop


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_lm_resiliency_restores_from_gemini(tiny: dict[str, Any]) -> None:
    """LM Resiliency under torchrun: the restarted group resumes from GEMINI's node-local
    tier (captures every 10 steps, flushed every 20; recovery takes the newest copy every
    rank can load, so an older one when the newest was still being written), not from 0."""
    row, sched = _row(tiny, "lm_resiliency")
    assert sched["completed"], sched.get("error")
    _assert_resumed_from_checkpoint(sched, every=10)


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_torchft_replica_comes_back(tiny: dict[str, Any]) -> None:
    """torchft: the harness runs the lighthouse and one torchrun per replica group, delivers
    both signals and measures them: the killed replica gets a new process from its own
    torchrun and steps again. (Whether the job then reaches its last step is torchft's
    behaviour, recorded, not asserted: 0.2.0's survivor crashes, docs/peers.md.)"""
    row, sched = _row(tiny, "torchft")
    kill, stop = sched["kill"], sched["stop"]
    assert kill["rto_s"] is not None and "start" in kill["phases"], kill
    assert kill["detected_by"] == "replica failed" and kill["culprit_named"], kill
    # after the stall: a recovery, the harness's release (the other replica, alone in the
    # quorum, may have finished already), or the run's end said
    assert stop["at_step"] >= 48 and (stop["rto_s"] is not None or stop["released_after_s"] is not None
                                      or sched["error"]), stop
    assert sched["completed"] or sched["error"], "the harness must say how the run ended"


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_every_system_has_goodput_and_lines(tiny: dict[str, Any]) -> None:
    """Every system that ran has ml-goodput-measurement's goodput and a line count; the
    JSON has the documented shape."""
    for name, row in tiny["systems"].items():
        if "skipped" in row:
            assert name in tiny["_missing"], row
            continue
        assert {"rto_s", "rpo_steps", "goodput", "survivors_restarted"} <= set(row), row
        err = tiny["measures"]["schedule"].get(name, {}).get("goodput_lib_error")
        if err:
            pytest.skip(f"{name}: ml-goodput-measurement unavailable ({err[:200]}); run `make peers-venvs`")
        assert 0 < row["goodput_lib"] <= 1, (name, row)
        assert isinstance(row["lines_added"], int) and row["lines_added"] > 0, (name, row)
    assert set(tiny["ratios_to_titan"]) <= set(SYSTEMS) - {"titan"}


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_sdc_measure_runs_both_detectors_in_fp32_and_bf16(tmp_path: Path) -> None:
    """Measure (5) at the tiny size (3 flips after 2 clean intervals per detector and dtype):
    Titan and SCOUT each train in fp32 and in bf16, every flip lands in a tensor of the run's
    dtype (bits drawn in that dtype's layout), no clean interval raises a detection, the
    overhead is measured, and Titan catches every sign/exponent flip outside a gradient
    (the classes its replica oracle sees by construction, docs/sdc.md)."""
    if _missing("lm_resiliency"):
        pytest.skip(f"lm_resiliency: {_missing('lm_resiliency')}")
    out = tmp_path / "sdc.json"
    cmd = [sys.executable, str(ROOT / "bench" / "peers" / "run.py"), "--tiny", "--json", "--measures", "5",
           "--systems", "titan,lm_resiliency", "--keep", str(tmp_path / "jobs"), "--out", str(out)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1400, cwd=ROOT)
    assert p.returncode == 0, f"run.py --tiny --measures 5 exited {p.returncode}:\n{p.stderr[-3000:]}"
    doc = json.loads(out.read_text())
    res = doc["measures"]["sdc"]
    for name in ("titan", "lm_resiliency"):
        assert set(res[name]) == {"fp32", "bf16"}, res[name].keys()
        for dtype, want in (("fp32", "float32"), ("bf16", "bfloat16")):
            r = res[name][dtype]
            assert "error" not in r and "skipped" not in r, (name, dtype, r)
            outcomes = r["outcomes"]
            assert len(outcomes) == 3 and all(o["injected"] for o in outcomes), (name, dtype, outcomes)
            assert {o["dtype"] for o in outcomes} == {want}, (name, dtype, outcomes)
            assert all(o["bit"] < (16 if dtype == "bf16" else 32) for o in outcomes), outcomes
            assert r["false_positives"] == 0, (name, dtype, r["false_positives"])
            assert isinstance(r["overhead"]["fraction"], float), (name, dtype, r["overhead"])
            if name == "titan":
                persistent = [o for o in outcomes if o["kind"] != "grad" and o["bit_class"] != "mantissa"]
                assert persistent and all(o["detected"] for o in persistent), (dtype, outcomes)
        assert doc["systems"][name]["sdc_detection_rate_bf16"] is not None, doc["systems"][name]


# -- the harness's pure parts ----------------------------------------------------------

def _rec(t: float, step: int, rank: int, pid: int, t_start: float | None = None) -> dict[str, Any]:
    return {"kind": "step", "t": t, "t_start": t - 0.1 if t_start is None else t_start, "step": step,
            "rank": rank, "pid": pid, "loss": 1.0, "finite": True, "restart": 0}


def test_analyse_group_restart() -> None:
    """Group restart: RTO to the first new step, RPO to the checkpoint, survivors replaced."""
    recs = [_rec(t, s, r, 100 + r) for s, t in enumerate([1.0, 2.0, 3.0], start=1) for r in (0, 1)]
    recs += [{"kind": "mark", "what": "start", "t": 4.0, "pid": 201, "rank": None, "restart": 1}]
    recs += [_rec(6.0, 2, 0, 200), _rec(6.1, 2, 1, 201), _rec(7.0, 3, 0, 200), _rec(7.1, 3, 1, 201)]
    a = rto.analyse(recs, 3.5, 101, 1, 2)
    assert a["rto_s"] == 2.5 and a["rto_full_s"] == 2.6 and a["rpo_steps"] == 2 and a["resumed_from"] == 1
    assert a["survivors_restarted"] is True and a["phases"]["start"] == 0.5 and a["phases"]["first_step"] == 2.6


def test_analyse_survivor_keeps_stepping_and_in_flight_step_is_not_recovery() -> None:
    """A survivor's step that began before the fault is not recovery; its next one is."""
    recs = [_rec(t, s, r, 100 + r) for s, t in enumerate([1.0, 2.0], start=1) for r in (0, 1)]
    recs += [_rec(2.6, 3, 0, 100, t_start=2.1)]  # in flight at the fault (t=2.5)
    recs += [_rec(8.0, 4, 0, 100, t_start=7.5), _rec(9.0, 4, 1, 300, t_start=8.5)]
    a = rto.analyse(recs, 2.5, 101, 1, 2)
    assert a["rto_s"] == 5.5 and a["rpo_steps"] == 0 and a["survivors_restarted"] is False, a


def test_goodput_records_follow_the_calculators_protocol() -> None:
    """The adapter writes step *starts* (the previous step's end), the interrupted step of
    a failed attempt, a shutdown boundary, and skips as custom badput — in time order."""
    class E:  # a StepExec's fields the adapter reads
        def __init__(self, attempt: int, step: int, t_end: float, skipped: bool = False) -> None:
            self.attempt, self.step, self.t_end, self.dur, self.skipped, self.loss = attempt, step, t_end, 0.5, skipped, 1.0
    execs = [E(0, 1, 10.0), E(0, 2, 11.0, skipped=True), E(1, 2, 20.0), E(1, 3, 21.0)]
    recs = goodput_adapter.records_from_executions(execs, job_start=5.0, attempt_starts={0: 5.0, 1: 15.0},
                                                   stalls=[], failed_attempts={0}, job_end=23.0)
    steps = [(kw["step"], kw["start_time"]) for m, kw in recs if m == "record_step_start_time"]
    assert steps == [(1, 9.5), (2, 10.0), (3, 11.0), (2, 19.5), (3, 20.0), (4, 23.0)], steps
    times = [next(v for k, v in kw.items() if k.endswith("time")) for _, kw in recs]
    assert times == sorted(times)
    kinds = [kw.get("custom_badput_event_type") for m, kw in recs if "custom" in m]
    assert kinds == ["guard_skipped", "guard_skipped", "shutdown", "shutdown"], kinds
    assert recs[-1] == ["record_job_end_time", {"end_time": 23.0}]


def test_lines_counts_only_what_the_system_adds() -> None:
    """The plain loop adds nothing to itself; a peer's count lists its own API lines."""
    ft = lines.lines_added("torchft")
    assert any("Manager(" in ln for ln in ft["added"]) and ft["lines"] == len(ft["added"])
    assert not any("# bench" in ln or "LOG." in ln for s in SYSTEMS for ln in lines.lines_added(s)["added"])
    plain = lines.code_lines(ROOT / "bench" / "peers" / "scripts" / "plain.py")
    assert plain and not any("LOG" in ln for ln in plain)


def test_every_setting_cites_its_source() -> None:
    """No strawmen: every setting of every system's config names where it comes from."""
    for name in (*SYSTEMS, "goodput"):
        cfg = tomllib.loads((ROOT / "bench" / "peers" / "configs" / f"{name}.toml").read_text())
        for key, s in cfg.get("settings", {}).items():
            assert "value" in s and len(str(s.get("source", ""))) > 15, f"{name}.{key} has no source: {s}"
        if name not in ("titan", "torchrun"):
            assert cfg.get("packages"), f"{name}: no pinned packages"


def test_ratios_and_table_divide_by_titan_and_show_skips() -> None:
    """Ratios are peer / Titan for numeric fields only (booleans are not numbers); the
    markdown table shows each ratio beside its value and a skipped system as skipped."""
    from peers import run

    systems = {"titan": {"rto_s": 4.0, "goodput": 0.5, "survivors_restarted": True, "lines_added": 10},
               "torchft": {"rto_s": 6.0, "goodput": 0.25, "survivors_restarted": False, "lines_added": 5},
               "nvrx": {"skipped": "no environment"}}
    r = run.ratios(systems)
    assert r == {"torchft": {"rto_s": 1.5, "goodput": 0.5, "lines_added": 0.5}}, r
    table = run.markdown({"systems": systems})
    rto_line = next(ln for ln in table.splitlines() if ln.startswith("| (1) kill → first step"))
    assert "| 4 |" in rto_line and "6 (1.5×)" in rto_line, rto_line
    assert "skipped" in rto_line and "| no |" in next(ln for ln in table.splitlines() if "survivors restarted" in ln)
