"""``titan gather OUT SOURCE…``: merge per-node run directories into one."""

from __future__ import annotations

import argparse

from titan.cli._common import print_json
from titan.cli.environment import Environment
from titan.exitcodes import ExitCode


#: What this verb can exit with (its --help lists them).
EXIT_CODES = (ExitCode.SUCCEEDED, ExitCode.USER_ERROR)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "gather", help="merge per-node run directories into one",
        description="Copy every node's part of a run (events, launcher and agent logs, metrics, stacks, traces) "
                    "into OUT, which `titan events`, `titan triage` and `titan report` then read as one job. "
                    "Sources are local folders, or HOST:PATH fetched with --fetch-command.")
    p.add_argument("out", metavar="OUT", help="new folder to create")
    p.add_argument("sources", metavar="SOURCE", nargs="+", help="run directory per node (or HOST:PATH)")
    p.add_argument("--fetch-command", metavar="TEMPLATE",
                   help="shell command with {host}, {path}, {dest}, e.g. \"rsync -a {host}:{path}/ {dest}/\"")
    p.add_argument("--force", action="store_true", help="merge parts of different run ids")
    p.add_argument("--json", action="store_true", help="machine-readable summary on stdout")
    return p


def run(args: argparse.Namespace, env: Environment) -> ExitCode:
    from titan.tracing.gather import gather

    srcs = [s if args.fetch_command else str(env.path(s)) for s in args.sources]
    res = gather(env.path(args.out), srcs, fetch_command=args.fetch_command, force=args.force)
    if args.json:
        print_json(env, {"out": str(res.out), "sources": res.sources, "files": res.files, "conflicts": res.conflicts})
    else:
        env.console.print(f"gathered {res.files} files from {len(res.sources)} sources into {res.out}")
        for c in res.conflicts:
            env.err_console.print(f"kept both versions of {c}", style="yellow")
    return ExitCode.SUCCEEDED
