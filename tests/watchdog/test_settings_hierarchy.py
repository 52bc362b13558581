"""The timeout hierarchy beacon ceiling < process-group timeout < rendezvous join is enforced."""

from __future__ import annotations

import pytest

from titan.cli.environment import Environment
from titan.cli.main import run as cli
from titan.errors import UserError
from titan.exitcodes import ExitCode
from titan.settings import load_settings


def test_defaults_respect_the_hierarchy():
    s = load_settings(env={})
    assert s.watchdog.ceiling_s < s.dist.pg_timeout_s < s.run.rdzv_join_timeout_s
    assert s.watchdog.checkpoint_budget_s < s.dist.pg_timeout_s


@pytest.mark.parametrize("cli_set, what", [
    ({"watchdog.ceiling_s": 400}, "watchdog.ceiling_s (400) must be < dist.pg_timeout_s (300)"),
    ({"watchdog.checkpoint_budget_s": 300}, "watchdog.checkpoint_budget_s (300) must be < dist.pg_timeout_s"),
    ({"dist.pg_timeout_s": 700}, "dist.pg_timeout_s (700) must be < run.rdzv_join_timeout_s (600)"),
])
def test_a_wrong_ordering_is_refused(cli_set, what):
    with pytest.raises(UserError, match="timeout hierarchy violated") as ei:
        load_settings(env={}, cli=cli_set)
    assert what in ei.value.message and "\n" not in ei.value.message


def test_titan_run_refuses_a_wrong_ordering_with_one_line(tmp_path):
    env = Environment.captured(tmp_path)
    code = cli(["run", "--set", "watchdog.ceiling_s=400", "--", "x.py"], env)
    lines = env.stderr.getvalue().strip().splitlines()
    assert code == ExitCode.USER_ERROR
    assert lines[0].startswith("titan: error: timeout hierarchy violated: watchdog.ceiling_s (400)"), lines
    assert "heartbeat" in lines[0] and lines[1].startswith("hint:") and len(lines) == 2, lines
    assert not (tmp_path / "runs").exists(), "nothing may be started"
