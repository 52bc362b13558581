"""Secure by default: what the worker context, the guard and init_distributed give a script
with no further call — the fault boundary's exit codes, the injected marker, the backend the
script asked for, a hand-set learning rate under the guard's escalation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from titan.events import RunDir, read_run
from titan.exitcodes import ExitCode
from titan.settings import load_settings
from titan.worker import WorkerContext
from titan.worker.dist import choose_backend
from titan.worker.errors import record_fault


def _worker_env(rd: RunDir) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TITAN_")}
    env.update({"TITAN_RUN_DIR": str(rd.path), "TITAN_NODE_ID": "n0", "RANK": "0", "LOCAL_RANK": "0",
                "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "TORCHELASTIC_RESTART_COUNT": "0"})
    return env


@pytest.mark.parametrize("error, code, cls", [
    ('RuntimeError("[pair.cc:534] Connection closed by peer [127.0.0.1]:5")', ExitCode.WORKER_COMM_FAULT, "peer_closed"),
    ('RuntimeError("CUDA error: an illegal memory access was encountered")', ExitCode.WORKER_CUDA_FAULT, "cuda_sticky"),
    ('ValueError("bad shape")', ExitCode.JOB_FAILED, "other"),
])
def test_an_uncaught_exception_under_titan_run_exits_with_its_class_code(tmp_path, error, code, cls):
    """A script that only creates the context (as under `titan run`) gets the fault boundary."""
    rd = RunDir.create(tmp_path / "runs", "r")
    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent(f"""
        import titan
        ctx = titan.WorkerContext.from_env()
        ctx.step = 7
        raise {error}
    """))
    p = subprocess.run([sys.executable, str(script)], env=_worker_env(rd), capture_output=True, text=True, timeout=120)
    assert p.returncode == int(code), f"expected exit {int(code)} ({code.name}), saw {p.returncode}:\n{p.stderr[-2000:]}"
    assert "Traceback" in p.stderr, "the usual traceback must still be printed"
    evs = read_run(rd).events
    (fault,) = [e for e in evs if e.kind == "worker.fault"]
    assert fault.data["class"] == cls and fault.step == 7, fault
    (started,) = [e for e in evs if e.kind == "worker.started"]
    assert started.data["wired"] and started.data["beacon"] and started.data["fault_boundary"], started.data
    assert (rd.path / "beacons" / "n0.local0.bcn").exists(), "the context wired no beacon"


def test_without_titan_run_the_context_wires_nothing(tmp_path):
    ctx = WorkerContext.from_env(load_settings(env={}), run_dir=tmp_path, env={"RANK": "0"})
    assert not ctx.wired and ctx.beacon is None and getattr(sys.excepthook, "titan_ctx", None) is not ctx


def test_the_worker_fault_of_an_injected_exception_is_marked(tmp_path):
    ctx = WorkerContext.from_env(load_settings(env={}), run_dir=tmp_path, env={"RANK": "0"})
    exc = RuntimeError("CUDA error: the launch timed out and was terminated (injected by titan.chaos)")
    exc.titan_injected = True
    record_fault(ctx, exc, step=3)
    record_fault(ctx, RuntimeError("CUDA error: the launch timed out"), step=4)
    ctx.events.close()
    faults = [e for e in read_run(tmp_path).events if e.kind == "worker.fault"]
    assert [(e.step, e.injected) for e in faults] == [(3, True), (4, False)], [(e.step, e.data) for e in faults]


def test_init_distributed_keeps_the_scripts_backend_unless_a_setting_says_otherwise(tmp_path):
    auto = WorkerContext.from_env(load_settings(env={}), run_dir=tmp_path / "a", env={"RANK": "0"})
    assert choose_backend(auto, "gloo") == "gloo"
    pinned = WorkerContext.from_env(load_settings(env={}, cli={"dist.backend": "gloo"}), run_dir=tmp_path / "b",
                                    env={"RANK": "0"})
    assert choose_backend(pinned, "nccl") == "gloo", "an explicit dist.backend setting wins"
    pinned.events.close()
    (ev,) = [e for e in read_run(tmp_path / "b").events if e.kind == "dist.backend_override"]
    assert ev.data == {"script": "nccl", "setting": "gloo"}, ev.data


def test_a_hand_set_learning_rate_is_lowered_by_the_guards_escalation():
    """The loop sets lr = 0.1 before every step; after a lower_lr rung the update uses 0.05."""
    from titan.guard import StepGuard
    from titan.guard.actions import lower_lr

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = StepGuard(model, opt, step_events=False)
    x = torch.ones(2, 4)

    def one_step() -> float:
        for g in opt.param_groups:
            g["lr"] = 0.1  # the loop's own schedule
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        grad = model.weight.grad.clone()
        before = model.weight.detach().clone()
        guard.step(loss)
        return float(((before - model.weight.detach()) / grad).mean())

    assert one_step() == pytest.approx(0.1)
    lower_lr(guard)  # the escalation's rung
    assert one_step() == pytest.approx(0.05), "the lowered rate was lost to the loop's hand-set rate"
    assert opt.param_groups[0]["lr"] == 0.1, "the loop's own value is put back after the update"
    assert guard.state_dict()["lr_scale"] == 0.5


def test_guard_step_with_the_loss_skips_a_nonfinite_step_and_keeps_the_loop_shape():
    from titan.guard import StepGuard

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = StepGuard(model, opt, step_events=False)
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.tensor([[1.0, float("nan"), 0.0, 0.0]])).sum()
    loss.backward()
    res = guard.step(loss)
    assert res.skipped and res.reason == "nonfinite", res
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())), "a skipped step changed the model"
    loss = model(torch.ones(1, 4)).sum()
    loss.backward()
    assert not guard.step(loss).skipped and guard.step_count == 2


def test_the_capability_judgement_names_what_is_off_and_why(tmp_path):
    from titan.beacon import Beacon, scan_beacons
    from titan.events import EventWriter
    from titan.launch.capabilities import assess

    off = {c.name: c for c in assess([], [], ranks=[0, 1])}
    assert not off["hang detection"].live and "no beacons from ranks 0–1" in off["hang detection"].why
    assert not off["step guard"].live and not off["checkpoints"].live and not off["fault classification"].live
    for r in (0, 1):
        b = Beacon(tmp_path / "beacons" / f"n0.local{r}.bcn", rank=r, local_rank=r, world=2, node="n0")
        b.step_begin(1)
        for ph in ("forward", "backward", "comm", "optimizer"):
            b.set_phase(ph)
        b.step_end(1)
    w = EventWriter(tmp_path / "e.jsonl", run="r", node="n0")
    for r in (0, 1):
        w.set_context(rank=r)
        w.emit("worker.started", data={"wired": True, "fault_boundary": True})
        w.emit("guard.armed", data={"mode": "ddp", "enabled": True})
        w.emit("ckpt.armed", data={"every_steps": 10})
        w.emit("step", step=1, data={})
    w.close()
    from titan.events import read_file

    evs, _ = read_file(tmp_path / "e.jsonl")
    on = {c.name: c for c in assess(evs, scan_beacons(tmp_path / "beacons"), ranks=[0, 1])}
    assert all(c.live for c in on.values()), {k: c.why for k, c in on.items() if not c.live}
    assert "forward, backward, comm, optimizer" in on["hang detection"].why, on["hang detection"].why
    assert json.dumps({k: c.to_dict() for k, c in on.items()})  # what the event carries


def test_a_gradscaler_loop_with_guard_step_of_the_loss_is_bitwise_the_plain_scaler_loop():
    """`scaler.scale(loss).backward(); guard.step(loss)` replaces `scaler.step(opt); scaler.update()`
    (docs/integrate.md): same weights, same scale, step after step."""
    from titan.guard import StepGuard

    def run(with_guard: bool) -> tuple[list[torch.Tensor], float]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=2)
        guard = StepGuard(model, opt, scaler=scaler, step_events=False) if with_guard else None
        g = torch.Generator().manual_seed(1)
        for _ in range(6):
            x = torch.randn(4, 8, generator=g)
            opt.zero_grad()
            loss = model(x).pow(2).mean()
            scaler.scale(loss).backward()
            if guard is not None:
                assert not guard.step(loss).skipped
            else:
                scaler.step(opt)
                scaler.update()
        return [p.detach().clone() for p in model.parameters()], float(scaler.get_scale())

    plain, guarded = run(False), run(True)
    assert guarded[1] == plain[1], f"loss scale {guarded[1]} with the guard, {plain[1]} without"
    assert all(torch.equal(a, b) for a, b in zip(plain[0], guarded[0])), "weights differ from the plain scaler loop"


def test_a_job_that_ended_before_its_first_step_is_not_judged_off(tmp_path):
    """Every checkpoint corrupt, the workers stop at restore: whether the loop marks steps is
    unknown — "hang detection OFF, call StepGuard.step" was wrong advice to a wired script."""
    from titan.beacon import Beacon, scan_beacons
    from titan.events import EventWriter, read_file
    from titan.launch.capabilities import assess

    for r in (0, 1):
        Beacon(tmp_path / "beacons" / f"n0.local{r}.bcn", rank=r, local_rank=r, world=2, node="n0")
    w = EventWriter(tmp_path / "e.jsonl", run="r", node="n0")
    for r in (0, 1):
        w.set_context(rank=r)
        w.emit("worker.started", data={"wired": True, "fault_boundary": True})
        w.emit("guard.armed", data={"mode": "ddp", "enabled": True})
    w.close()
    evs, _ = read_file(tmp_path / "e.jsonl")
    snaps = scan_beacons(tmp_path / "beacons")
    running = {c.name: c for c in assess(evs, snaps, ranks=[0, 1])}
    assert not running["hang detection"].live and running["hang detection"].judged  # still going: say so
    ended = {c.name: c for c in assess(evs, snaps, ranks=[0, 1], ended=True)}
    for name in ("hang detection", "step events"):
        assert not ended[name].judged and "before their first step" in ended[name].why, ended[name]
        assert ended[name].to_dict()["judged"] is False
    assert ended["step guard"].live and ended["step guard"].judged


def test_ranks_starting_again_after_a_restart_keep_hang_detection_on(tmp_path):
    """A report due while a restarted attempt is still in setup (its beacons at step 0): the
    ranks' step events of the attempt before show the beacons stepped — not 'off'."""
    from titan.beacon import Beacon, scan_beacons
    from titan.events import EventWriter, read_file
    from titan.launch.capabilities import assess

    for r in (0, 1):
        Beacon(tmp_path / "beacons" / f"n0.local{r}.bcn", rank=r, local_rank=r, world=2, node="n0")
    w = EventWriter(tmp_path / "e.jsonl", run="r", node="n0")
    for r in (0, 1):
        w.set_context(rank=r)
        w.emit("step", step=2, data={})
    w.close()
    evs, _ = read_file(tmp_path / "e.jsonl")
    assert not {c.name: c for c in assess([], scan_beacons(tmp_path / "beacons"), ranks=[0, 1])}["hang detection"].live
    hang = {c.name: c for c in assess(evs, scan_beacons(tmp_path / "beacons"), ranks=[0, 1])}["hang detection"]
    assert hang.live and "after a restart" in hang.why, hang.why
