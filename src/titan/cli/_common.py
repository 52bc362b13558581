"""Helpers shared by the CLI verbs: settings flags, JSON output, time parsing, and the
checked argparse types every numeric or id flag uses (one place for ranges and hints)."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
from typing import Any, Callable, Mapping

from titan.cli.environment import Environment
from titan.errors import UserError
from titan.inputs import check_host, check_host_port
from titan.settings import Settings, load_settings
from titan.settings.core import fmt_number as _fmt

__all__ = ["add_settings_flags", "parse_sets", "settings_from_args", "print_json", "parse_time", "BadValue", "whole",
           "number", "ident", "hostname", "host_port", "time_arg", "SEED", "MAX_SECONDS_FLAG"]

#: The largest duration any flag takes (7 days): a bigger timeout or soak is a typo.
MAX_SECONDS_FLAG = 7 * 86400.0
#: Seeds are 32-bit unsigned (NumPy's ``default_rng`` and torch both take them).
SEED = (0, 2**32 - 1)


class BadValue(argparse.ArgumentTypeError):
    """A flag value refused by a checked type; ``hint`` becomes the ``hint:`` line."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.hint = hint


def whole(lo: int, hi: int, what: str = "a whole number") -> Callable[[str], int]:
    """argparse type: an integer within ``lo … hi`` (``BadValue`` with the range otherwise)."""
    hint = f"give {what} within {_fmt(lo)} … {_fmt(hi)}"

    def parse(text: str) -> int:
        try:
            value = int(text.strip().replace("_", ""), 10)
        except ValueError:
            raise BadValue(f"{text!r} is not a whole number", hint) from None
        if not lo <= value <= hi:
            raise BadValue(f"{_fmt(value)} is out of range", hint)
        return value

    parse.__name__ = "whole number"
    return parse


def number(lo: float, hi: float, *, above: bool = False, unit: str = "") -> Callable[[str], float]:
    """argparse type: a finite float within ``lo … hi`` (``above``: strictly greater than ``lo``)."""
    u = f" {unit}" if unit else ""
    hint = f"give a number {'>' if above else '>='} {_fmt(lo)} and <= {_fmt(hi)}{u}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise BadValue(f"{text!r} is not a number", hint) from None
        if not math.isfinite(value):
            raise BadValue(f"{text!r} is not a finite number", hint)
        if not (lo < value if above else lo <= value) or value > hi:
            raise BadValue(f"{_fmt(value)}{u} is out of range", hint)
        return value

    parse.__name__ = "number"
    return parse


def ident(what: str) -> Callable[[str], str]:
    """argparse type: a run or node id (safe as a file name; see ``titan.inputs.check_id``)."""
    from titan.inputs import check_id

    return _wrap(lambda t: check_id(t, what), what)


def _wrap(check: Callable[[str], str], name: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        try:
            return check(text)
        except UserError as e:
            raise BadValue(e.message, e.hint) from None

    parse.__name__ = name
    return parse


#: argparse types for a host name / IP and for ``HOST[:PORT]`` (``titan.inputs``).
hostname = _wrap(lambda t: check_host(t, "host"), "host")
host_port = _wrap(lambda t: check_host_port(t, "endpoint"), "HOST:PORT")


def add_settings_flags(p: argparse.ArgumentParser) -> None:
    """``--config FILE`` and repeatable ``--set section.field=value``."""
    p.add_argument("--config", metavar="FILE", help="TOML settings file (also TITAN_CONFIG)")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override one setting (highest precedence); repeatable")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")


def parse_sets(items: list[str] | None) -> dict[str, str]:
    """``--set SECTION.FIELD=VALUE`` items → ``{"section.field": value}`` (``UserError`` if malformed)."""
    cli: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or "." not in key:
            raise UserError(f"--set {item!r} is not SECTION.FIELD=VALUE", "e.g. --set run.max_restarts=5")
        cli[key.strip()] = value
    return cli


def settings_from_args(args: argparse.Namespace, env: Environment, extra: Mapping[str, Any] | None = None) -> Settings:
    cli: dict[str, Any] = dict(parse_sets(getattr(args, "settings", None)))
    cli.update({k: v for k, v in (extra or {}).items() if v is not None})
    config = getattr(args, "config", None)
    return load_settings(config_file=env.path(config) if config else None, env=env.env, cli=cli)


def print_json(env: Environment, obj: Any) -> None:
    env.stdout.write(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    env.stdout.flush()


def parse_time(value: str) -> float:
    """ISO-8601 (``2026-11-30T13:00:00Z``) or UNIX seconds → UNIX seconds (years 1970 … 9999)."""
    hint = "use ISO-8601 (2026-11-30T13:00:00Z) or UNIX seconds (0 … 253402300799)"
    try:
        t = float(value)
    except ValueError:
        try:
            d = _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise UserError(f"cannot parse time {value!r}", hint) from None
        if d.tzinfo is None:
            d = d.replace(tzinfo=_dt.timezone.utc)
        t = d.timestamp()
    if not (math.isfinite(t) and 0 <= t <= _MAX_UNIX_S):
        raise UserError(f"time {value!r} is not within 1970 … 9999", hint)
    return t


def time_arg(text: str) -> float:
    """argparse type of ``parse_time``."""
    try:
        return parse_time(text)
    except UserError as e:
        raise BadValue(e.message, e.hint) from None


time_arg.__name__ = "time"
_MAX_UNIX_S = 253402300799.0  # 9999-12-31T23:59:59Z
