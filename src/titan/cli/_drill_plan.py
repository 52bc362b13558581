"""``titan drill --plan …``: the plan-driven drill's flags, run and verdict table."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from titan.cli._common import print_json
from titan.cli.environment import Environment
from titan.errors import UserError
from titan.exitcodes import ExitCode

__all__ = ["add_plan_args", "run_plan", "is_plan_drill"]


def add_plan_args(p: argparse.ArgumentParser) -> None:
    """Flags of the plan-driven drill (added to ``titan drill``)."""
    g = p.add_argument_group("plan-driven drill (the default)")
    g.add_argument("--plan", default=None, metavar="NAME|FILE",
                   help="built-in plan quick (default), full, cover, net, loss1, soak — or a TOML/YAML/JSON plan file")
    g.add_argument("--nodes", type=int, default=1, choices=(1, 2),
                   help="2: run across two network-namespace nodes (real c10d over veth; needs root)")
    g.add_argument("--set", dest="job_sets", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="a setting for the drilled job (repeatable), e.g. guard.enabled=false")
    g.add_argument("--duration", type=float, default=120.0, metavar="S", help="soak: how long (default 120 s)")
    g.add_argument("--every", type=float, default=20.0, metavar="S", help="soak: a fault every S s (default 20)")
    g.add_argument("--no-reference", action="store_true", help="skip the reference run (no bitwise verdict)")


def is_plan_drill(args: argparse.Namespace) -> bool:
    """The foundation kill drill runs only when one of its own flags is given."""
    return not any(getattr(args, k, None) is not None for k in ("kill_rank", "lost_steps", "kill_after_ckpt"))


def _load(args: argparse.Namespace, env: Environment):  # noqa: ANN202
    from titan.chaos.builtin_plans import BUILTIN, builtin_plan, soak_plan
    from titan.chaos.plan import Plan

    name = args.plan or "quick"
    if name == "soak":
        return soak_plan(args.duration, args.every, seed=args.seed)
    if name in BUILTIN:
        return builtin_plan(name)
    path = env.path(name)
    if not path.exists():
        raise UserError(f"no built-in plan and no file {name!r}",
                        f"built-in plans: {', '.join(sorted(BUILTIN))}, soak; or a path to a plan file")
    plan = Plan.load(path)
    if not plan.faults:
        raise UserError(f"fault plan {path} has no faults", "add [[faults]] tables (see docs/chaos.md)")
    return plan, max(max(f.step for f in plan.faults) + 10, 20), 5


def run_plan(args: argparse.Namespace, env: Environment) -> ExitCode:
    """Run the plan-driven drill; exit 0 when every fault met its expectation, else 8."""
    from titan.chaos.drills import PlanDrill, run_plan_drill

    plan, steps, every = _load(args, env)
    steps = args.steps or steps
    every = args.ckpt_every or every
    if max((f.step for f in plan.faults), default=0) > steps:
        raise UserError(f"--steps {steps} ends before the plan's last fault (step "
                        f"{max(f.step for f in plan.faults)})", "raise --steps")
    if args.nodes > 1:
        from titan.chaos.netns import netns_unavailable_reason

        reason = netns_unavailable_reason()
        if reason:
            raise UserError(f"--nodes 2 is not possible here: {reason}", "run as root on Linux with iproute2")
    net = [f for f in plan.faults if f.kind == "net"]
    if net and args.nodes < 2:
        raise UserError("the plan has net faults but runs on one node", "add --nodes 2")
    cfg = PlanDrill(plan=plan, steps=steps, ckpt_every=every, nproc=args.nproc, nodes=args.nodes, seed=args.seed,
                    runs_dir=Path(args.runs_dir), run_id=args.run_id, timeout_s=args.timeout,
                    sets=tuple(args.job_sets), reference=not args.no_reference)
    if args.json:
        report = run_plan_drill(cfg, cwd=env.cwd, env=dict(env.env))
        print_json(env, report.to_dict())
    else:
        with Progress(TextColumn(f"[bold]drill {plan.name}[/]"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.description}"), TimeElapsedColumn(), console=env.err_console,
                      transient=True) as bar:
            task = bar.add_task("starting", total=steps)
            report = run_plan_drill(cfg, cwd=env.cwd, env=dict(env.env),
                                    progress=lambda d, t, ph: bar.update(task, completed=d, description=ph))
        _print(env, report)
    return ExitCode.SUCCEEDED if report.passed else ExitCode.DRILL_FAILED


def _s(x: float | None) -> str:
    return f"{x:.2f}" if x is not None else "—"


def _print(env: Environment, r) -> None:  # noqa: ANN001
    t = Table(title=f"titan drill {r.plan} — {'PASSED' if r.passed else 'FAILED'} "
                    f"({r.steps}/{r.target_steps} steps, {r.restarts} restarts, {r.wall_s:.0f} s)")
    for col in ("fault", "rank/node", "step", "expected", "detected by", "det. s", "attributed", "recovery",
                "RTO s", "lost", "bits ="):
        t.add_column(col, overflow="fold")
    for f in r.faults:
        ok = "[green]✔[/]" if f.passed else "[red]✘[/]"
        t.add_row(f"{ok} {f.kind}" + (f" {f.what}" if f.what else ""),
                  f"{'all' if f.rank is None else f.rank}/{f.node or '—'}", str(f.step), f.expected.split(";")[0],
                  "; ".join(d.split(" (")[0] for d in f.detected_by.split("; ")) if f.detected_by else
                  ("[dim]not detected[/]" if f.injected else "[red]not injected[/]"),
                  _s(f.detection_s), f.attribution or "—",
                  "; ".join(x for x in (f.recovery, f.impact) if x) or "—", _s(f.rto_s),
                  "—" if f.steps_lost is None else str(f.steps_lost),
                  {True: "yes", False: "no", None: "—"}[f.final_state_equal])
    env.console.print(t)
    for f in r.faults:
        bad = [k for k, v in f.checks.items() if not v]
        if bad:
            env.console.print(f"[red]{f.id}:[/] failed: {', '.join(bad)}")
    lost = sum(f.steps_lost or 0 for f in r.faults)
    env.console.print(f"steps {r.steps}/{r.target_steps}; worker failures {r.failures}; restarts {r.restarts}; "
                      f"worst fault → first kept step {_s(r.rto_s)} s; steps recomputed {r.steps_recomputed} "
                      f"(lost {lost})")
    env.console.print(f"final model bitwise equal to the reference (skipping steps {r.skipped_steps}): "
                      f"{r.final_state_equal}; run dir {r.run_dir}; verdict in {r.run_dir}/chaos/verdict.json")
    for p in r.problems:
        env.console.print(f"[red]problem:[/] {p}")
