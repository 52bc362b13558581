"""The one drill engine: run a job under ``titan run`` with a fault plan, inject every fault
for real, then judge each one against a fault-free reference run. The job is the user's own
script (``titan drill -- train.py ARGS``, ``PlanDrill.script``) or the reference workload
tinygpt; faults go in through the library's injection points (the step guard, the
checkpointer, the beacon's phases) and from outside (signals, disk, stress, network).

Flow of :func:`run_plan_drill`:

0. a script with a named plan (``placer``): one clean run first tells how many steps the
   script runs; the plan's faults are placed along them;
1. create the run directory, save the plan to ``chaos/plan.json``, prepare disk faults
   (a small tmpfs or a slow-fsync FUSE mount on ``checkpoints/``) and, with ``nodes=2``, two
   network-namespace "nodes" on a bridge (real c10d rendezvous over veth) — with
   ``node_local`` each node also gets its own mount namespace in which a private folder is
   its ``checkpoints/`` (the run directory, events and gates stay shared with the driver);
2. start the job with ``TITAN_CHAOS_PLAN``: ranks apply in-process kinds themselves and wait
   at the step of each OS-level fault (``chaos.gate``) until the driver has injected it
   (:mod:`titan.chaos.oslevel`, :class:`titan.chaos.netns.Topology`) and touched the go file;
   faults with a duration are healed by timed undos; a preempted job (exit 9) is resubmitted;
3. run the reference alongside (:mod:`titan.chaos.reference`): the same job without faults,
   skipping the updates of the steps the faulty run skipped (``TITAN_CHAOS_SKIP_STEPS``) —
   for a script twice, to know whether it is deterministic; final states compare by the
   digests each rank writes at ``Checkpointer.close()``;
4. :func:`titan.chaos.verdict.judge` turns the events into one verdict per fault.

Every child is ended by PID on the way out; every mount, rule and namespace is removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Callable

from titan.chaos.driver import OSInjector
from titan.chaos.jobs import restarts_for, start_job
from titan.chaos.oslevel import mount_slow_fs, mount_tmpfs
from titan.chaos.plan import Plan
from titan.chaos.progress import DrillPhase
from titan.chaos.jobs import final_state
from titan.chaos.reference import BITS_SETS, CleanRun, References, clean_run, predicted_skips, skip_kinds
from titan.checkpoint.digest import compare_digests, read_digests
from titan.errors import UserError
from titan.chaos.runtime import chaos_dir
from titan.events.tail import EventTail
from titan.chaos.verdict import FaultVerdict, judge, skipped_steps
from titan.events import RunDir, atomic_write_json, read_run
from titan.sla.accounting import account, corrected_events
from titan.sla.figures import run_figures
from titan.events.rundir import new_run_id
from titan.exitcodes import ExitCode

__all__ = ["PlanDrill", "PlanReport", "run_plan_drill", "ProgressFn"]

log = logging.getLogger(__name__)
ProgressFn = Callable[[int, int, str], None]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanDrill:
    """A plan-driven drill (see the module doc)."""

    plan: Plan
    steps: int = 40
    ckpt_every: int = 5
    nproc: int = 2
    nodes: int = 1
    seed: int = 0
    runs_dir: Path = Path("runs")
    run_id: str | None = None
    timeout_s: float = 300.0
    sets: tuple[str, ...] = ()
    workload_args: tuple[str, ...] = ()
    reference: bool = True
    netns_prefix: str = "tcd"  # names and subnet per run: titan.chaos.netns claims a free slot
    #: The user's command (``train.py ARGS`` or ``-m module ARGS``); empty: tinygpt.
    script: tuple[str, ...] = ()
    #: For a named plan on a script: ``placer(steps, world, ckpt_every)`` builds the plan once a clean run
    #: told how many steps the script runs (``plan`` is then ignored).
    placer: Callable[[int, int, int], Plan] | None = None
    #: Run the clean reference twice and compare the final state only when they agree
    #: (default: for a script).
    check_determinism: bool | None = None
    #: each node sees its own folder at ``<run>/checkpoints`` (a mount namespace per node;
    #: the host reads node i's at ``<run>/chaos/node<i>-private``); needs ``nodes > 1``
    node_local: bool = False

    def __post_init__(self) -> None:
        if self.node_local and self.nodes < 2:
            raise ValueError("a node-local drill needs nodes >= 2")


@dataclasses.dataclass
class PlanReport:
    """The drill's outcome: ``passed`` only if every fault met its expectation."""

    passed: bool
    run_dir: str
    plan: str
    nodes: int
    steps: int
    target_steps: int
    failures: int
    restarts: int
    submissions: int
    rto_s: float | None
    steps_recomputed: int
    final_state_equal: bool | None
    reference: str | None
    skipped_steps: list[int]
    launcher_exit: list[int | None]
    wall_s: float
    reference_s: float | None
    faults: list[FaultVerdict]
    #: why the drill did not pass: the driver's problems (an injection that failed, a time-out,
    #: a failed clean-up), then every failed condition (the job's exit, its last step, each
    #: failed fault's reasons, the final model); empty exactly when ``passed``
    problems: list[str] = dataclasses.field(default_factory=list)
    #: the run's headline figures (``titan.sla.figures.run_figures``): the same numbers
    #: ``titan report`` shows for this run directory; ``wall_s``, ``rto_s`` (worst RTO),
    #: ``failures``, ``restarts`` and ``steps_recomputed`` above are taken from them
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the driver's own time: set-up, the job, the reference run, tear-down
    drill_s: float | None = None
    #: the drilled command, and whether two clean runs of it ended bit for bit equal
    command: list[str] = dataclasses.field(default_factory=list)
    deterministic: bool | None = None
    determinism: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["faults"] = [f.to_dict() for f in self.faults]
        return d


def _base_sets(cfg: PlanDrill, rd: RunDir) -> list[str]:
    kinds = {f.kind for f in cfg.plan.faults}
    restarts = restarts_for(cfg)
    sets = [f"watchdog.ledger_path={rd.path / 'ledger.sqlite'}", *BITS_SETS,
            "watchdog.warmup_timeout_s=15", "watchdog.warmup_samples=10", "watchdog.restart_backoff_s=0.2",
            f"watchdog.giveup_restarts={restarts + 3}",
            # Injected faults are not the node's fault: no strike may exclude it mid-drill.
            "watchdog.strike_limit=1000", "guard.strikes_to_report=1000"]
    if "slow" in kinds:  # a short drill's straggler spans ~15 steps, not the default 20-step window x 2
        sets += ["watchdog.straggler_window=8"]
    if "hang" in kinds:  # the hang's evidence is part of the verdict: py-spy --native takes seconds under load
        sets += ["watchdog.py_spy_wait_s=20"]
    return sets + list(cfg.sets)


def _prepare_disk(cfg: PlanDrill, rd: RunDir, undos: list[Callable[[], None]]) -> tuple[Path | None, Path]:
    """Mount what the plan's disk faults need on ``checkpoints/``; returns (the slow-fsync
    control file or None, the folder whose filesystem ENOSPC fills). With both kinds the
    FUSE passthrough sits on top of the small tmpfs, so a full tmpfs fails FUSE writes too."""
    whats = {str(f.get("what")) for f in cfg.plan.faults if f.kind == "disk"}
    fill = rd.checkpoints
    if "slow_fsync" in whats:
        backing = rd.path / "chaos" / "ckpt-backing"
        control = rd.path / "chaos" / "fsync-delay"
        if "enospc" in whats:
            undos.append(mount_tmpfs(backing, "48m"))
            fill = backing
        undos.append(mount_slow_fs(backing, rd.checkpoints, control))
        return control, fill
    if "enospc" in whats:
        undos.append(mount_tmpfs(rd.checkpoints, "48m"))
    return None, fill


def _placed(cfg: PlanDrill, *, cwd: Path, env: dict[str, str], progress: ProgressFn | None,
            problems: list[str]) -> PlanDrill:
    """A script's named plan, placed along the steps one clean run reports."""
    if cfg.placer is None:
        return cfg
    if progress:
        progress(0, 0, "clean run (how many steps?)")
    probe = clean_run(cfg, {}, cwd=cwd, env=env, tag="probe")
    if not probe.last_step:
        raise UserError(f"a clean run of {' '.join(cfg.script)} reported no steps (see {probe.run_dir}/console.log)",
                         "the script must call StepGuard.step each step, or pass a plan file with explicit steps")
    return dataclasses.replace(cfg, plan=cfg.placer(probe.last_step, cfg.nproc, cfg.ckpt_every), steps=probe.last_step)


def run_plan_drill(cfg: PlanDrill, *, cwd: Path, env: dict[str, str] | None = None,
                   progress: ProgressFn | None = None) -> PlanReport:
    """Run the drill end to end and judge it; never raises for a failed drill.

    Cost: one ``titan run`` job (per node with ``nodes=2``, each in its own network
    namespace) plus a reference job when not cached (a script: two, and one more first when
    its plan must be placed), all bounded by ``cfg.timeout_s``. Raises ``TitanError`` only
    when the drill cannot be set up (no root for mounts or namespaces; a script that reports
    no steps).
    """
    t0 = time.monotonic()
    env = dict(env if env is not None else os.environ)
    problems: list[str] = []
    ref_env = {k: v for k, v in env.items() if k != "TITAN_CHAOS_PLAN"}
    cfg = _placed(cfg, cwd=cwd, env=ref_env, progress=progress, problems=problems)
    runs_root = cfg.runs_dir if cfg.runs_dir.is_absolute() else cwd / cfg.runs_dir
    rd = RunDir.create(runs_root, cfg.run_id or new_run_id())
    plan_file = cfg.plan.save(chaos_dir(rd.path) / "plan.json")
    env["TITAN_CHAOS_PLAN"] = str(plan_file)
    undos: list[Callable[[], None]] = []
    # The reference runs alongside, skipping the steps the plan's skip-kind faults name; if
    # the faulty run skipped other steps (a fault lost to a restart), it is run again.
    predicted = predicted_skips(cfg.plan)
    refs = References(cfg, predicted, cwd=cwd, env=ref_env) if cfg.reference else None
    topo = None
    codes: list[int | None] = []
    submissions = 0
    inj: OSInjector | None = None
    log_fh = open(rd.path / "console.log", "ab")
    try:
        control, fill = _prepare_disk(cfg, rd, undos)
        if cfg.nodes > 1:
            from titan.chaos.netns import Topology

            topo = Topology(cfg.netns_prefix, cfg.nodes).create()
        sets = _base_sets(cfg, rd)
        inj = OSInjector(cfg, rd, topo, control, fill, env)
        tail = EventTail(rd)
        phase = DrillPhase()  # what the progress bar says the job is doing
        best = 0
        while True:
            submissions += 1
            job = start_job(cfg, rd, env, topo, sets, cwd, log_fh)
            inj.preempted = False
            while job.running():
                if time.monotonic() - t0 > cfg.timeout_s:
                    problems.append(f"timed out after {cfg.timeout_s:g} s")
                    break
                for ev in tail.poll():
                    phase.feed(ev)
                    if ev.kind == "chaos.gate":
                        inj.on_gate(ev, job)
                    elif ev.kind == "step" and ev.step is not None:
                        best = max(best, ev.step)
                inj.tick()
                if progress:
                    progress(best, cfg.steps, phase.text())
                time.sleep(0.02)
            job.stop()
            codes = job.codes()
            if inj.preempted and any(c == int(ExitCode.PREEMPTED) for c in codes) and submissions < 4 \
                    and time.monotonic() - t0 < cfg.timeout_s:
                continue  # the scheduler gives the job its nodes back: resubmit, it resumes
            break
        problems += inj.problems
    finally:
        if inj is not None:
            inj.heal_all()
        if topo is not None:
            topo.destroy()
            from titan.chaos.jobs import node_memory_dir

            mem = node_memory_dir(rd, 0).parent
            shutil.rmtree(mem, ignore_errors=True)  # every node's snapshots: RAM
            with contextlib.suppress(OSError):
                mem.parent.rmdir()  # the shared root, once no other drill uses it
        for u in reversed(undos):
            try:
                u()
            except Exception as e:  # noqa: BLE001
                problems.append(f"cleanup: {e}")
        log_fh.close()
    evs = corrected_events(read_run(rd))
    skips = skipped_steps(cfg.plan, evs)
    final_equal: bool | None = None
    ref: CleanRun | None = None
    deterministic, determinism = None, None
    if refs is not None:
        if progress:
            progress(best, cfg.steps, "reference run")
        ref, deterministic, determinism = refs.result(skip_kinds(cfg.plan, skips))
        if ref is None or not ref.digests:
            problems.append("the reference run did not finish")
        elif deterministic is not False:
            final_equal, why = compare_digests(read_digests(final_state(rd)), ref.digests)
            if final_equal is None:
                final_equal = False  # the faulty run wrote no final state: it did not end cleanly
    if cfg.script and ref is not None and ref.last_step and not cfg.placer:
        cfg = dataclasses.replace(cfg, steps=ref.last_step)  # a script's length is what its clean run reached
    launcher_ok = bool(codes) and all(c == int(ExitCode.SUCCEEDED) for c in codes)
    # One accounting of the run, as `titan report` does it: the verdicts' RTO and steps lost
    # and the summary figures below come from it.
    acc = account(evs, rd.read_run_json(), run_dir=str(rd.path)) if evs else None
    fig = run_figures(acc).to_dict() if acc is not None else {}
    verdicts = judge(cfg.plan, evs, final_equal=final_equal, launcher_ok=launcher_ok, acc=acc,
                     run_dir=str(rd.path))
    steps = [e for e in evs if e.kind == "step" and e.step is not None]
    final = max((e.step for e in steps), default=0)
    # A drill that fails says why: every failed condition is listed with the driver's problems.
    why = [] if launcher_ok else [f"the job did not succeed: launcher exit codes {codes}"]
    if final != cfg.steps and not (cfg.script and not cfg.steps):  # a script's length may be unknown
        why.append(f"the job reached step {final} of {cfg.steps}")
    why += [f"fault {v.id}: {'; '.join(v.reasons) or ', '.join(k for k, ok in v.checks.items() if not ok)}"
            for v in verdicts if not v.passed]
    if final_equal is False:
        why.append("the final model is not bitwise equal to the reference run's")
    passed = not why and not problems
    problems = [*problems, *why]
    report = PlanReport(
        passed=passed, run_dir=str(rd.path), plan=cfg.plan.name, nodes=cfg.nodes, steps=final, target_steps=cfg.steps,
        failures=fig.get("worker_failures", 0), restarts=fig.get("restarts", 0), submissions=submissions,
        rto_s=fig.get("worst_rto_s"), steps_recomputed=fig.get("steps_recomputed", 0),
        final_state_equal=final_equal, reference=ref.run_dir if ref else None, skipped_steps=skips,
        launcher_exit=codes, wall_s=fig.get("wall_s", 0.0),
        reference_s=round(ref.seconds, 2) if ref is not None else None, faults=verdicts, problems=problems,
        figures=fig, drill_s=round(time.monotonic() - t0, 2), command=list(cfg.script) or ["-m", "titan.workloads.tinygpt"],
        deterministic=deterministic, determinism=determinism)
    atomic_write_json(rd.path / "chaos" / "verdict.json", report.to_dict())
    return report
