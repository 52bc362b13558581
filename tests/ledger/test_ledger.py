"""Node ledger: strikes per node, exclusion at the limit, window, clear; `titan nodes`."""

from __future__ import annotations

import json
import time

import pytest

from titan.cli.environment import Environment
from titan.cli.main import run as cli
from titan.exitcodes import ExitCode
from titan.ledger import Ledger


def test_a_node_is_excluded_at_its_strike_limit_and_cleared(tmp_path):
    led = Ledger(tmp_path / "l.sqlite", limit=3, window_s=3600)
    assert led.add("n1", "hang", run="r1") == 1
    led.add("n1", "crash")
    led.add("n2", "straggler")
    assert not led.is_excluded("n1")
    assert led.add("n1", "guard") == 3
    assert led.is_excluded("n1") and not led.is_excluded("n2")
    rec = {n.node: n for n in led.nodes()}
    assert rec["n1"].by_kind == {"hang": 1, "crash": 1, "guard": 1} and rec["n1"].excluded
    assert led.clear("n1") == 3 and not led.is_excluded("n1")


def test_old_strikes_leave_the_window(tmp_path):
    led = Ledger(tmp_path / "l.sqlite", limit=2, window_s=60)
    led.add("n1", "hang", t=time.time() - 120)
    led.add("n1", "hang", t=time.time() - 90)
    assert led.count("n1") == 0 and not led.is_excluded("n1")
    led.add("n1", "hang")
    assert led.count("n1") == 1


def test_unknown_kind_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown strike kind"):
        Ledger(tmp_path / "l.sqlite").add("n1", "cosmic-ray")


def test_two_writers_on_one_file_do_not_lose_strikes(tmp_path):
    a, b = Ledger(tmp_path / "l.sqlite"), Ledger(tmp_path / "l.sqlite")
    for _ in range(20):
        a.add("n1", "crash")
        b.add("n2", "crash")
    assert a.count("n1") == 20 and a.count("n2") == 20


def test_titan_nodes_lists_and_clears(tmp_path):
    led_path = tmp_path / "l.sqlite"
    led = Ledger(led_path, limit=3)
    for _ in range(3):
        led.add("bad-node", "hang", run="r")
    env = Environment.captured(tmp_path)
    assert cli(["nodes", "--ledger", str(led_path), "--json"], env) == ExitCode.SUCCEEDED
    obj = json.loads(env.stdout.getvalue())
    assert obj["nodes"][0]["node"] == "bad-node" and obj["nodes"][0]["excluded"] is True, obj
    env = Environment.captured(tmp_path)
    assert cli(["nodes", "--ledger", str(led_path)], env) == ExitCode.SUCCEEDED
    assert "excluded" in env.stdout.getvalue()
    env = Environment.captured(tmp_path)
    assert cli(["nodes", "--ledger", str(led_path), "--clear", "bad-node"], env) == ExitCode.SUCCEEDED
    assert "cleared 3" in env.stdout.getvalue()
    assert not Ledger(led_path).is_excluded("bad-node")


def test_titan_nodes_refuses_an_unknown_kind_with_one_line(tmp_path):
    env = Environment.captured(tmp_path)
    code = cli(["nodes", "--ledger", str(tmp_path / "l.sqlite"), "--add", "n", "bogus"], env)
    err = env.stderr.getvalue().splitlines()
    assert code == ExitCode.USER_ERROR and err[0].startswith("titan: error: unknown strike kind"), err
