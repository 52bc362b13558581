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
import unicodedata
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
    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        # A checked type (titan.cli._common.BadValue) knows the valid range: argparse calls
        # error() while handling the ArgumentError that wraps it.
        cause = sys.exc_info()[1]
        bad = getattr(cause, "__context__", None)
        hint = getattr(bad, "hint", None) or f"see `{self.prog} --help`"
        raise _ArgError(message, hint)


def _control_chars(argv: Sequence[str]) -> tuple[int, str] | None:
    """(index, argument) of the first argument before ``--`` holding a control character."""
    for i, a in enumerate(argv):
        if a == "--":
            return None  # the rest belongs to the user's script
        if any(unicodedata.category(ch) == "Cc" and ch not in "\t\n" for ch in a):
            return i, a
    return None


def _plain(text: str) -> str:
    """``text`` with control characters shown as escapes (never sent raw to a terminal)."""
    return "".join(ch if unicodedata.category(ch) != "Cc" else ch.encode("unicode_escape").decode()
                   for ch in text)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every verb. ``titan --help`` shows the whole exit-code table once; each
    verb's ``--help`` lists only the codes that verb can return (its module's ``EXIT_CODES``)."""
    parser = _Parser(
        prog="titan",
        description="Keep distributed training alive through transient faults.",
        epilog="exit codes (each verb's --help lists the ones it can return):\n" + describe_exit_codes(),
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
            p.epilog = "exit codes:\n" + describe_exit_codes(mod.EXIT_CODES)
    return parser


def _fail(env: Environment, message: str, hint: str | None) -> None:
    env.stderr.write(f"titan: error: {_plain(message)}\n")
    if hint:
        env.stderr.write(f"hint: {_plain(hint)}\n")
    env.stderr.flush()


def run(argv: Sequence[str], env: Environment | None = None) -> ExitCode:
    """Run one CLI invocation against ``env``; returns the exit code (never exits)."""
    env = env or Environment()
    env.debug = env.debug or env.env.get(TITAN_DEBUG, "") in ("1", "true", "yes") or "--debug" in argv
    parser = build_parser()
    try:
        bad = _control_chars(argv)
        if bad is not None:
            raise UserError(f"argument {bad[0] + 1} ({bad[1]!r}) contains a control character",
                            "remove escape and control characters: paths, ids and values are plain text")
        try:
            # argparse prints --help/--version to sys.stdout; send it to env.stdout.
            with contextlib.redirect_stdout(env.stdout):
                args = parser.parse_args(list(argv))
        except _ArgError as e:
            raise UserError(e.message, e.hint) from None
        except SystemExit as e:  # --help / --version printed and asked to exit
            return ExitCode(e.code) if isinstance(e.code, int) and e.code in iter(ExitCode) else ExitCode.SUCCEEDED
        if not args.verb:
            parser.print_usage(env.stdout)
            raise UserError("no verb given", f"choose one of {', '.join(VERBS)}; `titan --help` explains them")
        logging.basicConfig(level=logging.DEBUG if env.debug else logging.WARNING,
                            format="%(levelname)s %(name)s: %(message)s", stream=env.stderr)
        return ExitCode(args._module.run(args, env))
    except UserError as e:
        if env.debug:
            traceback.print_exc(file=env.stderr)
        _fail(env, e.message, e.hint)
        return ExitCode.USER_ERROR
    except TitanAbort as e:
        _fail(env, e.message, getattr(e, "hint", None) or None)
        return ExitCode(e.exit_code)
    except TitanError as e:
        if env.debug:
            traceback.print_exc(file=env.stderr)
        _fail(env, str(e), "run again with --debug for the traceback")
        return ExitCode.JOB_FAILED
    except KeyboardInterrupt:
        _fail(env, "interrupted", None)
        return ExitCode.INTERRUPTED
    except Exception as e:  # noqa: BLE001 - the last line of defence: never a raw traceback
        if env.debug:
            traceback.print_exc(file=env.stderr)
        _fail(env, f"unexpected {type(e).__name__}: {e}",
              "this is a bug in Titan: run again with --debug and report the traceback")
        return ExitCode.JOB_FAILED


def main(argv: Sequence[str] | None = None) -> NoReturn:
    sys.exit(int(run(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    main()
