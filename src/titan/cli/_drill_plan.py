"""``titan drill --plan …``: the plan-driven drill's flags, run and verdict table."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from titan.cli._common import MAX_SECONDS_FLAG, number, print_json
from titan.cli.environment import Environment, styled
from titan.errors import UserError
from titan.exitcodes import ExitCode

__all__ = ["add_plan_args", "run_plan", "is_plan_drill", "check_drill_args"]

_KILL_FLAGS = ("kill_rank", "lost_steps", "kill_after_ckpt")
_PLAN_FLAGS = {"plan": "--plan", "nodes": "--nodes", "node_local": "--node-local", "job_sets": "--set",
               "duration": "--duration", "every": "--every", "no_reference": "--no-reference"}


def add_plan_args(p: argparse.ArgumentParser) -> None:
    """Flags of the plan-driven drill (added to ``titan drill``)."""
    g = p.add_argument_group("plan-driven drill (the default)")
    g.add_argument("--plan", default=None, metavar="NAME|FILE",
                   help="built-in plan quick (default), full, net, loss1, node-loss, soak — or a TOML/YAML/JSON "
                        "plan file")
    g.add_argument("--nodes", type=int, default=None, choices=(1, 2),
                   help="2: run across two network-namespace nodes (real c10d over veth; needs root; default 1)")
    g.add_argument("--node-local", action="store_true",
                   help="with --nodes 2: each node keeps its checkpoints in its own private folder (a mount "
                        "namespace per node), replicated to its buddy; --nproc then counts ranks per node")
    g.add_argument("--set", dest="job_sets", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="a setting for the drilled job (repeatable), e.g. guard.enabled=false")
    g.add_argument("--duration", type=_duration(MAX_SECONDS_FLAG), default=None, metavar="T",
                   help="soak: how long, with units: 90s, 20m, 2h (default 20m)")
    g.add_argument("--every", type=_duration(86400), default=None, metavar="T",
                   help="soak: about one fault every T, with units (default 2m)")
    g.add_argument("--no-reference", action="store_true", help="skip the reference run (no bitwise verdict)")


def _duration(most_s: float):  # noqa: ANN202
    """argparse type: a duration in seconds, with an optional unit (``90``, ``90s``, ``20m``,
    ``2h``, ``1d``); the number is checked as ``number`` checks any flag's."""
    seconds = number(0, most_s, above=True, unit="s")
    units = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}

    def parse(text: str) -> float:
        t = text.strip()
        for suffix in sorted(units, key=len, reverse=True):
            if t.endswith(suffix) and t[: -len(suffix)].strip():
                head = t[: -len(suffix)].strip()
                number(0, most_s / units[suffix], above=True, unit=suffix)(head)  # its own unit in the message
                return seconds(str(float(head) * units[suffix]))
        return seconds(t)
    parse.__name__ = "duration"
    return parse


def is_plan_drill(args: argparse.Namespace) -> bool:
    """The foundation kill drill runs only when one of its own flags is given."""
    return not any(getattr(args, k, None) is not None for k in _KILL_FLAGS)


def _given(args: argparse.Namespace, key: str) -> bool:
    v = getattr(args, key, None)
    return bool(v) if isinstance(v, (list, bool)) else v is not None


def check_drill_args(args: argparse.Namespace, env: Environment) -> None:
    """Refuse conflicting or impossible drill flags before anything starts (``UserError``).

    Cost: reads the plan file (if any) and resolves the job's ``--set`` settings; writes nothing.
    """
    from titan.inputs import check_id

    if script_of(args, env) is not None:
        _check_script_args(args)
    if not is_plan_drill(args):
        kill = next(f"--{k.replace('_', '-')}" for k in _KILL_FLAGS if getattr(args, k, None) is not None)
        plan_flags = [flag for key, flag in _PLAN_FLAGS.items() if _given(args, key)]
        if plan_flags:
            raise UserError(f"{kill} runs the foundation kill drill, which does not take {plan_flags[0]}",
                            f"drop {plan_flags[0]} (plan drills: --plan NAME|FILE), or drop {kill}")
        every = args.ckpt_every or 10
        if every < 2:
            raise UserError(f"--ckpt-every {every}: the kill drill needs checkpoints at least 2 steps apart",
                            "so that a step after a checkpoint can be lost; e.g. --ckpt-every 10")
        if args.kill_after_ckpt is not None and args.kill_after_ckpt % every:
            raise UserError(f"--kill-after-ckpt {args.kill_after_ckpt} is not a checkpoint step "
                            f"(checkpoints every {every} steps: {every}, {2 * every}, …)",
                            f"give a multiple of --ckpt-every {every} below --steps")
    elif args.node_local and (args.nodes or 1) < 2:
        raise UserError("--node-local needs --nodes 2: one node has nobody to keep its buddy copy",
                        "add --nodes 2")
    elif args.node_local and args.plan == "soak":
        raise UserError("--node-local does not apply to --plan soak", "drop --node-local, or use --plan node-loss")
    elif (args.duration is not None or args.every is not None) and args.plan != "soak":
        flag = "--duration" if args.duration is not None else "--every"
        raise UserError(f"{flag} only applies to --plan soak", f"drop {flag}, or add --plan soak")
    if args.job_sets:
        _check_job_sets(args.job_sets, env)
    runs_root = env.path(args.runs_dir)
    if runs_root.exists() and not runs_root.is_dir():
        raise UserError(f"--runs-dir {args.runs_dir} is not a folder", "choose a folder for the run directories")
    if args.run_id is not None:
        check_id(args.run_id, "run id")
        if (runs_root / args.run_id).exists():
            raise UserError(f"run directory {runs_root / args.run_id} already exists",
                            "a drill never reuses a run: choose a new --run-id, or omit it for a fresh one")


def script_of(args: argparse.Namespace, env: Environment) -> tuple[str, ...] | None:
    """The user's command after ``--`` (script path made absolute), or None for tinygpt.
    ``UserError`` for a missing script or module."""
    cmd = [c for c in (getattr(args, "command", None) or [])]
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        return None
    from titan.launch.options import parse_entrypoint

    e = parse_entrypoint(cmd, env.cwd)
    return ("-m", e.target, *e.args) if e.module else (e.target, *e.args)


def _check_script_args(args: argparse.Namespace) -> None:
    """Flags that do not apply when the drilled job is the user's script."""
    from titan.chaos.builtin_plans import BUILTIN, SCRIPT_PLANS

    if not is_plan_drill(args):
        kill = next(f"--{k.replace('_', '-')}" for k in _KILL_FLAGS if getattr(args, k, None) is not None)
        raise UserError(f"{kill} is the kill drill of the built-in workload, not of a script",
                        "drill a script with --plan quick|full|FILE (a plan FILE may hold one kill)")
    if args.steps is not None:
        raise UserError("--steps does not apply to a script: it runs as many steps as its arguments say",
                        "pass the script's own flags after --, e.g. -- train.py --epochs 4")
    if (args.nodes or 1) > 1:
        raise UserError("--nodes 2 drills the built-in workload only", "drill a script on one node (--nproc-per-node N)")
    name = args.plan or "quick"
    if name in BUILTIN and name not in SCRIPT_PLANS or name == "soak":
        raise UserError(f"the built-in plan {name!r} is made for tinygpt's steps, not a script's",
                        f"for a script: --plan {' | '.join(sorted(SCRIPT_PLANS))} (placed along its steps) or a plan FILE")


def _check_job_sets(items: list[str], env: Environment) -> None:
    from titan.cli._common import parse_sets
    from titan.settings import load_settings

    # The drilled job resolves these against the same environment (its TITAN_* variables).
    load_settings(env={k: v for k, v in env.env.items() if k.startswith("TITAN_")}, cli=parse_sets(items))


def _load(args: argparse.Namespace, env: Environment):  # noqa: ANN202
    from titan.chaos.builtin_plans import BUILTIN, builtin_plan
    from titan.chaos.plan import Plan

    name = args.plan or "quick"
    if name == "soak":
        if args.steps:
            raise UserError("a soak is sized by --duration, not --steps", "drop --steps")
        return None, 0, 5  # laid out by _soak_plan once every argument is checked: it runs a job
    if name in BUILTIN:
        return builtin_plan(name, seed=args.seed)
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
    from titan.chaos.drills import PlanDrill

    script = script_of(args, env)
    if script is not None:
        return _run(args, env, _script_drill(args, env, script))
    plan, steps, every = _load(args, env)
    soak = plan is None
    nodes = args.nodes or 1
    if soak:
        if nodes > 1:
            from titan.chaos.netns import netns_unavailable_reason

            reason = netns_unavailable_reason()
            if reason:
                raise UserError(f"--nodes 2 is not possible here: {reason}", "run as root on Linux with iproute2")
        plan, steps, every = _soak_plan(args, env, nodes)
    steps = args.steps or steps
    every = args.ckpt_every or every
    ranks = args.nproc * nodes
    lost = [f for f in plan.faults if f.kind == "node_loss"]
    if lost and not args.node_local:
        raise UserError(f"plan {plan.name}: node_loss deletes the lost node's folder, and without --node-local "
                        "the checkpoints are shared by every node", "add --nodes 2 --node-local")
    if args.node_local:
        bad_kind = next((f for f in plan.faults if f.kind in ("disk", "preempt")), None)
        if bad_kind is not None:
            raise UserError(f"plan {plan.name}: {bad_kind.kind} faults are not drilled on node-local folders",
                            "drop --node-local for them, or use --plan node-loss")
        bad_node = next((f for f in lost if f.node not in {f"node{i}" for i in range(nodes)}), None)
        if bad_node is not None:
            raise UserError(f"plan {plan.name}: node_loss at step {bad_node.step} names {bad_node.node!r}, "
                            f"but the drill's nodes are {', '.join(f'node{i}' for i in range(nodes))}",
                            "name node1 (node0 hosts the rendezvous)")
    bad = [f for f in plan.faults if f.rank is not None and f.rank >= ranks]
    if bad:
        raise UserError(f"plan {plan.name}: fault {bad[0].kind} at step {bad[0].step} names rank {bad[0].rank}, "
                        f"but the drill has {ranks} rank(s)", f"use ranks 0 … {ranks - 1}, or raise --nproc")
    if max((f.step for f in plan.faults), default=0) > steps:
        raise UserError(f"--steps {steps} ends before the plan's last fault (step "
                        f"{max(f.step for f in plan.faults)})", "raise --steps")
    if nodes > 1:
        from titan.chaos.netns import netns_unavailable_reason

        reason = netns_unavailable_reason()
        if reason:
            raise UserError(f"--nodes 2 is not possible here: {reason}", "run as root on Linux with iproute2")
    net = [f for f in plan.faults if f.kind == "net"]
    if net and nodes < 2:
        raise UserError("the plan has net faults but runs on one node", "add --nodes 2")
    cfg = PlanDrill(plan=plan, steps=steps, ckpt_every=every, nodes=nodes, seed=args.seed,
                    nproc=ranks if args.node_local else args.nproc, node_local=bool(args.node_local),
                    runs_dir=Path(args.runs_dir), run_id=args.run_id,
                    timeout_s=max(args.timeout, 3 * _soak_s(args) + 600) if soak else args.timeout,
                    sets=tuple(args.job_sets), reference=not args.no_reference)
    return _run(args, env, cfg, soak_every=_soak_every(args) if soak else None)


def _script_drill(args: argparse.Namespace, env: Environment, script: tuple[str, ...]):  # noqa: ANN202
    """The drill of a user's script: a placed built-in plan or a plan file."""
    from titan.chaos.builtin_plans import SCRIPT_PLANS, script_placer
    from titan.chaos.drills import PlanDrill
    from titan.chaos.plan import Plan

    name = args.plan or "quick"
    common = dict(ckpt_every=args.ckpt_every or 5, nproc=args.nproc, seed=args.seed, runs_dir=Path(args.runs_dir),
                  run_id=args.run_id, timeout_s=args.timeout, sets=tuple(args.job_sets),
                  reference=not args.no_reference, script=script, steps=0)
    if name in SCRIPT_PLANS:
        return PlanDrill(plan=Plan([], name=name), placer=script_placer(name), **common)
    plan, _, _ = _load(args, env)
    bad = [f for f in plan.faults if f.rank is not None and f.rank >= args.nproc]
    if bad:
        raise UserError(f"plan {plan.name}: fault {bad[0].kind} at step {bad[0].step} names rank {bad[0].rank}, "
                        f"but the drill has {args.nproc} rank(s)", f"use ranks 0 … {args.nproc - 1}")
    if any(f.kind == "net" for f in plan.faults):
        raise UserError("net faults need two namespace nodes, which drill the built-in workload only",
                        "drop the net faults from the plan for a script")
    return PlanDrill(plan=plan, **common)


def _run(args: argparse.Namespace, env: Environment, cfg, *,  # noqa: ANN001 - PlanDrill
         soak_every: float | None = None) -> ExitCode:
    """Run drill ``cfg`` and print its verdict (``soak_every``: a soak's fault spacing, for its summary)."""
    from titan.chaos.drills import run_plan_drill

    plan, steps = cfg.plan, cfg.steps
    if args.json:
        report = run_plan_drill(cfg, cwd=env.cwd, env=dict(env.env))
        out = report.to_dict()
        if soak_every is not None:
            from titan.chaos.soak import soak_summary

            out["soak"] = soak_summary(report, every_s=soak_every)
        print_json(env, out)
    else:
        with Progress(TextColumn(f"drill {plan.name}", style="bold", markup=False), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.description}", markup=False), TimeElapsedColumn(), console=env.err_console,
                      transient=True) as bar:
            task = bar.add_task("starting", total=steps)
            report = run_plan_drill(cfg, cwd=env.cwd, env=dict(env.env),
                                    progress=lambda d, t, ph: bar.update(task, completed=d, total=t or None,
                                                                         description=ph))
        _print(env, report)
        if soak_every is not None:
            _print_soak(env, report, soak_every)
    return ExitCode.SUCCEEDED if report.passed else ExitCode.DRILL_FAILED


def _soak_s(args: argparse.Namespace) -> float:
    return 1200.0 if args.duration is None else float(args.duration)


def _soak_every(args: argparse.Namespace) -> float:
    return 120.0 if args.every is None else float(args.every)


def _soak_plan(args: argparse.Namespace, env: Environment, nodes: int):  # noqa: ANN202
    """Calibrate this machine's step rate, then lay the soak's faults out (titan.chaos.soak)."""
    from titan.chaos.drills import PlanDrill
    from titan.chaos.plan import Plan
    from titan.chaos.soak import calibrate, soak_plan

    if _soak_every(args) > _soak_s(args):
        raise UserError("soak needs 0 < --every <= --duration", "e.g. --duration 20m --every 2m")
    probe = PlanDrill(plan=Plan([]), nproc=args.nproc, seed=args.seed, runs_dir=Path(args.runs_dir))
    rate = calibrate(probe, cwd=env.cwd, env=dict(env.env))
    return soak_plan(_soak_s(args), _soak_every(args), seed=args.seed, steps_per_s=rate, nodes=nodes,
                     ranks=args.nproc * nodes)


def _print_soak(env: Environment, r, every_s: float) -> None:  # noqa: ANN001
    from titan.chaos.soak import soak_summary

    s = soak_summary(r, every_s=every_s)
    lat = s["detection_latency_s"]["all"]
    env.console.print(f"soak: {s['wall_s'] / 60:.1f} min, goodput {s['goodput']:.1%}; faults survived "
                      f"{s['faults_survived']}/{s['faults']}; interruptions {s['interruptions']} "
                      f"({s['interruptions_per_hour']}/h); detection latency median {lat['median']} s, "
                      f"p90 {lat['p90']} s, max {lat['max']} s; nothing lost: {s['lost']['nothing_lost']}",
                      soft_wrap=False)


def _s(x: float | None) -> str:
    return f"{x:.2f}" if x is not None else "—"


def _target(f) -> str:  # noqa: ANN001
    """Whom the plan aims the fault at (a plan, not a measurement)."""
    who = "all ranks" if f.rank is None else f"rank {f.rank}"
    return f"{who} on {f.node}" if f.node else who


def _print(env: Environment, r) -> None:  # noqa: ANN001
    """The verdict table, one line of detail per fault and the summary. Only short columns
    are tabulated (it fits 100 columns); text wraps at word boundaries."""
    from rich import box

    from titan.report.summary import fmt_s  # the report's own format: the same figures print the same

    fig = r.figures or {}
    con = env.console
    t = Table(title=f"titan drill {r.plan} — {'PASSED' if r.passed else 'FAILED'}", title_justify="left",
              box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for name, right in (("", False), ("fault", False), ("target", False), ("step", True), ("detected by", False),
                        ("det. s", True), ("RTO", True), ("lost", True), ("skipped", True), ("bits =", False)):
        t.add_column(name, no_wrap=True, justify="right" if right else "left")
    for f in r.faults:
        mark = Text("✔", style="green") if f.passed else Text("✘", style="red")
        # The named detector (an agent alert by its rule); the component when a verdict has none.
        named = getattr(f, "detector", None)
        detected = ((named.split(" ", 1)[1] if named.startswith("agent.alert ") else named) if named else
                    "; ".join(d.split(" (")[0] for d in f.detected_by.split("; ")) if f.detected_by else
                    Text("not detected", style="dim") if f.injected else Text("not injected", style="red"))
        t.add_row(mark, f.kind + (f" {f.what}" if f.what else ""), _target(f), str(f.step), detected,
                  _s(f.detection_s), fmt_s(f.rto_s), "—" if f.steps_lost is None else str(f.steps_lost),
                  str(f.steps_skipped), {True: "yes", False: "no", None: "—"}[f.final_state_equal])
    con.print(t)
    for f in r.faults:
        what = "; ".join(x for x in (f.recovery, f.impact) if x) or "no recovery seen"
        inc = f"; report incident #{f.incident}" if f.incident is not None else ""
        by = f"detected by {f.detected_by.split(' (')[0]}; " if f.detected_by else ""  # the component
        con.print(f"  {f.kind}{f' {f.what}' if f.what else ''} at step {f.step}: {by}blamed "
                  f"{f.attribution or 'nobody'}; {what}{inc}", soft_wrap=False)
        bad = [k for k, v in f.checks.items() if not v]
        if bad:
            why = "; ".join(getattr(f, "reasons", None) or bad)
            con.print(styled((f"    {f.id} failed:", "red"), f" {why} (expected: {f.expected_text})"),
                      soft_wrap=False)
        if getattr(f, "survive_only", None):
            con.print(f"    survive only (detection not required): {f.survive_only}", soft_wrap=False)
    ref = " and the reference run" if r.reference else ""
    lines = [
        f"job: {r.steps}/{r.target_steps} steps in {fmt_s(r.wall_s)} (the drill took "
        f"{r.drill_s or r.wall_s:.0f} s with set-up{ref})",
        f"{fig.get('interruptions', 0)} interruption(s), each recovered by a group restart: {r.restarts} "
        f"restart(s); {r.failures} worker process(es) exited with an error — the faulty rank and the peers that "
        "lost it, so one kill of a 2-rank group can end 2",
        f"worst RTO {fmt_s(r.rto_s)} (fault → first kept step after recovery); steps lost and recomputed "
        f"{fig.get('steps_lost', 0)}; updates skipped by the guard {fig.get('steps_skipped', 0)}",
        "final model bitwise equal to the reference (skipping steps "
        f"{r.skipped_steps}): {({True: 'yes', False: 'NO', None: 'not checked'})[r.final_state_equal]}",
        "target: whom the plan aims the fault at; det. s: injection → detection; RTO: fault → first kept "
        "step; lost: steps recomputed after a restart; skipped: updates the guard dropped — the numbers "
        "`titan report` shows",
        f"run dir {r.run_dir}; verdict in chaos/verdict.json; `titan report {r.run_dir}` draws the page",
    ]
    for ln in lines:
        con.print(ln, soft_wrap=False)
    if r.determinism:
        con.print(f"determinism of {' '.join(r.command)}: {r.determinism}", soft_wrap=False)
    for p in r.problems:
        con.print(styled(("problem:", "red"), f" {p}"), soft_wrap=False)
