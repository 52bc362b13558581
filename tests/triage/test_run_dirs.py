"""Titan run directories: the culprit comes from the evidence, a succeeded run is no failure (issue 15).

Run directories are the real drill run in the corpus (``real_drill_kill``) or written with the
real ``titan.events.EventWriter`` / ``RunDir`` in the documented event format.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from titan.cli.environment import Environment
from titan.cli.main import run
from titan.events import EventWriter, RunDir
from titan.exitcodes import ExitCode
from titan.triage import triage

CORPUS = Path(__file__).parent / "corpus"
T0 = 1_796_000_000.0


def _cli(tmp_path: Path, *argv: str) -> tuple[ExitCode, str]:
    env = Environment.captured(tmp_path)
    code = run(["triage", *argv], env)
    return code, env.stdout.getvalue()  # type: ignore[attr-defined]


def _steps(rd: RunDir, ranks: list[int], n: int) -> None:
    for r in ranks:
        with EventWriter(rd.event_file("node-a", r, 0, 1000 + r), run=rd.run_id, node="node-a", rank=r) as w:
            for s in range(1, n + 1):
                w.emit("step", step=s, data={"loss": 2.0 - s * 0.01, "step_time_s": 0.1})


def test_a_sigkilled_rank_is_the_culprit_not_the_peer_that_exited_10_after_seeing_it_go(tmp_path: Path) -> None:
    # rank 1 is SIGKILLed; rank 0 sees the peer close and exits 10 (WORKER_COMM_FAULT) — and its exit is
    # recorded first. No inject.* event: the verdict must come from the evidence alone.
    rd = RunDir.create(tmp_path, "k")
    _steps(rd, [0, 1], 8)
    with EventWriter(rd.event_file("node-a", 0, 0, 1000), run="k", node="node-a", rank=0) as w:
        w.emit("worker.fault", "peer closed the connection", level="error",
               data={"class": "peer_closed", "error": "RuntimeError: Connection closed by peer [127.0.0.1]:4242"})
    with EventWriter(rd.launcher_file("node-a"), run="k", node="node-a") as w:
        w.emit("worker.failed", "rank 0 exited with code 10", level="error",
               data={"exit_code": 10, "signal": None, "pid": 1000, "local_rank": 0, "global_rank": 0, "attempt": 0})
        w.emit("worker.failed", "rank 1 killed by SIGKILL", level="error",
               data={"exit_code": -9, "signal": "SIGKILL", "pid": 1001, "local_rank": 1, "global_rank": 1,
                     "attempt": 0})
    v = triage([rd.path])
    assert (v.cls, v.culprit["rank"], v.action) == ("launcher", 1, "restart_from_checkpoint"), (
        f"expected launcher/rank 1 (the SIGKILLed rank), got {v.cls}/rank {v.culprit['rank']}: {v.reason}")
    assert "rank 0" not in (v.first_anomaly.text if v.first_anomaly else ""), v.first_anomaly


def test_the_rank_a_guard_event_names_is_the_culprit_not_the_rank_that_wrote_it(tmp_path: Path) -> None:
    # guard events are written by rank 0 for the whole job; this one names rank 1 (no injector event)
    rd = RunDir.create(tmp_path, "g")
    _steps(rd, [0, 1], 20)
    with EventWriter(rd.event_file("node-a", 0, 0, 1000), run="g", node="node-a", rank=0) as w:
        w.emit("guard.nonfinite", "non-finite gradients on rank 1", level="warning", step=21,
               data={"step": 21, "reason": "nonfinite", "ranks": [1], "nodes": ["node-b"], "origin": "local",
                     "culprits": [{"rank": 1, "node": "node-b", "params": ["w"], "values": ["nan"]}]})
    v = triage([rd.path])
    assert (v.cls, v.culprit["rank"], v.culprit["node"]) == ("numerical", 1, "node-b"), (
        f"expected numerical on rank 1 / node-b (named by the guard), got {v.cls} {v.culprit}: {v.reason}")


def test_a_guard_event_that_names_no_single_rank_blames_none(tmp_path: Path) -> None:
    rd = RunDir.create(tmp_path, "g2")
    _steps(rd, [0, 1], 5)
    with EventWriter(rd.event_file("node-a", 0, 0, 1000), run="g2", node="node-a", rank=0) as w:
        w.emit("guard.nonfinite", "non-finite in the reduction", level="warning", step=6,
               data={"step": 6, "reason": "nonfinite", "ranks": [0, 1], "origin": "collective", "culprits": []})
    v = triage([rd.path])
    assert v.cls == "numerical" and v.culprit["rank"] is None, (v.cls, v.culprit)


def test_a_real_drill_without_its_injection_event_still_names_the_killed_rank(tmp_path: Path) -> None:
    rd = tmp_path / "drill1"
    shutil.copytree(CORPUS / "real_drill_kill" / "logs" / "drill1", rd)
    (rd / "events" / "chaos.vm.jsonl").unlink()  # the injector's ground truth is gone
    v = triage([rd]).to_dict()
    assert v["outcome"] == "succeeded", v["reason"]
    assert len(v["incidents"]) == 1, v["incidents"]
    inc = v["incidents"][0]
    assert (inc["class"], inc["culprit"]["rank"], inc["action"]) == ("launcher", 1, "restart_from_checkpoint"), inc
    assert not inc["first_anomaly"]["rule"].startswith("event:inject"), inc["first_anomaly"]


def test_a_failed_run_keeps_its_failure_verdict_and_exit_4(tmp_path: Path) -> None:
    rd = tmp_path / "drill1"
    shutil.copytree(CORPUS / "real_drill_kill" / "logs" / "drill1", rd)
    rj = json.loads((rd / "run.json").read_text())
    rj.update(exit_code=1, exit_name="JOB_FAILED")
    (rd / "run.json").write_text(json.dumps(rj))
    code, out = _cli(tmp_path, str(rd), "--no-save")
    assert code == ExitCode.DIAGNOSED and "launcher" in out and "rank 1" in out, out


def test_a_succeeded_run_exits_0_and_names_the_costliest_incident(tmp_path: Path) -> None:
    rd = tmp_path / "drill1"
    shutil.copytree(CORPUS / "real_drill_kill" / "logs" / "drill1", rd)
    code, out = _cli(tmp_path, str(rd))
    assert code == ExitCode.SUCCEEDED, (code, out)
    assert "run succeeded" in out and "costliest" in out and "launcher" in out, out
    saved = json.loads((rd / "report" / "triage.json").read_text())
    assert saved["outcome"] == "succeeded" and saved["incidents"][0]["culprit"]["rank"] == 1, saved
    assert "Run succeeded" in (rd / "report" / "triage.md").read_text()


def test_raw_logs_of_a_finished_job_keep_no_diagnosis_and_exit_5(tmp_path: Path) -> None:
    logs = tmp_path / "raw"
    logs.mkdir()
    for r in range(2):
        src = CORPUS / "syn_healthy_run_no_failure" / "logs" / "run1" / f"rank{r}.log"
        shutil.copy(src, logs / src.name)
    code, out = _cli(tmp_path, str(logs))
    assert code == ExitCode.UNDIAGNOSED, (code, out)
    assert "finishing normally" in out, out
