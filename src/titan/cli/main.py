"""``titan VERB``: the one console script.

Each verb lives in its own module ``titan.cli.cmd_<verb>`` exposing ``add_parser(sub)``
and ``run(args, env) -> ExitCode``. A user mistake (``UserError``, a bad flag) prints
``titan: error: …`` and ``hint: …`` and exits ``USER_ERROR``; tracebacks only with
``--debug`` (or ``TITAN_DEBUG=1``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import sys
import traceback
from typing import NoReturn, Sequence

from titan import __version__
from titan.cli.environment import Environment
from titan.errors import TitanAbort, TitanError, UserError
from titan.exitcodes import ExitCode, describe_exit_codes
from titan.settings.env import TITAN_DEBUG

__all__ = ["main", "run", "build_parser", "VERBS"]

#: Verbs in --help order; each is ``titan.cli.cmd_<verb>``.
VERBS: tuple[str, ...] = ("run", "drill", "events", "preflight", "plan", "report", "agent", "triage", "nodes", "ckpt", "gather",)


class _ArgError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise _ArgError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="titan",
        description="Keep distributed training alive through transient faults.",
        epilog="exit codes:\n" + describe_exit_codes(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"titan {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    for verb in VERBS:
        mod = importlib.import_module(f"titan.cli.cmd_{verb}")
        p = mod.add_parser(sub)
        p.set_defaults(_module=mod)
        p.formatter_class = argparse.RawDescriptionHelpFormatter
        if not p.epilog:
            p.epilog = "exit codes:\n" + describe_exit_codes()
    return parser


def _fail(env: Environment, message: str, hint: str | None) -> None:
    env.stderr.write(f"titan: error: {message}\n")
    if hint:
        env.stderr.write(f"hint: {hint}\n")
    env.stderr.flush()


def run(argv: Sequence[str], env: Environment | None = None) -> ExitCode:
    """Run one CLI invocation against ``env``; returns the exit code (never exits)."""
    env = env or Environment()
    env.debug = env.debug or env.env.get(TITAN_DEBUG, "") in ("1", "true", "yes") or "--debug" in argv
    parser = build_parser()
    try:
        try:
            # argparse prints --help/--version to sys.stdout; send it to env.stdout.
            with contextlib.redirect_stdout(env.stdout):
                args = parser.parse_args(list(argv))
        except _ArgError as e:
            raise UserError(e.message, "see `titan --help` or `titan VERB --help`") from None
        except SystemExit as e:  # --help / --version printed and asked to exit
            return ExitCode(e.code) if isinstance(e.code, int) and e.code in iter(ExitCode) else ExitCode.SUCCEEDED
        if not args.verb:
            parser.print_help(env.stdout)
            return ExitCode.USER_ERROR
        logging.basicConfig(level=logging.DEBUG if env.debug else logging.WARNING,
                            format="%(levelname)s %(name)s: %(message)s", stream=env.stderr)
        return ExitCode(args._module.run(args, env))
    except UserError as e:
        if env.debug:
            traceback.print_exc(file=env.stderr)
        _fail(env, e.message, e.hint)
        return ExitCode.USER_ERROR
    except TitanAbort as e:
        _fail(env, e.message, None)
        return ExitCode(e.exit_code)
    except TitanError as e:
        if env.debug:
            traceback.print_exc(file=env.stderr)
        _fail(env, str(e), "run again with --debug for the traceback")
        return ExitCode.JOB_FAILED
    except KeyboardInterrupt:
        _fail(env, "interrupted", None)
        return ExitCode.INTERRUPTED


def main(argv: Sequence[str] | None = None) -> NoReturn:
    sys.exit(int(run(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    main()
