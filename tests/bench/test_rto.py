"""bench/rto.py (the one recovery harness): its pure parts, without launching a job.

The same-script systems (``rto_systems.py``) read Titan's events; these tests write such
events into a run directory by hand and check the records the engine's ``analyse`` reads,
the phase breakdown, and the command line's refusal of bad input. A real comparison takes
minutes (``bench/rto.py --trials 5``, docs/benchmarks.md); the warm and per-step snapshot
paths it drives are tested end to end in tests/warm and tests/checkpoint.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import rto  # noqa: E402
from rto_systems import EventJob, SameScript  # noqa: E402

from titan.events import EventWriter, RunDir  # noqa: E402


def _write(rd: RunDir, name: str, evs: list[tuple[Any, ...]], **base: Any) -> None:
    w = EventWriter(rd.events_dir / name, run="run", node="node0", **base)
    for kind, step, data in evs:
        w.emit(kind, step=step, data=data)
    w.close()


def test_event_records_phases_and_gate(tmp_path: Path) -> None:
    """Titan's events become step-log records: marks for announce/ready/restored, one step
    record per step event (its start from ``step_time_s``), the launcher's restart, gates."""
    rd = RunDir.create(tmp_path / "runs", "run")
    _write(rd, "r1a0.jsonl", [("step", 18, {"step_time_s": 0.05}), ("chaos.gate", 19, {"fault": "f0"})],
           rank=1, attempt=0)
    job = EventJob(system=SameScript("titan_fast"), dir=tmp_path, world=2, rd=rd)
    job.poll()
    assert job.gates == {(1, 19): {"fault": "f0", "pid": job.records[-1]["pid"]}}
    assert SameScript("titan_fast").gated(job, {"kind": "kill", "rank": 1, "step": 18}) is False  # not armed yet
    assert (rd.path / "chaos" / "ready.f0").exists()
    (rd.path / "chaos" / "armed.f0.r1").touch()
    assert SameScript("titan_fast").gated(job, {"kind": "kill", "rank": 1, "step": 18}) is True
    step = [r for r in job.records if r["kind"] == "step"][0]
    assert step["step"] == 18 and abs(step["t"] - step["t_start"] - 0.05) < 1e-6
    # the "start" mark of a live process (this one) comes from /proc, before its first event
    assert job.records[0]["what"] == "start" and job.records[0]["t"] <= step["t"]


def test_analyse_reports_the_launchers_restart_and_every_phase() -> None:
    """A launcher ``restart`` mark (rank None) becomes the first phase; the replacement's marks follow."""
    def rec(t: float, kind: str, pid: int, rank: int | None, **kw: Any) -> dict[str, Any]:
        return {"t": t, "kind": kind, "pid": pid, "rank": rank, **kw}

    recs = [rec(1.0, "step", 100, 0, step=18, t_start=0.9), rec(1.0, "step", 101, 1, step=18, t_start=0.9),
            rec(2.2, "mark", 50, None, what="restart"),
            rec(2.4, "mark", 201, 1, what="start"), rec(2.5, "mark", 201, 1, what="announce", spawn="warm"),
            rec(2.6, "mark", 201, 1, what="ready"), rec(2.7, "mark", 201, 1, what="restored", step=18,
                                                       source="snapshot:restart"),
            rec(2.9, "step", 200, 0, step=19, t_start=2.8), rec(2.9, "step", 201, 1, step=19, t_start=2.8)]
    a = rto.analyse(recs, 2.0, 101, 1, 2)
    assert a["rto_s"] == 0.9 and a["rpo_steps"] == 0 and a["survivors_restarted"] is True, a
    assert list(a["phases"]) == list(rto.PHASES), a["phases"]
    assert a["phases"]["restart"] == 0.2 and a["phases"]["restored"] == 0.7
    assert a["restored_source"] == "snapshot:restart" and a["spawn"] == "warm"


def test_cli_refuses_bad_input_in_one_line() -> None:
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "rto.py"), "--systems", "titan_fast,nope"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.startswith("rto: error: unknown system 'nope'"), p.stderr
    assert "hint: systems are titan_fast, titan_cold, torchrun" in p.stderr and "Traceback" not in p.stderr
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "rto.py"), "--at-step", "40"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--at-step must be between 0 and --steps" in p.stderr, p.stderr
