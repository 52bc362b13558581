"""`titan ckpt ls|verify|inspect` on a real run directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from titan.checkpoint import Checkpointer
from titan.cli.environment import Environment
from titan.cli.main import run
from titan.exitcodes import ExitCode

from _ckpt_model import build, context, train_steps

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def run_dir(tmp_path):
    ctx = context(tmp_path / "run", every_steps=2, mode="sync")
    ck = Checkpointer(ctx)
    train_steps(build(), 0, 4, ck)
    ck.close()
    return tmp_path / "run"


def _cli(tmp_path, *argv):
    env = Environment.captured(tmp_path)
    code = run(list(argv), env)
    return code, env.stdout.getvalue(), env.stderr.getvalue()


def test_ls_and_inspect_show_checkpoints_and_keys(tmp_path, run_dir):
    code, out, _ = _cli(tmp_path, "ckpt", "ls", str(run_dir), "--json")
    rows = json.loads(out)
    assert code == ExitCode.SUCCEEDED
    assert [r["step"] for r in rows] == [2, 4] and rows[1]["latest"] and rows[0]["state"] == "committed"
    code, out, _ = _cli(tmp_path, "ckpt", "inspect", str(run_dir), "--json")
    info = json.loads(out)
    keys = {i["key"] for i in info["items"]}
    assert info["manifest"]["step"] == 4 and "sampler.consumed" in keys and "rng.rank0.torch_cpu" in keys


def test_verify_fails_on_a_flipped_byte_and_names_the_file(tmp_path, run_dir):
    assert _cli(tmp_path, "ckpt", "verify", str(run_dir))[0] == ExitCode.SUCCEEDED
    shard = next((run_dir / "checkpoints" / "step-00000004").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    code, out, _ = _cli(tmp_path, "ckpt", "verify", str(run_dir), "--json")
    res = {r["name"]: r for r in json.loads(out)}
    assert code == ExitCode.JOB_FAILED
    assert res["step-00000002"]["ok"] and not res["step-00000004"]["ok"]
    assert shard.name in res["step-00000004"]["problems"][0]


def test_missing_dir_is_one_line_user_error_in_a_real_subprocess(tmp_path):
    titan = Path(sys.executable).with_name("titan")
    r = subprocess.run([str(titan), "ckpt", "ls", str(tmp_path / "nope")], capture_output=True, text=True, timeout=60)
    assert r.returncode == ExitCode.USER_ERROR
    assert r.stderr.startswith("titan: error:") and "hint:" in r.stderr and "Traceback" not in r.stderr
