"""`titan run --explain-timeouts`: the whole ladder in force, where each value came from and
whether its ordering rule holds — and it starts nothing."""

from __future__ import annotations

import json

from titan.cli.environment import Environment
from titan.cli.main import run as cli_run
from titan.exitcodes import ExitCode


def _ladder(tmp_path, *argv: str, env: dict[str, str] | None = None) -> dict[str, dict]:
    e = Environment.captured(tmp_path, env=env) if env is not None else Environment.captured(tmp_path)
    code = cli_run(["run", "--explain-timeouts", "--json", *argv], e)
    assert code == ExitCode.SUCCEEDED, e.stderr.getvalue()
    rungs = json.loads(e.stdout.getvalue())["timeouts"]
    return {r["name"].split(" (")[0]: r for r in rungs}


def test_each_rung_names_its_source_and_the_derived_ones_follow_the_process_group(tmp_path):
    by = _ladder(tmp_path, "--set", "dist.pg_timeout_s=100", "--rdzv-conf", "last_call_timeout=7",
                 env={"TITAN_WATCHDOG_FLOOR_S": "5", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "90"})
    assert by["dist.pg_timeout_s"]["value_s"] == 100 and by["dist.pg_timeout_s"]["source"] == "flag dist.pg_timeout_s"
    assert by["watchdog.floor_s"]["source"] == "environment TITAN_WATCHDOG_FLOOR_S", by["watchdog.floor_s"]
    assert by["watchdog.ceiling_s"]["value_s"] == 40 and by["watchdog.ceiling_s"]["source"].startswith("derived"), \
        by["watchdog.ceiling_s"]
    assert by["rendezvous last call"]["value_s"] == 7 and by["rendezvous last call"]["source"] == "--rdzv-conf"
    nccl = by["NCCL heartbeat monitor"]
    assert nccl["value_s"] == 90 and nccl["source"].startswith("environment") and nccl["ok"] is False, \
        f"a heartbeat below the process-group timeout breaks its rule: {nccl}"
    assert all(r["ok"] is not False for n, r in by.items() if n != "NCCL heartbeat monitor"), by
    assert not (tmp_path / "runs").exists(), "--explain-timeouts created a run directory"


def test_the_scheduler_grace_is_unknown_outside_a_scheduler_and_said_so(tmp_path):
    by = _ladder(tmp_path, env={})
    g = by["scheduler termination grace"]
    assert g["value_s"] is None and g["ok"] is None and "default 30 s" in g["source"], g
