"""CLI behaviour common to every verb: help lists exit codes, user errors are one line."""

from __future__ import annotations

import subprocess
import sys

import pytest

from titan.cli.environment import Environment
from titan.cli.main import run
from titan.events import EventWriter, RunDir
from titan.exitcodes import ExitCode


def _run(tmp_path, *argv):
    env = Environment.captured(tmp_path)
    code = run(list(argv), env)
    return code, env.stdout.getvalue(), env.stderr.getvalue()


def test_help_lists_every_exit_code(tmp_path):
    code, out, _ = _run(tmp_path, "--help")
    assert code == ExitCode.SUCCEEDED
    for c in ExitCode:
        assert f"{int(c):>3}  {c.meaning}" in out, c


def test_unknown_flag_is_one_line_with_hint_and_no_traceback(tmp_path):
    code, out, err = _run(tmp_path, "events", "--bogus", "x")
    assert code == ExitCode.USER_ERROR
    lines = err.strip().splitlines()
    assert lines[0].startswith("titan: error: ") and lines[1].startswith("hint: "), err
    assert "Traceback" not in err


@pytest.mark.parametrize("setup, match", [
    ("missing", "does not exist"),
    ("plain", "not a Titan run directory"),
    ("garbled", "is not valid JSON"),
])
def test_events_on_bad_run_directory(tmp_path, setup, match):
    target = tmp_path / "r"
    if setup == "plain":
        target.mkdir()
    elif setup == "garbled":
        rd = RunDir.create(tmp_path, "r")
        rd.run_json.write_text("{not json")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    code, _, err = _run(tmp_path, "events", str(target))
    assert code == ExitCode.USER_ERROR and match in err and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before, "a failed command must write nothing"


def test_debug_shows_the_traceback(tmp_path):
    code, _, err = _run(tmp_path, "--debug", "events", str(tmp_path / "missing"))
    assert code == ExitCode.USER_ERROR and "Traceback" in err


def test_events_filters_and_json(tmp_path):
    rd = RunDir.create(tmp_path, "r")
    for rank in (0, 1):
        with EventWriter(rd.event_file("n", rank, 0, 10 + rank), run="r", node="n", rank=rank, attempt=0) as w:
            w.emit("step", step=1)
            w.emit("worker.failed", level="error", data={"signal": "SIGKILL"})
    code, out, _ = _run(tmp_path, "events", str(rd.path), "--kind", "worker.failed", "--rank", "1", "--json")
    assert code == ExitCode.SUCCEEDED
    import json

    rows = [json.loads(x) for x in out.splitlines()]
    assert [(r["kind"], r["rank"], r["data"]["signal"]) for r in rows] == [("worker.failed", 1, "SIGKILL")]
    code, out, _ = _run(tmp_path, "events", str(rd.path))
    assert code == ExitCode.SUCCEEDED and "worker.failed" in out and "4 events" in out


@pytest.mark.timeout(60)
def test_console_script_runs_as_a_real_process(tmp_path):
    titan = [sys.executable, "-m", "titan"]
    p = subprocess.run(titan + ["events", str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert p.returncode == ExitCode.USER_ERROR, p
    assert p.stderr.startswith("titan: error:") and "Traceback" not in p.stderr
