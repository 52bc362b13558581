"""One settings layer, one precedence: defaults < config file < ``TITAN_*`` env < CLI.

A section is a frozen, keyword-only dataclass that validates itself in
``__post_init__`` (raising ``titan.errors.UserError``). ``Settings`` holds one of each
registered section and checks cross-section invariants (the timeout hierarchy).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
import sys
import types
import typing
from pathlib import Path
from typing import Any, Callable, Mapping

from titan.errors import UserError
from titan.settings.env import PREFIX, PROCESS_VARS, TITAN_CONFIG, TITAN_SETTINGS_JSON, field_env_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = [
    "SECTIONS", "Settings", "register_section", "load_settings", "env_var_table",
    "field_env_var", "coerce", "settings_from_json", "require", "check_numbers", "fmt_number", "MAX_SECONDS", "MAX_NUMBER",
]

log = logging.getLogger(__name__)

SECTIONS: dict[str, type] = {}
_CROSS_CHECKS: list[Callable[["Settings"], None]] = []


#: Upper bound of every duration setting (``*_s``): 30 days. Larger values are typos, and
#: some (``inf``, ``1e15``) overflow ``timedelta``/``int`` conversions deep in torch.
MAX_SECONDS = 30 * 86400.0
#: Bound on the magnitude of every other number in a settings section.
MAX_NUMBER = 1e9


def _range_of(f: dataclasses.Field) -> tuple[float, float]:
    if "range" in f.metadata:
        lo, hi = f.metadata["range"]
        return float(lo), float(hi)
    if f.name.endswith("_s"):
        return 0.0, MAX_SECONDS
    return -MAX_NUMBER, MAX_NUMBER


def fmt_number(x: float) -> str:
    """``1,000,000`` for whole numbers, ``1e+15``/``0.25`` otherwise (ranges in hints)."""
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def check_numbers(section: Any) -> None:
    """Refuse a non-finite or out-of-range number in any field of a settings section.

    Every ``float``/``int`` field must be finite and within its range: ``metadata={"range":
    (lo, hi)}`` when the field gives one, else 0 … ``MAX_SECONDS`` for durations (``*_s``)
    and ± ``MAX_NUMBER`` for the rest. Runs before the section's own ``__post_init__``
    checks (``register_section`` arranges it). Raises ``UserError`` with the range in the hint.
    """
    hints = _hints(type(section))
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        base, _ = _unwrap_optional(hints.get(f.name))
        if value is None or isinstance(value, bool) or base not in (int, float):
            continue
        if not isinstance(value, (int, float)):
            continue
        lo, hi = _range_of(f)
        unit = " seconds" + (" (30 days)" if hi == MAX_SECONDS else "") if f.name.endswith("_s") else ""
        hint = f"give {f.name} within {fmt_number(lo)} … {fmt_number(hi)}{unit}"
        if isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"{f.name} = {value} is not a finite number", hint)
        if not lo <= value <= hi:
            raise UserError(f"{f.name} = {fmt_number(value)} is out of range", hint)


def register_section(name: str) -> Callable[[type], type]:
    """Class decorator: register a dataclass as settings section ``name``.

    The section's ``__post_init__`` is wrapped so that ``check_numbers`` runs first: no
    section can forget to refuse ``nan``, ``inf`` or an absurd magnitude.
    """

    def deco(cls: type) -> type:
        assert dataclasses.is_dataclass(cls), cls
        own = cls.__dict__.get("__post_init__")
        assert own is not None, f"settings section {name} needs a __post_init__ (validation)"

        def __post_init__(self: Any) -> None:
            check_numbers(self)
            own(self)

        __post_init__.__doc__ = own.__doc__
        cls.__post_init__ = __post_init__  # type: ignore[attr-defined]
        SECTIONS[name] = cls
        return cls

    return deco


def register_check(fn: Callable[["Settings"], None]) -> Callable[["Settings"], None]:
    """Register a cross-section invariant; it raises ``UserError`` when violated."""
    _CROSS_CHECKS.append(fn)
    return fn


def require(cond: bool, message: str, hint: str) -> None:
    """Raise ``UserError(message, hint)`` unless ``cond``; for ``__post_init__`` checks."""
    if not cond:
        raise UserError(message, hint)


def field_env_var(section: str, f: dataclasses.Field) -> str:
    return f.metadata.get("env") or field_env_name(section, f.name)


class Settings:
    """All sections; attribute access by section name (``settings.guard.spike_z``)."""

    def __init__(self, sections: Mapping[str, Any], sources: Mapping[str, str] | None = None) -> None:
        self._sections = dict(sections)
        self.sources = dict(sources or {})  # "section.field" -> where its value came from
        for fn in _CROSS_CHECKS:
            fn(self)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["_sections"][name]
        except KeyError:
            raise AttributeError(name) from None

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {name: _jsonable(dataclasses.asdict(sec)) for name, sec in self._sections.items()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def coerce(tp: Any, value: Any, where: str) -> Any:
    """Convert a file/env/CLI value to the field type ``tp``; ``UserError`` if impossible."""
    base, optional = _unwrap_optional(tp)
    if value is None or (optional and isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        if optional:
            return None
        raise UserError(f"{where}: a value is required", "give a value of the documented type")
    try:
        if base is bool:
            if isinstance(value, bool):
                return value
            s = str(value).strip().lower()
            if s in ("1", "true", "yes", "on"):
                return True
            if s in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if base is int:
            if isinstance(value, bool):
                raise ValueError(value)
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if base is float:
            if isinstance(value, bool):
                raise ValueError(value)
            return float(value)
        if base is str:
            return str(value)
        origin = typing.get_origin(base)
        if origin is tuple:
            (item_t, *_rest) = typing.get_args(base) or (str,)
            items = [v.strip() for v in value.split(",") if v.strip()] if isinstance(value, str) else list(value)
            return tuple(coerce(item_t, v, where) for v in items)
        if origin is dict:
            if isinstance(value, str):
                value = json.loads(value)
            if not isinstance(value, dict):
                raise ValueError(value)
            return dict(value)
    except (TypeError, ValueError, json.JSONDecodeError):
        name = getattr(base, "__name__", str(base))
        raise UserError(f"{where}: {value!r} is not a valid {name}", f"give a {name}") from None
    return value


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _read_file(path: Path) -> dict[str, Any]:
    from titan.inputs import read_text_file

    text = read_text_file(path, "settings file", "check the path given to --config or TITAN_CONFIG")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"settings file {path} is not valid TOML: {e}", "fix the file; see docs/settings.md for its format") from None
    return data


def load_settings(
    *,
    config_file: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    cli: Mapping[str, Any] | None = None,
) -> Settings:
    """Resolve every section: defaults < ``config_file`` < ``TITAN_*`` env < ``cli``.

    ``cli`` maps ``"section.field"`` to a value. ``TITAN_SETTINGS_JSON`` (set by
    ``titan run`` for workers) replaces defaults and file with the launcher's settings.
    Raises ``UserError`` on an unknown key, a bad value or a violated invariant.
    """
    env = os.environ if env is None else env
    values: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    sources: dict[str, str] = {}

    def put(section: str, key: str, value: Any, source: str) -> None:
        if section not in SECTIONS:
            raise UserError(f"{source}: unknown settings section {section!r}",
                            f"known sections: {', '.join(sorted(SECTIONS))}")
        cls = SECTIONS[section]
        hints = _hints(cls)
        names = {f.name for f in dataclasses.fields(cls)}
        if key not in names:
            raise UserError(f"{source}: unknown setting {section}.{key}",
                            f"known settings of [{section}]: {', '.join(sorted(names))}")
        values[section][key] = coerce(hints[key], value, f"{source}: {section}.{key}")
        sources[f"{section}.{key}"] = source

    launcher_json = env.get(TITAN_SETTINGS_JSON)
    if launcher_json:
        try:
            obj = json.loads(launcher_json)
        except json.JSONDecodeError:
            raise UserError(f"{TITAN_SETTINGS_JSON} is not valid JSON", "it is set by `titan run`; unset it") from None
        for section, kv in obj.items():
            if section in SECTIONS:
                for k, v in kv.items():
                    put(section, k, v, "launcher")
    else:
        path = config_file or env.get(TITAN_CONFIG)
        if path:
            data = _read_file(Path(path))
            for section, kv in data.items():
                if not isinstance(kv, dict):
                    raise UserError(f"{path}: {section!r} must be a [section] table",
                                    "write settings as [section] tables, e.g. [guard] spike_z = 6.0")
                for k, v in kv.items():
                    put(section, k, v, str(path))

    known_env = {}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            known_env[field_env_var(section, f)] = (section, f.name)
    for var, val in env.items():
        if not var.startswith(PREFIX):
            continue
        if var in known_env:
            section, key = known_env[var]
            put(section, key, val, f"environment {var}")
        elif var not in PROCESS_VARS:
            log.warning("ignoring unknown environment variable %s (not a Titan setting)", var)

    for dotted, val in (cli or {}).items():
        if val is None:
            continue
        section, _, key = dotted.partition(".")
        put(section, key, val, f"flag {dotted}")

    built = {}
    for section, cls in SECTIONS.items():
        try:
            built[section] = cls(**values[section])
        except UserError as e:
            raise UserError(f"[{section}] {e.message}", e.hint) from None
    return Settings(built, sources)


def settings_from_json(text: str) -> Settings:
    """Rebuild settings from ``Settings.to_json()`` output (as ``titan run`` hands them)."""
    return load_settings(env={TITAN_SETTINGS_JSON: text})


def env_var_table() -> list[tuple[str, str, str, str]]:
    """(variable, setting, type, default) for every field, for ``docs/settings.md``."""
    rows = []
    for section in sorted(SECTIONS):
        cls = SECTIONS[section]
        hints = _hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else "")
            tp = hints[f.name]
            tname = getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
            rows.append((field_env_var(section, f), f"{section}.{f.name}", tname, repr(default)))
    return rows
