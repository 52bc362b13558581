"""`titan run` / `titan drill` on bad input: one line + hint, USER_ERROR, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from titan.cli.environment import Environment
from titan.cli.main import run as cli_run
from titan.errors import UserError
from titan.exitcodes import ExitCode
from titan.launch.options import parse_torchrun

pytestmark = pytest.mark.timeout(60)
TITAN = Path(sys.executable).with_name("titan")


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    (tmp_path / "ok.py").write_text("print('hi')\n")
    (tmp_path / "bad.toml").write_text("[run\nmax_restarts = = 3\n")
    (tmp_path / "blocker").write_text("a file where the runs folder should go\n")
    return tmp_path


CASES = {
    "missing script": (["run", "--", "nope.py"], "does not exist"),
    "no script": (["run"], "no training script"),
    "missing module": (["run", "--", "-m", "titan_no_such_module_xyz"], "not found"),
    "nproc 0": (["run", "--nproc-per-node", "0", "--", "ok.py"], "--nproc-per-node"),
    "bad nnodes": (["run", "--nnodes", "2:1", "--", "ok.py"], "--nnodes"),
    "multi-node without endpoint": (["run", "--nnodes", "1:2", "--", "ok.py"], "--rdzv-endpoint"),
    "bad backend": (["run", "--rdzv-backend", "zk", "--", "ok.py"], "--rdzv-backend"),
    "bad rdzv-conf": (["run", "--rdzv-conf", "is_host", "--", "ok.py"], "KEY=VALUE"),
    "unknown flag": (["run", "--nprocs", "2", "--", "ok.py"], "unrecognized"),
    "option after --": (["run", "--", "--nproc-per-node", "2"], "launcher option"),
    "bad run id": (["run", "--run-id", "../x", "--", "ok.py"], "invalid run id"),
    "negative restarts": (["run", "--max-restarts", "-1", "--", "ok.py"], "--max-restarts: -1 is out of range"),
    "malformed settings file": (["run", "--config", "bad.toml", "--", "ok.py"], "not valid TOML"),
    "missing settings file": (["run", "--config", "none.toml", "--", "ok.py"], "cannot read settings file"),
    "unwritable runs folder": (["run", "--runs-dir", "blocker/runs", "--", "ok.py"], "cannot create run directory"),
    "drill: kill rank out of range": (["drill", "--kill-rank", "5"], "--kill-rank"),
    "drill: too few steps": (["drill", "--steps", "5"], "--steps"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_user_error_and_writes_nothing(ws: Path, name: str):
    argv, needle = CASES[name]
    before = _tree(ws)
    env = Environment.captured(ws)
    code = cli_run(argv, env)
    err = env.stderr.getvalue()
    assert code == ExitCode.USER_ERROR, f"{name}: expected USER_ERROR, saw {code!r}; stderr:\n{err}"
    lines = err.strip().splitlines()
    assert lines[0].startswith("titan: error: ") and needle in lines[0], f"{name}: stderr was:\n{err}"
    assert len(lines) == 2 and lines[1].startswith("hint: "), f"{name}: expected error + hint, saw:\n{err}"
    assert "Traceback" not in err
    assert _tree(ws) == before, f"{name}: files were written: {_tree(ws) - before}"


def test_torchrun_rejection_becomes_a_user_error():
    with pytest.raises(UserError, match="invalid launcher options"):
        parse_torchrun(["--nproc-per-node"])  # argparse: expected one argument


def test_subprocess_missing_script_prints_one_line(tmp_path: Path):
    p = subprocess.run([str(TITAN), "run", "--", "missing.py"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == ExitCode.USER_ERROR, p
    assert p.stderr.startswith("titan: error: training script 'missing.py' does not exist"), p.stderr
    assert "hint:" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "runs").exists()


def test_subprocess_run_two_ranks_succeeds(tmp_path: Path):
    # One os.write per line: two workers share the pipe, and print() writes text and newline
    # separately (seen interleaved as "rankrank 1 hello\n 0 hello").
    (tmp_path / "hello.py").write_text(
        "import os\nos.write(1, f\"rank {os.environ['RANK']} {os.environ['TITAN_RUN_ID']}\\n\".encode())\n")
    env = {**os.environ, "TITAN_WATCHDOG_LEDGER_PATH": str(tmp_path / "ledger.sqlite")}
    p = subprocess.run([str(TITAN), "run", "--nproc-per-node", "2", "--run-id", "hello", "--", "hello.py"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "rank 0 hello" in p.stdout and "rank 1 hello" in p.stdout, p.stdout
    assert (tmp_path / "runs" / "hello" / "run.json").is_file()
    assert "SUCCEEDED" in p.stderr
