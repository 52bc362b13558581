"""``titan drill``: plan-driven fault drills (default: the quick plan) with per-fault verdicts;
the foundation kill drill when one of its flags (--kill-rank, --lost-steps, --kill-after-ckpt) is given."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from titan.cli._common import MAX_SECONDS_FLAG, SEED, ident, number, print_json, whole
from titan.cli._drill_plan import add_plan_args, check_drill_args, is_plan_drill, run_plan
from titan.cli.environment import Environment, styled
from titan.exitcodes import ExitCode


#: What this verb can exit with (its --help lists them).
EXIT_CODES = (ExitCode.SUCCEEDED, ExitCode.JOB_FAILED, ExitCode.USER_ERROR, ExitCode.DRILL_FAILED, ExitCode.INTERRUPTED)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "drill", help="inject faults from a plan into a training job; judge detection, recovery, bits",
        usage="titan drill [options] [-- train.py ARGS… | -- -m module ARGS…]",
        description="Run your training script (`-- train.py ARGS`; default: the reference workload "
                    "tinygpt) on local ranks (gloo) under `titan run`, inject the faults of a plan "
                    "(for a script: quick/full placed along its steps, or a file; for tinygpt also "
                    "net/loss1/soak), and judge every fault: detected by which component and how "
                    "fast, attributed to the right rank (and phase), recovered how, steps lost, final "
                    "state bitwise equal to a clean run of the same job (a script is run clean twice: "
                    "only a deterministic one is compared). Exit 8 when any expectation fails. With "
                    "--kill-rank/--lost-steps/--kill-after-ckpt: the kill drill (one SIGKILL after a "
                    "checkpoint). See docs/chaos.md and docs/integrate.md.")
    steps = whole(1, 1_000_000, "a step count")
    p.add_argument("--steps", type=steps, default=None, help="optimizer steps (default: the plan's; kill drill 60)")
    p.add_argument("--ckpt-every", type=steps, default=None,
                   help="checkpoint every K steps (default: the plan's; kill drill 10)")
    p.add_argument("--kill-rank", type=whole(0, 63, "a rank"), default=None,
                   help="foundation kill drill: rank to kill (default 1)")
    p.add_argument("--kill-after-ckpt", type=steps,
                   help="foundation kill drill: checkpoint step after which to kill (a multiple of --ckpt-every; "
                        "default: mid-run)")
    p.add_argument("--lost-steps", type=steps,
                   help="foundation kill drill: steps past that checkpoint before the kill (default K/2)")
    p.add_argument("--nproc-per-node", "--nproc", dest="nproc", type=whole(1, 64, "a rank count"), default=2,
                   metavar="N", help="local ranks, as in torchrun (default 2; --nproc is an alias)")
    p.add_argument("--seed", type=whole(*SEED), default=0,
                   help="seed of the workload (data, init, dropout) and of the soak plan's draws (default 0)")
    p.add_argument("--runs-dir", default="runs", help="where the run directory goes (default ./runs)")
    p.add_argument("--run-id", type=ident("run id"), help="name of the run directory (must not exist yet)")
    p.add_argument("--timeout", type=number(0, MAX_SECONDS_FLAG, above=True, unit="s"), default=300.0, metavar="S",
                   help="give up after S seconds (default 300)")
    p.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    add_plan_args(p)
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="-- train.py ARGS… (or -- -m module ARGS…): drill this script instead of tinygpt")
    return p


def run(args: argparse.Namespace, env: Environment) -> ExitCode:
    from titan.chaos import DrillConfig, run_drill

    check_drill_args(args, env)  # every refusal before anything is read, started or written
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
    with Progress(TextColumn("drill", style="bold", markup=False), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.description}", markup=False),
                  TimeElapsedColumn(), console=env.err_console, transient=True) as bar:
        task = bar.add_task("starting", total=cfg.steps)
        report = run_drill(cfg, cwd=env.cwd, env=dict(env.env),
                           progress=lambda done, total, phase: bar.update(task, completed=done, description=phase))
    _print(env, cfg, report)
    return ExitCode.SUCCEEDED if report.passed else ExitCode.DRILL_FAILED


def _print(env: Environment, cfg, report) -> None:  # noqa: ANN001
    from titan.report.summary import fmt_s  # the report's format for the same figures

    kill = report.kill or {}
    t = Table(title=f"titan drill — {'PASSED' if report.passed else 'FAILED'}", show_header=False, box=None)
    t.add_column("what", style="bold")
    t.add_column("value")
    t.add_row("run dir", report.run_dir)
    t.add_row("kill", f"SIGKILL rank {kill.get('rank')} (pid {kill.get('pid')}) after step {kill.get('step')}"
              if kill.get("pid") else "none")
    t.add_row("restarts / worker exits", f"{report.restarts} group restart(s) / {report.failures} worker "
              "process(es) exited with an error (the killed rank and the peers that lost it)")
    t.add_row("resumed from checkpoint", str(report.resumed_from))
    t.add_row("steps lost / recomputed", f"{report.steps_lost} / {report.steps_recomputed}")
    t.add_row("RTO: kill → first kept step", fmt_s(report.rto_s))
    t.add_row("steps", f"{report.steps} of {report.target_steps}")
    t.add_row("wall time", fmt_s(report.wall_s))
    env.console.print(t)
    checks = Table(show_header=False, box=None)
    for name, ok in report.checks.items():
        checks.add_row(Text("✔", style="green") if ok else Text("✘", style="red"), name)
    env.console.print(checks)
    for p in report.problems:
        env.console.print(styled(("problem:", "red"), f" {p}"))
    if not report.passed:
        env.console.print(f"see {report.run_dir}/console.log and `titan events {report.run_dir}`")
