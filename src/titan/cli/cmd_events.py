"""``titan events RUN_DIR``: print a run's events, merged and time-ordered."""

from __future__ import annotations

import argparse

from rich.table import Table

from titan.cli._common import ident, time_arg, whole
from titan.cli.environment import Environment, styled
from titan.errors import UserError
from titan.events import filter_events, read_run, utc_iso
from titan.exitcodes import ExitCode

EXIT_CODES = (ExitCode.SUCCEEDED, ExitCode.USER_ERROR)


def _kind(text: str) -> str:
    import re

    from titan.cli._common import BadValue

    if not re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_]+)*", text):
        raise BadValue(f"{text!r} is not an event kind", "give a kind or prefix such as guard, ckpt.saved, worker.failed")
    return text


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("events", help="print a run's events (merged across ranks and attempts)",
                       description="Print the events of a run directory in time order.")
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--kind", type=_kind, action="append",
                   help="kind or kind prefix (guard matches guard.*); repeatable")
    p.add_argument("--rank", type=whole(0, 1_000_000, "a rank"), action="append", help="only this rank; repeatable")
    p.add_argument("--node", type=ident("node id"), action="append", help="only this node id; repeatable")
    p.add_argument("--since", type=time_arg, help="ISO-8601 time or UNIX seconds")
    p.add_argument("--until", type=time_arg, help="ISO-8601 time or UNIX seconds")
    p.add_argument("--level", choices=["debug", "info", "warning", "error", "critical"], help="minimum level")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    return p


def run(args: argparse.Namespace, env: Environment) -> ExitCode:
    if args.since is not None and args.until is not None and args.since > args.until:
        raise UserError("--since is after --until", "give --since earlier than --until (or only one of them)")
    res = read_run(env.path(args.run_dir))
    evs = filter_events(res.events, kinds=args.kind, ranks=args.rank, nodes=args.node,
                        since=args.since, until=args.until, min_level=args.level)
    if args.json:
        import json

        for ev in evs:
            env.stdout.write(json.dumps(ev.to_dict(), default=str) + "\n")
        for p in res.problems:
            env.stderr.write(f"titan: warning: skipped {p.source}:{p.line}: {p.reason}\n")
        return ExitCode.SUCCEEDED
    table = Table(show_header=True, header_style="bold", box=None)
    for col in ("time (UTC)", "node", "rank", "att", "step", "phase", "kind", "message"):
        table.add_column(col, overflow="fold")
    for ev in evs:
        style = {"warning": "yellow", "error": "red", "critical": "bold red"}.get(ev.level)
        table.add_row(utc_iso(ev.t)[11:23], ev.node, _s(ev.rank), _s(ev.attempt), _s(ev.step),
                      ev.phase or "", ev.kind, ev.msg, style=style)
    env.console.print(table)
    env.console.print(f"{len(evs)} events" + (f" of {len(res.events)}" if len(evs) != len(res.events) else ""))
    for p in res.problems:
        env.err_console.print(styled((f"skipped {p.source}:{p.line}: {p.reason}", "yellow")))
    return ExitCode.SUCCEEDED


def _s(x: object) -> str:
    return "" if x is None else str(x)
