"""``titan drill``: plan-driven fault drills (default: the quick plan) with per-fault verdicts;
the foundation kill drill when one of its flags (--kill-rank, --lost-steps, --kill-after-ckpt) is given."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from titan.cli._common import print_json
from titan.cli._drill_plan import add_plan_args, is_plan_drill, run_plan
from titan.cli.environment import Environment
from titan.exitcodes import ExitCode


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "drill", help="inject faults from a plan into a training job; judge detection, recovery, bits",
        description="Train tinygpt on 2 local ranks (gloo) under `titan run`, inject the faults of a "
                    "plan (built-in quick/full/cover/net/loss1/soak or a file), and judge every fault: "
                    "detected by which component and how fast, attributed to the right rank, "
                    "recovered how, steps lost, final model bitwise equal to a reference run. "
                    "Exit 8 when any expectation fails. With --kill-rank/--lost-steps/"
                    "--kill-after-ckpt: the foundation drill (one SIGKILL after a checkpoint). "
                    "See docs/chaos.md.")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default: the plan's; kill drill 60)")
    p.add_argument("--ckpt-every", type=int, default=None,
                   help="checkpoint every K steps (default: the plan's; kill drill 10)")
    p.add_argument("--kill-rank", type=int, default=None, help="foundation kill drill: rank to kill (default 1)")
    p.add_argument("--kill-after-ckpt", type=int, help="checkpoint step after which to kill (default: mid-run)")
    p.add_argument("--lost-steps", type=int, help="steps past that checkpoint before the kill (default K/2)")
    p.add_argument("--nproc", type=int, default=2, help="local ranks (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs-dir", default="runs", help="where the run directory goes (default ./runs)")
    p.add_argument("--run-id", help="name of the run directory")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S", help="give up after S seconds (default 300)")
    p.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    add_plan_args(p)
    return p


def run(args: argparse.Namespace, env: Environment) -> ExitCode:
    from titan.chaos import DrillConfig, run_drill

    if is_plan_drill(args):
        return run_plan(args, env)
    cfg = DrillConfig(steps=args.steps or 60, ckpt_every=args.ckpt_every or 10,
                      kill_rank=1 if args.kill_rank is None else args.kill_rank,
                      kill_after_ckpt=args.kill_after_ckpt, lost_steps=args.lost_steps, nproc=args.nproc,
                      seed=args.seed, runs_dir=Path(args.runs_dir), run_id=args.run_id, timeout_s=args.timeout)
    if args.json:
        report = run_drill(cfg, cwd=env.cwd, env=dict(env.env))
        print_json(env, report.to_dict())
        return ExitCode.SUCCEEDED if report.passed else ExitCode.DRILL_FAILED
    with Progress(TextColumn("[bold]drill[/]"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                  TimeElapsedColumn(), console=env.err_console, transient=True) as bar:
        task = bar.add_task("starting", total=cfg.steps)
        report = run_drill(cfg, cwd=env.cwd, env=dict(env.env),
                           progress=lambda done, total, phase: bar.update(task, completed=done, description=phase))
    _print(env, cfg, report)
    return ExitCode.SUCCEEDED if report.passed else ExitCode.DRILL_FAILED


def _print(env: Environment, cfg, report) -> None:  # noqa: ANN001
    kill = report.kill or {}
    t = Table(title=f"titan drill — {'PASSED' if report.passed else 'FAILED'}", show_header=False, box=None)
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("run dir", report.run_dir)
    t.add_row("kill", f"SIGKILL rank {kill.get('rank')} (pid {kill.get('pid')}) after step {kill.get('step')}"
              if kill.get("pid") else "none")
    t.add_row("failures / restarts", f"{report.failures} / {report.restarts}")
    t.add_row("resumed from checkpoint", str(report.resumed_from))
    t.add_row("steps lost / recomputed", f"{report.steps_lost} / {report.steps_recomputed}")
    t.add_row("kill → first resumed step", f"{report.rto_s:.2f} s" if report.rto_s is not None else "—")
    t.add_row("steps", f"{report.steps} of {report.target_steps}")
    t.add_row("wall time", f"{report.wall_s:.1f} s")
    env.console.print(t)
    checks = Table(show_header=False, box=None)
    for name, ok in report.checks.items():
        checks.add_row("[green]✔[/]" if ok else "[red]✘[/]", name)
    env.console.print(checks)
    for p in report.problems:
        env.console.print(f"[red]problem:[/] {p}")
    if not report.passed:
        env.console.print(f"see {report.run_dir}/console.log and `titan events {report.run_dir}`")
