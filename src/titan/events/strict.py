"""Strict JSON for everything Titan writes: no ``NaN``/``Infinity`` tokens, ever.

JSON has no non-finite numbers; Python's ``json`` writes ``NaN`` by default, which jq,
JavaScript, Go and most log pipelines reject. Titan writes a non-finite float as the
string ``"nan"``, ``"inf"`` or ``"-inf"`` (what ``str(float)`` gives, and what
``float()`` reads back), so a reader that does ``float(value)`` keeps working and a strict
parser accepts the line. Event schema version 2 guarantees this (docs/events.md).

Cost: one ``json.dumps``; only a value that holds a non-finite float is copied (one walk).
"""

from __future__ import annotations

import json
import math
from typing import Any, Callable

__all__ = ["NONFINITE", "finite", "dumps", "loads_strict", "StrictJSONError"]

#: The strings that stand for non-finite numbers in Titan's JSON.
NONFINITE = ("nan", "inf", "-inf")


class StrictJSONError(ValueError):
    """A text holds ``NaN``, ``Infinity`` or ``-Infinity`` (not JSON)."""


def finite(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by ``"nan"``/``"inf"``/``"-inf"``.

    Walks dicts, lists and tuples (tuples become lists); returns ``obj`` itself when
    nothing had to change. Never raises.
    """
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else ("nan" if obj != obj else ("inf" if obj > 0 else "-inf"))
    if isinstance(obj, dict):
        out = {k: finite(v) for k, v in obj.items()}
        return obj if all(out[k] is v for k, v in obj.items()) else out
    if isinstance(obj, (list, tuple)):
        items = [finite(v) for v in obj]
        return obj if isinstance(obj, list) and all(a is b for a, b in zip(items, obj)) else items
    return obj


def dumps(obj: Any, *, default: Callable[[Any], Any] | None = None, **kw: Any) -> str:
    """``json.dumps`` that never writes a non-finite token (see the module docstring).

    ``default`` results are made finite too (a tensor's ``.item()`` can be NaN).
    Raises ``TypeError`` for values ``default`` cannot convert, like ``json.dumps``.
    """
    dflt = (lambda o: finite(default(o))) if default is not None else None
    try:
        return json.dumps(obj, default=dflt, allow_nan=False, **kw)
    except ValueError:  # a non-finite float somewhere: copy with strings, once
        return json.dumps(finite(obj), default=dflt, allow_nan=False, **kw)


def _refuse(token: str) -> Any:
    raise StrictJSONError(f"not strict JSON: {token}")


def loads_strict(text: str | bytes) -> Any:
    """Parse like a strict JSON parser: ``NaN``/``Infinity`` raise ``StrictJSONError``."""
    return json.loads(text, parse_constant=_refuse)
