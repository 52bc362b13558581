"""``titan nodes``: the node ledger — strikes per node, who is excluded; clear a node."""

from __future__ import annotations

import argparse
import datetime as _dt
import sqlite3
from pathlib import Path

from rich.table import Table
from rich.text import Text

from titan.cli._common import add_settings_flags, ident, print_json, settings_from_args
from titan.cli.environment import Environment
from titan.errors import UserError
from titan.exitcodes import ExitCode


#: What this verb can exit with (its --help lists them).
EXIT_CODES = (ExitCode.SUCCEEDED, ExitCode.USER_ERROR)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("nodes", help="list the node ledger (strikes, exclusions) or clear a node",
                       description="List strikes per node from this machine's node ledger "
                                   "(watchdog.ledger_path); a node at watchdog.strike_limit strikes within "
                                   "watchdog.strike_window_s does not join the next rendezvous.")
    change = p.add_mutually_exclusive_group()
    change.add_argument("--clear", type=ident("node id"), metavar="NODE", help="delete every strike of NODE (it may join again)")
    p.add_argument("--strikes", action="store_true", help="list individual strikes instead of a summary")
    change.add_argument("--add", nargs=2, metavar=("NODE", "KIND"), help="record a manual strike (KIND: manual, hang, …)")
    p.add_argument("--ledger", metavar="FILE", help="ledger file (default: watchdog.ledger_path)")
    add_settings_flags(p)
    return p


def _when(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def run(args: argparse.Namespace, env: Environment) -> ExitCode:
    from titan.inputs import check_id
    from titan.ledger import KINDS, Ledger

    s = settings_from_args(args, env)
    w = s.watchdog
    if args.add:
        check_id(args.add[0], "node id")
        if args.add[1] not in KINDS:
            raise UserError(f"unknown strike kind {args.add[1]!r}", f"use one of {', '.join(KINDS)}")
    path = _ledger_path(env, args.ledger or w.ledger_path or None, explicit=bool(args.ledger or w.ledger_path))
    if not path.exists() and not args.add:  # reading or clearing a ledger that is not there creates nothing
        if args.json:
            print_json(env, {"node": args.clear, "cleared": 0, "ledger": str(path)} if args.clear else [] if args.strikes
                       else {"ledger": str(path), "limit": w.strike_limit, "window_s": w.strike_window_s, "nodes": []})
        else:
            env.console.print(f"no strikes recorded: no ledger at {path} yet")
        return ExitCode.SUCCEEDED
    try:
        return _act(Ledger(path, limit=w.strike_limit, window_s=w.strike_window_s), args, env)
    except sqlite3.DatabaseError as e:
        raise UserError(f"cannot use the node ledger {path}: {e}", "give a ledger file written by Titan "
                        "(--ledger or watchdog.ledger_path), or remove the damaged file") from None


def _ledger_path(env: Environment, given: str | None, *, explicit: bool) -> Path:
    """The ledger file to use, checked without creating anything (``UserError`` when unusable)."""
    from titan.ledger import default_ledger_path

    path = env.path(given) if given else default_ledger_path()
    hint = "give a ledger file (--ledger FILE or watchdog.ledger_path) in an existing folder"
    if path.exists():
        if not path.is_file():
            raise UserError(f"node ledger {path} is not a file", hint)
        with open(path, "rb") as f:
            head = f.read(16)
        if head and head != b"SQLite format 3\x00":
            raise UserError(f"node ledger {path} is not an SQLite file", hint)
        if head:
            _check_schema(path)
    elif explicit and not path.parent.is_dir():
        raise UserError(f"node ledger {path}: folder {path.parent} does not exist", hint)
    return path


def _check_schema(path: Path) -> None:
    try:
        c = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        finally:
            c.close()
    except sqlite3.DatabaseError as e:
        raise UserError(f"node ledger {path} is damaged: {e}", "remove the file; the ledger starts empty") from None
    if tables and "strikes" not in tables:
        raise UserError(f"{path} is an SQLite file but not a node ledger (no strikes table)",
                        "give the ledger file Titan wrote (watchdog.ledger_path)")


def _act(led, args: argparse.Namespace, env: Environment) -> ExitCode:  # noqa: ANN001 - titan.ledger.Ledger
    if args.clear:
        n = led.clear(args.clear)
        if args.json:
            print_json(env, {"node": args.clear, "cleared": n, "ledger": str(led.path)})
        else:
            env.console.print(f"cleared {n} strike(s) of node {args.clear} in {led.path}")
        return ExitCode.SUCCEEDED
    if args.add:
        node, kind = args.add
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
                  _when(n.last_t), Text("excluded", style="red") if n.excluded else "ok")
    env.console.print(t)
    return ExitCode.SUCCEEDED
