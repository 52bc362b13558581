"""Units of the launcher: the abort file and the torchrun argv Titan builds."""

from __future__ import annotations

import pytest

from titan.errors import UserError
from titan.events import RunDir
from titan.exitcodes import ExitCode
from titan.launch import Entrypoint, LaunchOptions, read_abort, request_abort
from titan.launch.options import parse_torchrun, rdzv_conf, torchrun_argv
from titan.settings import load_settings


def test_abort_request_round_trip_node_file_wins_over_run_wide(tmp_path):
    rd = RunDir.create(tmp_path, "r")
    assert read_abort(rd, "n0") is None
    request_abort(rd, "everyone stop", exit_code=ExitCode.PREEMPTED)
    req = read_abort(rd, "n0")
    assert req is not None and req.exit_code == ExitCode.PREEMPTED and req.reason == "everyone stop"
    request_abort(rd, "n0 only", node="n0", by="watchdog")
    assert read_abort(rd, "n0").reason == "n0 only" and read_abort(rd, "n1").reason == "everyone stop"


def test_garbled_abort_file_still_stops_the_job_as_gave_up(tmp_path):
    rd = RunDir.create(tmp_path, "r")
    (rd.path / "abort.n0.json").write_text("{not json")
    req = read_abort(rd, "n0")
    assert req is not None and req.exit_code == ExitCode.GAVE_UP


def test_abort_refuses_a_code_that_does_not_mean_stop(tmp_path):
    with pytest.raises(ValueError):
        request_abort(tmp_path, "x", exit_code=ExitCode.SUCCEEDED)


def test_torchrun_argv_carries_the_tuned_rendezvous_and_parses():
    s = load_settings(env={}, cli={"run.max_restarts": 5})
    opts = LaunchOptions(nproc_per_node="2", nnodes="1:2", rdzv_endpoint="h0:29400", run_id="exp", rdzv_conf="is_host=1")
    argv = torchrun_argv(opts, s, Entrypoint("mod.x", ("--steps", "3"), module=True), rdzv_id="exp",
                         event_handler="titan")
    args = parse_torchrun(argv)
    assert args.max_restarts == 5 and args.nnodes == "1:2" and args.rdzv_endpoint == "h0:29400"
    assert args.rdzv_conf == "last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3,join_timeout=600,is_host=1"
    assert args.event_log_handler == "titan" and args.module and args.training_script == "mod.x"
    assert args.training_script_args == ["--steps", "3"]


def test_user_rdzv_conf_overrides_titan_defaults():
    s = load_settings(env={})
    assert "last_call_timeout=10" in rdzv_conf("last_call_timeout=10", s)
    with pytest.raises(UserError):
        rdzv_conf("novalue", s)
