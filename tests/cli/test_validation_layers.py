"""The checks behind the bad-input table, at the layer that owns them (the library, not the
verbs): settings sections, the timeout hierarchy, `titan plan`'s model, fault plans, gather,
bounded reads of user files, hosts and endpoints, launcher options."""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
from pathlib import Path

import pytest

from titan.errors import UserError
from titan.settings import SECTIONS, load_settings, settings_from_json
from titan.settings.core import _hints, _unwrap_optional

pytestmark = pytest.mark.timeout(60)


def _numeric_fields() -> list[tuple[str, str, type]]:
    out = []
    for section, cls in SECTIONS.items():
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            base, _ = _unwrap_optional(hints[f.name])
            if base in (int, float):
                out.append((section, f.name, base))
    return out


NUMERIC = _numeric_fields()


@pytest.mark.parametrize("section, name, tp", NUMERIC, ids=[f"{s}.{n}" for s, n, _ in NUMERIC])
def test_every_numeric_setting_refuses_absurd_values_with_a_range(section: str, name: str, tp: type) -> None:
    bad = ["nan", "inf", "-inf", "1e15"] if tp is float else ["1000000000000000"]
    for value in bad:
        with pytest.raises(UserError) as e:
            load_settings(env={}, cli={f"{section}.{name}": value})
        assert "…" in e.value.hint or "within" in e.value.message, \
            f"{section}.{name}={value}: the hint must give the range, saw {e.value.message!r} / {e.value.hint!r}"


def test_defaults_pass_the_number_checks() -> None:
    load_settings(env={})


def test_warmup_and_idle_set_above_the_collective_timeout_are_refused() -> None:
    for name in ("warmup_timeout_s", "idle_timeout_s"):
        with pytest.raises(UserError, match=rf"watchdog.{name} \(1000\) must be < dist.pg_timeout_s \(300\)"):
            load_settings(env={}, cli={f"watchdog.{name}": 1000})


def test_defaults_adapt_to_a_low_collective_timeout_and_the_hand_over_to_workers_stays_valid() -> None:
    # warm-up 60 s by default, pg 50 s: the default is capped by the ceiling, not refused.
    s = load_settings(env={}, cli={"dist.pg_timeout_s": 50})
    assert s.watchdog.warmup_timeout_s == 60 and s.watchdog.ceiling_s == 20
    assert settings_from_json(s.to_json()).dist.pg_timeout_s == 50


def test_a_heartbeat_longer_than_the_join_timeout_is_refused() -> None:
    with pytest.raises(UserError, match=r"heartbeat .* must be < rdzv_join_timeout_s"):
        load_settings(env={}, cli={"run.rdzv_keep_alive_interval_s": 1_000_000})
    with pytest.raises(UserError, match="heartbeat"):
        load_settings(env={}, cli={"run.rdzv_keep_alive_max_attempt": 700})
    load_settings(env={}, cli={"run.rdzv_keep_alive_interval_s": 5, "run.rdzv_keep_alive_max_attempt": 10})


@pytest.mark.parametrize("bad", ["node\n", "a/b", "..", "", "-x", "n\x1b[2J", "x" * 129])
def test_ids_that_name_files_are_plain(bad: str) -> None:
    from titan.inputs import check_id

    with pytest.raises(UserError, match="invalid node id"):
        check_id(bad, "node id")


def test_a_node_id_from_the_environment_is_checked_before_it_names_files() -> None:
    with pytest.raises(UserError, match="invalid node id"):
        load_settings(env={"TITAN_NODE_ID": "../etc"})


def test_plan_model_refuses_out_of_range_inputs_and_never_overflows() -> None:
    from titan.sla.plan import LIMITS, PlanInput, goodput_exact, plan

    with pytest.raises(UserError, match="--gpus must be within"):
        PlanInput(gpus=10**12, rate_per_gpu_hour=1e-5, ckpt_stall_s=10, restart_s=300)
    with pytest.raises(UserError, match="restart cost"):
        PlanInput(gpus=8, rate_per_gpu_hour=1e-5, ckpt_stall_s=10, restart_s=math.nan)
    with pytest.raises(UserError, match="interruption every"):
        PlanInput(gpus=10_000_000, rate_per_gpu_hour=10.0, ckpt_stall_s=10, restart_s=300)
    # R/M = 86400 (e^86400 overflows a float): the goodput is 0, not an OverflowError.
    assert goodput_exact(1.0, 0.0, 86400.0, 1.0) == 0.0
    inp = PlanInput(gpus=LIMITS["gpus"][1], rate_per_gpu_hour=1e-4, ckpt_stall_s=86400.0, restart_s=86400.0)
    res = plan(inp, simulate=False)
    assert res.goodput == 0.0 and math.isfinite(res.daly_interval_s)


def test_simulation_is_bounded_when_restarts_never_finish() -> None:
    from titan.sla.simulate import simulate_goodput

    done: dict[str, object] = {}
    th = threading.Thread(target=lambda: done.update(r=simulate_goodput(
        interval_s=10.0, ckpt_s=1.0, restart_s=1e6, mtbi=1.0, horizon_s=86400.0, replicas=4)), daemon=True)
    t0 = time.monotonic()
    th.start()
    th.join(30)
    assert "r" in done, f"the simulation did not finish within 30 s (restart 1e6 s, MTBI 1 s)"
    r = done["r"]
    assert r.truncated and r.goodput == 0.0, r  # type: ignore[attr-defined]
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("kw, match", [
    ({"kind": "kill", "step": True, "rank": 0}, "step must be a whole number"),
    ({"kind": "kill", "step": 5, "rank": -1}, "rank must be a whole number >= 0"),
    ({"kind": "kill", "step": 5, "rank": 0, "params": {"signal": "SIGFOO"}}, "not a signal name"),
    ({"kind": "kill", "step": 5, "rank": 0, "params": {"signal": "SIG_IGN"}}, "not a signal name"),
    ({"kind": "spike", "step": 5, "rank": 0, "params": {"factor": "abc"}}, "factor must be a finite number"),
    ({"kind": "spike", "step": 5, "rank": 0, "params": {"factor": math.inf}}, "factor must be a finite number"),
    ({"kind": "slow", "step": 5, "rank": 0, "params": {"steps": 2.5}}, "steps must be a whole number"),
    ({"kind": "net", "step": 5, "params": {"percent": 150.0}}, "percent must be a finite number within 0 … 100"),
    ({"kind": "disk", "step": 5, "params": {"what": "flood"}}, "'flood' is not one of"),
    ({"kind": "nan_grad", "step": 5, "rank": 0, "params": {"value": "lots"}}, "is not a number"),
    ({"kind": "kill", "step": 5, "node": "a/b"}, "invalid node id"),
])
def test_fault_specs_are_checked_by_type_choice_and_range(kw: dict, match: str) -> None:
    from titan.chaos.plan import FaultSpec

    with pytest.raises(UserError, match=match):
        FaultSpec(**kw)


def test_every_builtin_plan_passes_the_checks() -> None:
    from titan.chaos.builtin_plans import BUILTIN, soak_plan

    for name, make in BUILTIN.items():
        plan, steps, every = make()
        assert plan.faults, name
    assert soak_plan(120, 20)[0].faults


def _tree(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def test_gather_never_writes_into_a_source(tmp_path: Path) -> None:
    from titan.events import RunDir
    from titan.tracing.gather import gather

    src = RunDir.create(tmp_path, "job").path
    (src / "events" / "n0.rank0.attempt0.1.jsonl").write_text('{"v": 1}\n')
    before = _tree(tmp_path)
    for out in (src / "merged", src / "events" / "deep" / "merged", src):
        with pytest.raises(UserError):
            gather(out, [str(src)])
    assert _tree(tmp_path) == before, "a refused gather wrote something"


def test_gather_refuses_hosts_that_are_not_hosts(tmp_path: Path) -> None:
    from titan.tracing.gather import gather

    for source in ("a;b:/x", "a/b:/x", "$(id):/x", "`id`:/x", "-oProxyCommand=x:/y", "h:"):
        with pytest.raises(UserError):
            gather(tmp_path / "out", [source], fetch_command="true")
    assert not (tmp_path / "out").exists()


def test_reading_a_fifo_or_device_the_user_named_never_blocks(tmp_path: Path) -> None:
    from titan.inputs import read_text_file

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, match in ((fifo, "not a regular file"), (Path("/dev/zero"), "not a regular file"),
                        (tmp_path, "is a directory")):
        with pytest.raises(UserError, match=match):
            read_text_file(path, "settings file", "hint")
    big = tmp_path / "big"
    big.write_bytes(b"x" * 2048)
    with pytest.raises(UserError, match="at most 1,024"):
        read_text_file(big, "plan", "hint", max_bytes=1024)


@pytest.mark.parametrize("text, ok", [
    ("node0:29400", True), ("[fd00::1]:29400", True), ("10.0.0.5", True), ("node-1.cluster.local:1", True),
    ("garbage:::", False), ("h:0", False), ("h:65536", False), ("a;b:1", False), ("a/b:1", False), ("-x:1", False),
    ("999.1.1.1:1", False), (":29400", False), ("h:port", False),
])
def test_endpoints(text: str, ok: bool) -> None:
    from titan.inputs import check_host_port

    if ok:
        assert check_host_port(text) == text
    else:
        with pytest.raises(UserError):
            check_host_port(text)


def test_launch_options_bound_the_job_shape() -> None:
    from titan.launch.options import MAX_NPROC_PER_NODE, LaunchOptions

    LaunchOptions(nproc_per_node=str(MAX_NPROC_PER_NODE)).validate()
    for kw in ({"nproc_per_node": str(MAX_NPROC_PER_NODE + 1)}, {"nproc_per_node": "1000000000000"},
               {"nnodes": "1:1000000", "rdzv_endpoint": "h:1", "run_id": "r"},
               {"rdzv_endpoint": "garbage:::"}, {"rdzv_id": "../x"}, {"local_addr": "a b"},
               {"rdzv_conf": "join_timeout=1e9"}, {"rdzv_conf": "nonsense=1"}):
        with pytest.raises(UserError):
            LaunchOptions(**kw).validate()
