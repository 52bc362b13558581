"""``titan report RUN_DIR…``: the run report (HTML, Markdown, JSON) and SLA figures across runs."""

from __future__ import annotations

import argparse

from rich.table import Table
from rich.text import Text

from titan.cli._common import number, print_json
from titan.cli.environment import Environment
from titan.exitcodes import ExitCode
from titan.mdtext import md_cell


#: What this verb can exit with (its --help lists them).
EXIT_CODES = (ExitCode.SUCCEEDED, ExitCode.USER_ERROR)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("report", help="write the run report (HTML, Markdown, JSON) and SLA figures",
                       description="Write RUN_DIR/report/index.html (one self-contained page), summary.md and "
                                   "summary.json for each run; then print goodput, RTO/RPO and, across the "
                                   "runs, the job success rate and uninterrupted-run lengths.")
    p.add_argument("run_dirs", metavar="RUN_DIR", nargs="+")
    p.add_argument("--sla-hours", type=number(0, 87600, above=True, unit="h"), default=168.0,
                   help="uninterrupted hours a job must run to meet the SLA (default 168 = 7 days, the spec's example)")
    p.add_argument("--no-triage", action="store_true", help="do not call titan.triage for failed runs")
    p.add_argument("--overhead", metavar="FILE",
                   help="JSON A/B overhead measurement {name: {bare_tokens_per_s, with_tokens_per_s, fraction, "
                        "source}} to show with every run (else run.json's 'overhead')")
    p.add_argument("--out", metavar="DIR", help="also write the across-runs figures to DIR/runs.json and DIR/runs.md "
                   "(and a run's report to DIR/<run id>/ when its run directory is full or read-only)")
    p.add_argument("--json", action="store_true", help="machine-readable summary on stdout")
    return p


def run(args: argparse.Namespace, env: Environment) -> ExitCode:
    from titan.errors import UserError
    from titan.report import write_report
    from titan.report.summary import fmt_s
    from titan.sla.figures import run_figures
    from titan.sla.runs import summarize_runs

    from titan.events import RunDir

    # Everything is checked before the first report is written.
    overhead = _read_overhead(env.path(args.overhead)) if args.overhead else None
    rds = [RunDir.open(env.path(p)) for p in args.run_dirs]
    seen: dict[str, str] = {}
    for arg, rd in zip(args.run_dirs, rds):
        key = str(rd.path.resolve())
        if key in seen:
            raise UserError(f"{arg} is given twice (also as {seen[key]})", "give each run directory once")
        seen[key] = arg
        rd.read_run_json()  # a garbled run.json is refused now, not after other reports were written
    if args.out:
        _check_out(env.path(args.out), args.out)
    reports = []
    for rd in rds:
        try:
            reports.append(write_report(rd, run_triage=not args.no_triage, overhead=overhead))
        except OSError as e:
            if not args.out:
                raise UserError(f"cannot write the report into {rd.report}: {e.strerror or e}",
                                "free space or fix permissions there, or write it elsewhere with --out DIR; "
                                "`titan events` and `titan triage --no-save` read the run without writing") from None
            # A full (or read-only) run directory: the report goes under --out instead.
            alt = env.path(args.out) / rd.run_id
            try:
                reports.append(write_report(rd, run_triage=not args.no_triage, overhead=overhead, out_dir=alt))
            except OSError as e2:
                raise UserError(f"cannot write the report into {rd.report} ({e.strerror or e}) nor {alt} "
                                f"({e2.strerror or e2})", "free space or fix permissions in one of them") from None
            env.err_console.print(f"note: {rd.report} is not writable ({e.strerror or e}); "
                                  f"the report of {rd.run_id} is in {alt}", markup=False)
    agg = summarize_runs([r.data.acc for r in reports], threshold_h=args.sla_hours)
    if args.out:
        _write_across(env.path(args.out), agg)
    if args.json:
        print_json(env, {"runs": [{"run_dir": str(r.data.rd.path), "html": str(r.html), "markdown": str(r.markdown),
                                   "json": str(r.json), **r.data.acc.to_dict()} for r in reports],
                         "across_runs": agg})
        return ExitCode.SUCCEEDED
    t = Table(show_header=True, header_style="bold", box=None)
    for col in ("run", "outcome", "wall", "goodput", "interruptions", "worst RTO", "steps lost", "report"):
        t.add_column(col, overflow="fold")
    for r in reports:
        a = r.data.acc
        f = run_figures(a)
        t.add_row(r.data.rd.run_id, "succeeded" if a.outcome.get("succeeded") else Text("failed", style="red"),
                  fmt_s(f.wall_s), f"{f.goodput_fraction:.1%}", str(f.interruptions), fmt_s(f.worst_rto_s),
                  str(f.steps_lost), str(r.html))
    env.console.print(t)
    if len(reports) > 1:
        us = agg["uninterrupted_s"]
        env.console.print(
            f"{agg['runs']} runs: job success rate {agg['job_success_rate']:.1%}, interruption-free "
            f"{agg['interruption_free_rate']:.1%}, SLA (≥ {args.sla_hours:g} h uninterrupted) met by "
            f"{agg['sla_met_fraction']:.1%}; uninterrupted stretches: mean {fmt_s(us['mean'])}, "
            f"min {fmt_s(us['min'])}, max {fmt_s(us['max'])}")
    return ExitCode.SUCCEEDED


_OVERHEAD_NUMBERS = {"bare_tokens_per_s": (0.0, 1e15), "with_tokens_per_s": (0.0, 1e15), "fraction": (-1.0, 100.0)}
_OVERHEAD_TEXTS = ("source", "note", "command")


def _read_overhead(path) -> dict:  # noqa: ANN001
    """``{name: {bare_tokens_per_s, with_tokens_per_s, fraction, source}}``, each field optional, each typed."""
    import json
    import math

    from titan.errors import UserError
    from titan.inputs import read_text_file

    hint = 'e.g. {"guard": {"bare_tokens_per_s": 1000, "with_tokens_per_s": 985, "fraction": 0.015, "source": "bench"}}'
    text = read_text_file(path, "--overhead file", "pass a JSON file")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"--overhead {path} is not JSON ({e.msg} at line {e.lineno})", "pass a JSON object") from None
    if not isinstance(obj, dict) or not obj:
        raise UserError(f"--overhead {path} is not a JSON object of measurements", hint)
    for name, m in obj.items():
        if not isinstance(m, dict):
            raise UserError(f"--overhead {path}: {name!r} is not an object of fields", hint)
        for key, v in m.items():
            if key in _OVERHEAD_NUMBERS:
                lo, hi = _OVERHEAD_NUMBERS[key]
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
                    raise UserError(f"--overhead {path}: {name}.{key} = {v!r} is not a number within {lo:g} … {hi:g}", hint)
            elif key in _OVERHEAD_TEXTS:
                if not isinstance(v, str):
                    raise UserError(f"--overhead {path}: {name}.{key} = {v!r} is not a string", hint)
            else:
                raise UserError(f"--overhead {path}: {name} has an unknown field {key!r}",
                                f"fields: {', '.join(list(_OVERHEAD_NUMBERS) + list(_OVERHEAD_TEXTS))}")
    return obj


def _check_out(out, arg: str) -> None:  # noqa: ANN001
    """``--out`` must be a folder or creatable as one (checked before anything is written)."""
    import os

    from titan.errors import UserError

    if out.exists():
        if not out.is_dir():
            raise UserError(f"--out {arg} exists and is not a folder", "give a folder for runs.json and runs.md")
        probe = out
    else:
        probe = out.parent
        while not probe.exists():
            probe = probe.parent
        if not probe.is_dir():
            raise UserError(f"--out {arg}: {probe} is not a folder", "give a folder for runs.json and runs.md")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"--out {arg}: {probe} is not writable", "choose a writable folder")


def _write_across(out, agg: dict) -> None:  # noqa: ANN001
    from titan.errors import UserError
    from titan.events import atomic_write_json, atomic_write_text
    from titan.report.summary import fmt_s

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create --out {out}: {e.strerror or e}", "choose a writable folder") from None
    atomic_write_json(out / "runs.json", agg)
    us = agg["uninterrupted_s"]
    lines = ["# Across runs", "", f"- runs: {agg['runs']}", f"- job success rate: {agg['job_success_rate']:.1%}",
             f"- interruption-free: {agg['interruption_free_rate']:.1%}",
             f"- SLA (≥ {agg['sla_threshold_h']:g} h uninterrupted, or finished without interruption): "
             f"{agg['sla_met_fraction']:.1%}",
             f"- interruptions: {agg['interruptions']}, MTBI {fmt_s(agg['mtbi_s'])}",
             f"- uninterrupted stretches: {us['count']}, mean {fmt_s(us['mean'])}, median {fmt_s(us['median'])}, "
             f"min {fmt_s(us['min'])}, max {fmt_s(us['max'])}", "",
             "| run | succeeded | interruptions | wall | goodput | longest uninterrupted | SLA met |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in agg["per_run"]:
        lines.append(f"| {md_cell(r['run_dir'])} | {r['succeeded']} | {r['interruptions']} | {fmt_s(r['wall_s'])} | "
                     f"{r['goodput_fraction']:.1%} | {fmt_s(r['longest_uninterrupted_s'])} | {r['sla_met']} |")
    atomic_write_text(out / "runs.md", "\n".join(lines) + "\n")
