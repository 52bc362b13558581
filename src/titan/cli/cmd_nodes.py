"""``titan nodes``: the node ledger — strikes per node, who is excluded; clear a node."""

from __future__ import annotations

import argparse
import datetime as _dt

from rich.table import Table

from titan.cli._common import add_settings_flags, print_json, settings_from_args
from titan.cli.environment import Environment
from titan.errors import UserError
from titan.exitcodes import ExitCode


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("nodes", help="list the node ledger (strikes, exclusions) or clear a node",
                       description="List strikes per node from this machine's node ledger "
                                   "(watchdog.ledger_path); a node at watchdog.strike_limit strikes within "
                                   "watchdog.strike_window_s does not join the next rendezvous.")
    p.add_argument("--clear", metavar="NODE", help="delete every strike of NODE (it may join again)")
    p.add_argument("--strikes", action="store_true", help="list individual strikes instead of a summary")
    p.add_argument("--add", nargs=2, metavar=("NODE", "KIND"), help="record a manual strike (KIND: manual, hang, …)")
    p.add_argument("--ledger", metavar="FILE", help="ledger file (default: watchdog.ledger_path)")
    add_settings_flags(p)
    return p


def _when(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def run(args: argparse.Namespace, env: Environment) -> ExitCode:
    from titan.ledger import KINDS, Ledger

    s = settings_from_args(args, env)
    w = s.watchdog
    led = Ledger(env.path(args.ledger) if args.ledger else (w.ledger_path or None), limit=w.strike_limit,
                 window_s=w.strike_window_s)
    if args.clear:
        n = led.clear(args.clear)
        if args.json:
            print_json(env, {"node": args.clear, "cleared": n, "ledger": str(led.path)})
        else:
            env.console.print(f"cleared {n} strike(s) of node {args.clear} in {led.path}")
        return ExitCode.SUCCEEDED
    if args.add:
        node, kind = args.add
        if kind not in KINDS:
            raise UserError(f"unknown strike kind {kind!r}", f"use one of {', '.join(KINDS)}")
        led.add(node, kind, detail="added by `titan nodes --add`")
    if args.strikes:
        rows = led.strikes()
        if args.json:
            print_json(env, [r.__dict__ for r in rows])
            return ExitCode.SUCCEEDED
        t = Table(title=f"strikes in {led.path}")
        for c in ("time (UTC)", "node", "kind", "run", "detail"):
            t.add_column(c)
        for r in rows:
            t.add_row(_when(r.t), r.node, r.kind, r.run, r.detail)
        env.console.print(t)
        return ExitCode.SUCCEEDED
    nodes = led.nodes()
    if args.json:
        print_json(env, {"ledger": str(led.path), "limit": led.limit, "window_s": led.window_s,
                         "nodes": [n.__dict__ for n in nodes]})
        return ExitCode.SUCCEEDED
    if not nodes:
        env.console.print(f"no strikes recorded in {led.path}")
        return ExitCode.SUCCEEDED
    t = Table(title=f"node ledger {led.path} (limit {led.limit} strikes per {led.window_s:g} s)")
    for c in ("node", "strikes", "by kind", "last strike (UTC)", "status"):
        t.add_column(c)
    for n in nodes:
        t.add_row(n.node, str(n.strikes), ", ".join(f"{k} {v}" for k, v in sorted(n.by_kind.items())) or "-",
                  _when(n.last_t), "[red]excluded[/red]" if n.excluded else "ok")
    env.console.print(t)
    return ExitCode.SUCCEEDED
