"""``titan triage PATH…``: diagnose a job from its run directory or raw logs."""

from __future__ import annotations

import argparse

from titan.cli._common import add_settings_flags, number, print_json, settings_from_args, whole
from titan.cli.environment import Environment, styled
from titan.events import RunDir, atomic_write_json, atomic_write_text, utc_iso
from titan.exitcodes import ExitCode
from titan.settings.triage import MAX_JOBS

#: What this verb can exit with (its --help lists them).
EXIT_CODES = (ExitCode.SUCCEEDED, ExitCode.USER_ERROR, ExitCode.DIAGNOSED, ExitCode.UNDIAGNOSED)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "triage", help="diagnose a job: first anomaly, culprit, class, recovery action",
        description="Read a Titan run directory and/or any job's raw logs (torchrun, NCCL, tracebacks, dmesg, "
                    "nvidia-smi -q, Slurm, progress lines), find the earliest anomaly that explains the failure, "
                    "localise it and recommend an action. A run directory whose run.json says it succeeded gets a "
                    "summary of the incidents that were handled (exit 0).")
    p.add_argument("paths", nargs="+", metavar="PATH", help="run directory, folder of logs, or log files")
    p.add_argument("--window", type=number(0, 86400, above=True, unit="s"), default=None, metavar="SECONDS",
                   help="look at warnings/errors within ±SECONDS of the failure (triage.window_s, default 30)")
    p.add_argument("--skew", type=number(0, 3600, unit="s"), default=None, metavar="SECONDS",
                   help="clock skew tolerated between nodes' raw logs (triage.skew_s, default 2)")
    p.add_argument("--rules", action="append", default=[], metavar="FILE",
                   help="extra rules (TOML, same format as the built-in rules.toml); repeatable")
    p.add_argument("--jobs", type=whole(1, MAX_JOBS, "a process count"), default=None,
                   help="scanner processes for large inputs (triage.jobs; default 1 with grep, else ≤4)")
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
    if verdict.outcome == "succeeded":  # a run that succeeded: its handled incidents, not a failure verdict
        return ExitCode.SUCCEEDED
    return ExitCode.DIAGNOSED if verdict.diagnosed else ExitCode.UNDIAGNOSED


def _print(env: Environment, v, culprit_text) -> None:  # type: ignore[no-untyped-def]
    c = env.console
    if v.outcome == "succeeded":
        c.print(styled(("run succeeded", "bold green"), f": {v.reason}"))
        for r in v.incidents:
            where = culprit_text(r["culprit"])
            fa = r.get("first_anomaly") or {}
            c.print(f"  #{r['index']} {r['kind']:<7} step {r['step']}  {r['class'] or 'unclassified'} → "
                    f"{r['action'] or '-'}  {where}  cost {r['cost_s']:.1f} s (RTO {r['rto_s'] or 0:.1f} s, "
                    f"{r['rpo_steps']} step(s) lost)" + (f"  [{fa['file']}:{fa['line']}]" if fa else ""))
    elif not v.diagnosed:
        c.print(styled(("no diagnosis", "bold yellow"), f": {v.reason}"))
        for cand in v.candidates:
            c.print(f"  nearest: {cand['rule']} ({cand['class'] or cand['role']}) at {cand['file']}:{cand['line']}: "
                    f"{str(cand['text'])[:140]}")
    else:
        c.print(styled((str(v.cls), "bold red"), "  →  action ", (str(v.action), "bold"),
                       f"   scope {v.scope}   culprit {culprit_text(v.culprit)}   confidence {v.confidence:.2f}"))
        c.print(f"why: {v.reason}")
        if v.first_anomaly:
            f = v.first_anomaly
            c.print(f"first anomaly: {f.file}:{f.line}" + (f" at {utc_iso(f.t)}" if f.t is not None else " (untimed)"))
            c.print(f"  {f.text[:300]}")
        if v.steps:
            c.print("reasoning:", style="bold")
            for st in v.steps:
                c.print(f"  {st[:400]}")
    if v.evidence:
        c.print("evidence (time order):", style="bold")
        width = max(len(f"{e.file}:{e.line}") for e in v.evidence)
        for e in v.evidence:
            when = utc_iso(e.t)[11:23] if e.t is not None else "untimed".ljust(12)
            rank = "" if e.rank is None else f"r{e.rank}"
            c.print(f"  {when}  {f'{e.file}:{e.line}':<{width}}  {rank:>5}  {e.rule:<22}  {e.text[:160]}")
    inp = v.inputs
    c.print(f"read {inp.get('files', 0)} files ({inp.get('bytes', 0)} bytes, {inp.get('lines', 0)} lines)"
            + (f" and {len(inp['run_dirs'])} run directory" if inp.get("run_dirs") else ""))
    for p in v.problems[:10]:
        env.err_console.print(f"note: {p}", style="yellow")
    if len(v.problems) > 10:
        env.err_console.print(f"note: {len(v.problems) - 10} more", style="yellow")
