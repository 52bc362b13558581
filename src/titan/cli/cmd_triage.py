"""``titan triage PATH…``: diagnose a failed job from its run directory or raw logs."""

from __future__ import annotations

import argparse

from rich.markup import escape

from titan.cli._common import add_settings_flags, print_json, settings_from_args
from titan.cli.environment import Environment
from titan.events import RunDir, atomic_write_json, atomic_write_text, utc_iso
from titan.exitcodes import ExitCode


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "triage", help="diagnose a failed job: first anomaly, culprit, class, recovery action",
        description="Read a Titan run directory and/or any job's raw logs (torchrun, NCCL, tracebacks, dmesg, "
                    "nvidia-smi -q, Slurm, progress lines), find the earliest anomaly that explains the failure, "
                    "localise it and recommend an action. Exit 4 = diagnosed, 5 = no diagnosis.")
    p.add_argument("paths", nargs="+", metavar="PATH", help="run directory, folder of logs, or log files")
    p.add_argument("--window", type=float, default=None, metavar="SECONDS",
                   help="look at warnings/errors within ±SECONDS of the failure (triage.window_s, default 30)")
    p.add_argument("--skew", type=float, default=None, metavar="SECONDS",
                   help="clock skew tolerated between nodes' raw logs (triage.skew_s, default 2)")
    p.add_argument("--rules", action="append", default=[], metavar="FILE",
                   help="extra rules (TOML, same format as the built-in rules.toml); repeatable")
    p.add_argument("--jobs", type=int, default=None, help="scanner processes for large inputs (triage.jobs; default 1 with grep, else ≤4)")
    p.add_argument("--no-save", action="store_true",
                   help="do not write report/triage.{json,md} into a run directory given as input")
    add_settings_flags(p)  # --config, --set, --json
    return p


def run(args: argparse.Namespace, env: Environment) -> ExitCode:
    from titan.triage import triage
    from titan.triage.render import culprit_text, markdown_section

    cfg = settings_from_args(args, env, extra={"triage.window_s": args.window, "triage.skew_s": args.skew,
                                               "triage.jobs": args.jobs}).triage
    rules = [env.path(r) for r in ([cfg.rules_file] if cfg.rules_file else []) + list(args.rules)]
    verdict = triage([env.path(p) for p in args.paths], window_s=cfg.window_s, skew_s=cfg.skew_s,
                     rule_files=rules, jobs=cfg.jobs or None)
    d = verdict.to_dict()
    runs = verdict.inputs.get("run_dirs") or []
    if len(runs) == 1 and not args.no_save:
        rd = RunDir(runs[0])
        try:
            rd.report.mkdir(parents=True, exist_ok=True)
            atomic_write_json(rd.report / "triage.json", d)
            atomic_write_text(rd.report / "triage.md", markdown_section(verdict))
        except OSError as e:
            env.stderr.write(f"titan: warning: could not save the verdict into {rd.report}: {e}\n")
    if args.json:
        print_json(env, d)
    else:
        _print(env, verdict, culprit_text)
    return ExitCode.DIAGNOSED if verdict.diagnosed else ExitCode.UNDIAGNOSED


def _print(env: Environment, v, culprit_text) -> None:  # type: ignore[no-untyped-def]
    c = env.console
    if not v.diagnosed:
        c.print(f"[bold yellow]no diagnosis[/]: {escape(v.reason)}")
    else:
        c.print(f"[bold red]{v.cls}[/]  →  action [bold]{v.action}[/]   scope {v.scope}   "
                f"culprit {escape(culprit_text(v.culprit))}   confidence {v.confidence:.2f}")
        c.print(f"why: {v.reason}", markup=False)
        if v.first_anomaly:
            f = v.first_anomaly
            c.print(markup=False, *[f"first anomaly: {f.file}:{f.line}"
                    + (f" at {utc_iso(f.t)}" if f.t is not None else " (untimed)")])
            c.print(f"  {f.text[:300]}", markup=False)
    if v.evidence:
        c.print("evidence:", style="bold")
        width = max(len(f"{e.file}:{e.line}") for e in v.evidence)
        for e in v.evidence:
            when = utc_iso(e.t)[11:23] if e.t is not None else "untimed".ljust(12)
            rank = "" if e.rank is None else f"r{e.rank}"
            c.print(f"  {when}  {f'{e.file}:{e.line}':<{width}}  {rank:>5}  {e.rule:<22}  {e.text[:160]}",
                    markup=False, highlight=False)
    inp = v.inputs
    c.print(f"read {inp.get('files', 0)} files ({inp.get('bytes', 0)} bytes, {inp.get('lines', 0)} lines)"
            + (f" and {len(inp['run_dirs'])} run directory" if inp.get("run_dirs") else ""))
    for p in v.problems[:10]:
        env.err_console.print(f"note: {p}", markup=False, style="yellow")
    if len(v.problems) > 10:
        env.err_console.print(f"[yellow]note: {len(v.problems) - 10} more[/]")
