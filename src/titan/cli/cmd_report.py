"""``titan report RUN_DIR…``: the run report (HTML, Markdown, JSON) and SLA figures across runs."""

from __future__ import annotations

import argparse

from rich.markup import escape
from rich.table import Table

from titan.cli._common import print_json
from titan.cli.environment import Environment
from titan.exitcodes import ExitCode


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("report", help="write the run report (HTML, Markdown, JSON) and SLA figures",
                       description="Write RUN_DIR/report/index.html (one self-contained page), summary.md and "
                                   "summary.json for each run; then print goodput, RTO/RPO and, across the "
                                   "runs, the job success rate and uninterrupted-run lengths.")
    p.add_argument("run_dirs", metavar="RUN_DIR", nargs="+")
    p.add_argument("--sla-hours", type=float, default=168.0,
                   help="uninterrupted hours a job must run to meet the SLA (default 168 = 7 days, the spec's example)")
    p.add_argument("--no-triage", action="store_true", help="do not call titan.triage for failed runs")
    p.add_argument("--overhead", metavar="FILE",
                   help="JSON A/B overhead measurement {name: {bare_tokens_per_s, with_tokens_per_s, fraction, "
                        "source}} to show with every run (else run.json's 'overhead')")
    p.add_argument("--out", metavar="DIR", help="also write the across-runs figures to DIR/runs.json and DIR/runs.md")
    p.add_argument("--json", action="store_true", help="machine-readable summary on stdout")
    return p


def run(args: argparse.Namespace, env: Environment) -> ExitCode:
    from titan.errors import UserError
    from titan.report import write_report
    from titan.report.summary import fmt_s
    from titan.sla.runs import summarize_runs

    if args.sla_hours <= 0:
        raise UserError(f"--sla-hours must be > 0, got {args.sla_hours}", "e.g. --sla-hours 168")
    overhead = _read_overhead(env.path(args.overhead)) if args.overhead else None
    reports = [write_report(env.path(p), run_triage=not args.no_triage, overhead=overhead) for p in args.run_dirs]
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
        hard = [i for i in a.incidents if i.kind in ("restart", "fatal")]
        rtos = [i.rto_s for i in hard if i.rto_s is not None]
        t.add_row(r.data.rd.run_id, "succeeded" if a.outcome.get("succeeded") else "[red]failed[/]", fmt_s(a.wall_s),
                  f"{a.goodput_fraction:.1%}", str(len(hard)), fmt_s(max(rtos)) if rtos else "—",
                  str(sum(i.rpo_steps for i in hard)), escape(str(r.html)))
    env.console.print(t)
    if len(reports) > 1:
        us = agg["uninterrupted_s"]
        env.console.print(
            f"{agg['runs']} runs: job success rate {agg['job_success_rate']:.1%}, interruption-free "
            f"{agg['interruption_free_rate']:.1%}, SLA (≥ {args.sla_hours:g} h uninterrupted) met by "
            f"{agg['sla_met_fraction']:.1%}; uninterrupted stretches: mean {fmt_s(us['mean'])}, "
            f"min {fmt_s(us['min'])}, max {fmt_s(us['max'])}")
    return ExitCode.SUCCEEDED


def _read_overhead(path) -> dict:  # noqa: ANN001
    import json

    from titan.errors import UserError

    try:
        obj = json.loads(path.read_text())
    except OSError as e:
        raise UserError(f"cannot read --overhead {path}: {e.strerror or e}", "pass a JSON file") from None
    except json.JSONDecodeError as e:
        raise UserError(f"--overhead {path} is not JSON ({e.msg} at line {e.lineno})", "pass a JSON object") from None
    if not isinstance(obj, dict):
        raise UserError(f"--overhead {path} is not a JSON object", "e.g. {\"guard\": {\"fraction\": 0.01}}")
    return obj


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
        lines.append(f"| {r['run_dir']} | {r['succeeded']} | {r['interruptions']} | {fmt_s(r['wall_s'])} | "
                     f"{r['goodput_fraction']:.1%} | {fmt_s(r['longest_uninterrupted_s'])} | {r['sla_met']} |")
    atomic_write_text(out / "runs.md", "\n".join(lines) + "\n")
