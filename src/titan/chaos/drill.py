"""The kill drill: SIGKILL a worker after a checkpoint and prove the job recovers exactly.

A preset of the one drill engine (:func:`titan.chaos.drills.run_plan_drill`): the plan is a
single ``kill`` of rank ``kill_rank`` at the start of step ``kill_step + 1`` — the victim has
completed ``lost`` steps past the checkpoint of ``ckpt_step``, which the driver waits to be
on disk; torchrun restarts the group, training resumes from that checkpoint and finishes.

:func:`analyse` reads only the run directory's events (ground truth: the ``inject.kill``
event). Steps lost (RPO), the recovery time (RTO: kill → first kept step after the restart),
wall time, restarts and failures are those of the run's accounting (``titan.sla``), the
numbers ``titan report`` shows; the steps recomputed after the restart are counted from the
new attempt's step events and must equal the steps lost.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any, Callable

from titan.chaos.plan import Plan
from titan.events import RunDir, read_run
from titan.exitcodes import ExitCode

__all__ = ["DrillConfig", "DrillReport", "run_drill", "analyse", "chaos_file", "kill_plan"]

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
    seed: int = 0
    runs_dir: Path = Path("runs")
    run_id: str | None = None
    timeout_s: float = 300.0
    workload_args: tuple[str, ...] = ()

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


def kill_plan(cfg: DrillConfig) -> Plan:
    """The drill's plan: one kill of ``kill_rank`` once it completed ``kill_step``."""
    return Plan(name="kill").kill(rank=cfg.kill_rank, step=cfg.kill_step + 1)


def run_drill(cfg: DrillConfig, *, cwd: Path, env: dict[str, str] | None = None,
              progress: ProgressFn | None = None) -> DrillReport:
    """Run the drill end to end; returns its report (never raises for a failed drill).

    Cost: one ``titan run`` subprocess with ``cfg.nproc`` workers (no reference run),
    bounded by ``cfg.timeout_s``; children are ended by PID on the way out.
    """
    from titan.chaos.drills import PlanDrill, run_plan_drill

    t0 = time.monotonic()
    plan = PlanDrill(plan=kill_plan(cfg), steps=cfg.steps, ckpt_every=cfg.ckpt_every, nproc=cfg.nproc,
                     seed=cfg.seed, runs_dir=cfg.runs_dir, run_id=cfg.run_id, timeout_s=cfg.timeout_s,
                     workload_args=cfg.workload_args, reference=False)
    rep = run_plan_drill(plan, cwd=cwd, env=env, progress=progress)
    codes = [c for c in rep.launcher_exit if c is not None]
    return analyse(RunDir(rep.run_dir), cfg, launcher_exit=codes[-1] if codes else None, problems=rep.problems,
                   wall_s=time.monotonic() - t0)


def analyse(rd: RunDir, cfg: DrillConfig, *, launcher_exit: int | None, problems: list[str] | None = None,
            wall_s: float = 0.0) -> DrillReport:
    """Compute the drill's numbers from the run directory's events alone (``wall_s``, the
    driver's time, is used only when nothing ran)."""
    from titan.sla.accounting import account, corrected_events
    from titan.sla.figures import incident_in_window, run_figures

    problems = list(problems or [])
    evs = corrected_events(read_run(rd))
    acc = account(evs, rd.read_run_json(), run_dir=str(rd.path)) if evs else None
    kills = [e for e in evs if e.kind == "inject.kill"]
    kill = dict(kills[0].data, step=kills[0].step) if kills else None
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
    inc = incident_in_window(acc, t_kill, kinds=("restart", "fatal")) if acc is not None and t_kill else None
    lost = inc.rpo_steps if inc is not None else None
    resumed = [e for e in evs if e.kind == "workload.config" and t_kill is not None and e.t > t_kill]
    resumed_from = int(resumed[0].data.get("start_step", 0)) if resumed else (
        min(e.step for e in after) - 1 if after else None)
    rank0_after = {e.step for e in after if e.rank == 0}
    recomputed = len({s for s in rank0_after if last_before is not None and s <= last_before}) if after else None
    rto = inc.rto_s if inc is not None else None
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
    fig = run_figures(acc) if acc is not None else None
    return DrillReport(
        passed=all(checks.values()) and not problems, run_dir=str(rd.path), steps=final, target_steps=cfg.steps,
        failures=fig.worker_failures if fig else len(failed), restarts=fig.restarts if fig else len(restarts),
        rto_s=rto,
        steps_lost=lost, steps_recomputed=recomputed, kill=kill, resumed_from=resumed_from,
        launcher_exit=launcher_exit, checks=checks, wall_s=fig.wall_s if fig else round(wall_s, 2),
        problems=problems)
