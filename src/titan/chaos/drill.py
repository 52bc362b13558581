"""``titan drill``: kill a worker mid-training and prove the job recovers exactly.

Foundation version (one scenario, later plan-driven): launch ``titan run`` with two local
ranks of tinygpt checkpointing every K steps; once rank ``kill_rank`` has completed a step
at least one step past a saved checkpoint, SIGKILL that worker by PID from outside;
torchrun restarts the group, training resumes from the latest checkpoint and finishes.

The drill reads only the run directory's events (ground truth: the ``inject.kill`` event it
writes itself) and computes: steps lost (last completed step before the kill minus the
last saved checkpoint), steps recomputed after the restart (must be equal), restarts,
failures, and the recovery time (kill → first completed step of the new attempt).

Extension point for plan-driven drills: ``DrillConfig`` → ``run_drill`` → ``DrillReport``;
the one injection here is ``_inject_kill``; the analysis is ``analyse``.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from titan.chaos.tail import EventTail
from titan.events import Event, EventWriter, RunDir, default_node_id, read_run
from titan.events.rundir import new_run_id
from titan.exitcodes import ExitCode

__all__ = ["DrillConfig", "DrillReport", "run_drill", "analyse", "chaos_file"]

log = logging.getLogger(__name__)

ProgressFn = Callable[[int, int, str], None]


@dataclasses.dataclass(frozen=True, kw_only=True)
class DrillConfig:
    """One kill-and-recover drill."""

    steps: int = 60
    ckpt_every: int = 10
    kill_rank: int = 1
    #: Kill once the victim completed ``ckpt_step + lost_steps``; ckpt_step defaults to the
    #: checkpoint nearest the middle of the run.
    kill_after_ckpt: int | None = None
    lost_steps: int | None = None
    nproc: int = 2
    max_restarts: int = 3
    seed: int = 0
    threads: int = 1
    runs_dir: Path = Path("runs")
    run_id: str | None = None
    node_id: str | None = None
    timeout_s: float = 300.0
    workload: tuple[str, ...] = ("-m", "titan.workloads.tinygpt")
    workload_args: tuple[str, ...] = ()
    launcher_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        from titan.settings import require

        require(self.ckpt_every >= 2, "the drill needs --ckpt-every >= 2", "so that a step after a checkpoint can be lost")
        require(0 <= self.kill_rank < self.nproc, f"--kill-rank {self.kill_rank} is not a rank of {self.nproc}",
                "use 0 .. nproc-1")
        require(self.steps >= self.kill_step + 1, f"--steps {self.steps} ends before the kill at step {self.kill_step}",
                f"use --steps >= {self.kill_step + 2}")
        require(1 <= self.lost <= self.ckpt_every - 1, "lost steps must be within 1 .. ckpt_every-1",
                "the kill must come after one checkpoint and before the next")

    @property
    def ckpt_step(self) -> int:
        if self.kill_after_ckpt is not None:
            return self.kill_after_ckpt
        return max(self.ckpt_every, (self.steps // 2) // self.ckpt_every * self.ckpt_every)

    @property
    def lost(self) -> int:
        return self.lost_steps if self.lost_steps is not None else max(1, self.ckpt_every // 2)

    @property
    def kill_step(self) -> int:
        return self.ckpt_step + self.lost


@dataclasses.dataclass
class DrillReport:
    """What the drill measured; ``passed`` only if every expectation held."""

    passed: bool
    run_dir: str
    steps: int
    target_steps: int
    failures: int
    restarts: int
    rto_s: float | None
    steps_lost: int | None
    steps_recomputed: int | None
    kill: dict[str, Any] | None
    resumed_from: int | None
    launcher_exit: int | None
    checks: dict[str, bool]
    wall_s: float
    problems: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def chaos_file(rd: RunDir, node: str) -> Path:
    """Where injections are recorded (read by ``titan events`` with the rest)."""
    return rd.events_dir / f"chaos.{node}.jsonl"


def _launcher_cmd(cfg: DrillConfig, run_id: str, rd: RunDir) -> list[str]:
    from titan.settings import SECTIONS

    # Injected faults are not the node's fault: strikes they cause go to a ledger private
    # to this drill's run, never to the machine's node ledger (which would exclude it).
    private = ["--set", f"watchdog.ledger_path={rd.path / 'ledger.sqlite'}"] if "watchdog" in SECTIONS else []
    return [sys.executable, "-m", "titan", "run", "--nproc-per-node", str(cfg.nproc), *private,
            "--max-restarts", str(cfg.max_restarts), "--runs-dir", str(cfg.runs_dir), "--run-id", run_id,
            *(["--node-id", cfg.node_id] if cfg.node_id else []), *cfg.launcher_args, "--",
            *cfg.workload, "--steps", str(cfg.steps), "--ckpt-every", str(cfg.ckpt_every),
            "--seed", str(cfg.seed), "--threads", str(cfg.threads), "--log-every", "0", *cfg.workload_args]


def _stop_tree(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """End the launcher and every worker under it, by PID (SIGKILL of torchrun leaves workers)."""
    import psutil

    if proc.poll() is not None:
        return
    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        kids = []
    proc.send_signal(signal.SIGTERM)  # the agent forwards it to the workers
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    for k in kids:
        try:
            k.kill()
        except psutil.Error:
            pass


def _inject_kill(rd: RunDir, node: str, ev: Event, launcher_pid: int, last_ckpt: int | None) -> dict[str, Any]:
    """SIGKILL the worker that wrote ``ev`` (checked to be a child of our launcher)."""
    import psutil

    pid = ev.pid
    if pid is None:
        raise RuntimeError("step event without pid")
    parent = psutil.Process(pid).ppid()
    if parent != launcher_pid:
        raise RuntimeError(f"pid {pid} is not a worker of launcher {launcher_pid} (parent {parent})")
    with EventWriter(chaos_file(rd, node), run=rd.run_id, node=node) as w:
        t = time.time()
        os.kill(pid, signal.SIGKILL)
        info = {"pid": pid, "rank": ev.rank, "attempt": ev.attempt, "signal": "SIGKILL", "step": ev.step,
                "last_ckpt": last_ckpt, "t_kill": t}
        w.emit("inject.kill", f"SIGKILL rank {ev.rank} pid {pid} after step {ev.step}", level="warning",
               step=ev.step, data=info)
    return info


def run_drill(cfg: DrillConfig, *, cwd: Path, env: dict[str, str] | None = None,
              progress: ProgressFn | None = None) -> DrillReport:
    """Run the drill end to end; returns its report (never raises for a failed drill).

    Cost: one ``titan run`` subprocess with ``cfg.nproc`` workers, bounded by
    ``cfg.timeout_s``; children are ended by PID on the way out.
    """
    t0 = time.monotonic()
    run_id = cfg.run_id or new_run_id()
    node = cfg.node_id or default_node_id()
    runs_root = cfg.runs_dir if cfg.runs_dir.is_absolute() else cwd / cfg.runs_dir
    rd = RunDir.create(runs_root, run_id)
    console = open(rd.path / "console.log", "ab")
    proc = subprocess.Popen(_launcher_cmd(cfg, run_id, rd), cwd=cwd, env=env, stdout=console,
                            stderr=subprocess.STDOUT, start_new_session=True)
    tail = EventTail(rd)
    kill: dict[str, Any] | None = None
    problems: list[str] = []
    saved: set[int] = set()
    best = 0
    try:
        while proc.poll() is None:
            if time.monotonic() - t0 > cfg.timeout_s:
                problems.append(f"timed out after {cfg.timeout_s:g} s")
                break
            for ev in tail.poll():
                if ev.kind == "ckpt.saved" and ev.step is not None:
                    saved.add(int(ev.data.get("step", ev.step)))
                if ev.kind != "step" or ev.step is None:
                    continue
                best = max(best, ev.step)
                if kill is None and ev.rank == cfg.kill_rank and ev.step >= cfg.kill_step and cfg.ckpt_step in saved:
                    try:
                        kill = _inject_kill(rd, node, ev, proc.pid, max(saved))
                    except Exception as e:  # noqa: BLE001 - report, do not crash the drill
                        problems.append(f"kill failed: {e}")
                        kill = {"failed": str(e)}
            if progress:
                progress(best, cfg.steps, "recovering" if kill and best <= (kill.get("step") or 0) else
                         ("training" if kill is None else "resumed"))
            time.sleep(0.02)
    finally:
        _stop_tree(proc)
        console.close()
    report = analyse(rd, cfg, launcher_exit=proc.returncode, problems=problems, wall_s=time.monotonic() - t0)
    if progress:
        progress(report.steps, cfg.steps, "done")
    return report


def analyse(rd: RunDir, cfg: DrillConfig, *, launcher_exit: int | None, problems: list[str] | None = None,
            wall_s: float = 0.0) -> DrillReport:
    """Compute the drill's numbers from the run directory's events alone."""
    problems = list(problems or [])
    evs = read_run(rd).events
    kills = [e for e in evs if e.kind == "inject.kill"]
    kill = kills[0].data if kills else None
    t_kill = kills[0].t if kills else None
    steps = [e for e in evs if e.kind == "step" and e.step is not None]
    failed = [e for e in evs if e.kind == "worker.failed"]
    restarts = [e for e in evs if e.kind == "launcher.restart"]
    before = [e for e in steps if t_kill is not None and (e.attempt or 0) == (kill or {}).get("attempt", 0)]
    after = [e for e in steps if t_kill is not None and (e.attempt or 0) > (kill or {}).get("attempt", 0)]
    last_before = max((e.step for e in before), default=None)
    saved_before = [int(e.data.get("step", e.step or 0)) for e in evs if e.kind == "ckpt.saved"
                    and t_kill is not None and e.t <= t_kill]
    last_ckpt = max(saved_before, default=0) if t_kill is not None else None
    lost = (last_before - last_ckpt) if last_before is not None and last_ckpt is not None else None
    resumed = [e for e in evs if e.kind == "workload.config" and t_kill is not None and e.t > t_kill]
    resumed_from = int(resumed[0].data.get("start_step", 0)) if resumed else (
        min(e.step for e in after) - 1 if after else None)
    rank0_after = {e.step for e in after if e.rank == 0}
    recomputed = len({s for s in rank0_after if last_before is not None and s <= last_before}) if after else None
    rto = (min(e.t for e in after) - t_kill) if after and t_kill is not None else None
    final = max((e.step for e in steps), default=0)
    victim_failed = [e for e in failed if kill and e.data.get("global_rank") == kill.get("rank")
                     and e.data.get("signal") == "SIGKILL"]
    checks = {
        "kill injected": bool(kill) and "failed" not in (kill or {}),
        "failure recorded with SIGKILL": bool(victim_failed),
        "group restarted": len(restarts) >= 1,
        "at least one step lost": (lost or 0) >= 1,
        "resumed from the last checkpoint": resumed_from is not None and resumed_from == last_ckpt,
        "steps recomputed == steps lost": recomputed is not None and recomputed == lost,
        "reached the last step": final == cfg.steps,
        "launcher succeeded": launcher_exit == int(ExitCode.SUCCEEDED),
    }
    return DrillReport(
        passed=all(checks.values()) and not problems, run_dir=str(rd.path), steps=final, target_steps=cfg.steps,
        failures=len(failed), restarts=len(restarts), rto_s=round(rto, 3) if rto is not None else None,
        steps_lost=lost, steps_recomputed=recomputed, kill=kill, resumed_from=resumed_from,
        launcher_exit=launcher_exit, checks=checks, wall_s=round(wall_s, 2), problems=problems)
