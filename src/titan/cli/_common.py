"""Helpers shared by the CLI verbs: settings flags, JSON output, time parsing."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
from typing import Any, Mapping

from titan.cli.environment import Environment
from titan.errors import UserError
from titan.settings import Settings, load_settings

__all__ = ["add_settings_flags", "settings_from_args", "print_json", "parse_time"]


def add_settings_flags(p: argparse.ArgumentParser) -> None:
    """``--config FILE`` and repeatable ``--set section.field=value``."""
    p.add_argument("--config", metavar="FILE", help="TOML settings file (also TITAN_CONFIG)")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override one setting (highest precedence); repeatable")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")


def settings_from_args(args: argparse.Namespace, env: Environment, extra: Mapping[str, Any] | None = None) -> Settings:
    cli: dict[str, Any] = {}
    for item in getattr(args, "settings", []) or []:
        key, sep, value = item.partition("=")
        if not sep or "." not in key:
            raise UserError(f"--set {item!r} is not SECTION.FIELD=VALUE", "e.g. --set run.max_restarts=5")
        cli[key.strip()] = value
    cli.update({k: v for k, v in (extra or {}).items() if v is not None})
    config = getattr(args, "config", None)
    return load_settings(config_file=env.path(config) if config else None, env=env.env, cli=cli)


def print_json(env: Environment, obj: Any) -> None:
    env.stdout.write(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    env.stdout.flush()


def parse_time(value: str) -> float:
    """ISO-8601 (``2026-11-30T13:00:00Z``) or UNIX seconds → UNIX seconds."""
    try:
        return float(value)
    except ValueError:
        pass
    try:
        t = _dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise UserError(f"cannot parse time {value!r}", "use ISO-8601 (2026-11-30T13:00:00Z) or UNIX seconds") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.timezone.utc)
    return t.timestamp()
