"""`titan run` refuses what it cannot authenticate: one line + hint, exit 2, nothing written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from titan.cli.environment import Environment
from titan.cli.main import run as cli_run
from titan.exitcodes import ExitCode
from titan.launch.secure import INSECURE_RISK
from titan.settings.env import TITAN_RDZV_SECRET, TITAN_RDZV_SECRET_FILE

pytestmark = pytest.mark.timeout(60)
MULTI = ["run", "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29999", "--run-id", "x"]


def _run(tmp_path: Path, argv: list[str], **env: str) -> tuple[int, str]:
    e = {k: v for k, v in os.environ.items() if k not in (TITAN_RDZV_SECRET, TITAN_RDZV_SECRET_FILE)}
    e.update(env)
    (tmp_path / "ok.py").write_text("print('hi')\n")
    cap = Environment.captured(tmp_path, env=e)
    code = cli_run(argv, cap)
    return code, cap.stderr.getvalue()


CASES = {
    "multi-node, no secret": (MULTI + ["--", "ok.py"], {}, "needs a rendezvous secret"),
    "secret file missing": (MULTI + ["--rdzv-secret-file", "nope", "--", "ok.py"], {}, "does not exist"),
    "secret too short": (MULTI + ["--", "ok.py"], {TITAN_RDZV_SECRET: "short"}, "at least 16"),
    "secret file is a device": (MULTI + ["--", "ok.py"], {TITAN_RDZV_SECRET_FILE: "/dev/zero"}, "not a regular file"),
    "etcd v1": (["run", "--rdzv-backend", "etcd", "--rdzv-endpoint", "127.0.0.1:2379", "--", "ok.py"], {},
                "cannot be authenticated"),
    "static multi-node": (["run", "--rdzv-backend", "static", *MULTI[1:], "--", "ok.py"], {TITAN_RDZV_SECRET: "s" * 20},
                          "single-node only"),
    "local-addr not here": (["run", "--local-addr", "198.51.100.7", "--", "ok.py"], {}, "not an address of this host"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_refusal_is_one_line_with_a_hint_and_writes_nothing(tmp_path, name):
    argv, env, want = CASES[name]
    code, err = _run(tmp_path, argv, **env)
    assert code == ExitCode.USER_ERROR, f"{name}: expected exit 2, got {code}: {err}"
    assert want in err and "hint:" in err and "Traceback" not in err, f"{name}: {err}"
    assert not (tmp_path / "runs").exists(), f"{name}: nothing may be written before the refusal"


def test_insecure_opt_out_says_what_it_risks_in_help():
    from titan.cli.main import build_parser

    text = " ".join(build_parser()._subparsers._group_actions[0].choices["run"].format_help().split())
    assert "--insecure-rdzv" in text and "run code as this user on every node" in text, text
    assert "run code as this user on every node" in INSECURE_RISK
