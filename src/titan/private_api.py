"""The one gate for torch internals Titan relies on (names that are not public API).

Each capability lists the private names it rests on as :class:`PrivateName` entries; before
it uses them it calls :func:`require`, which refuses with one clear line (``UserError``,
exit 2) when a name moved, and reports whether the running torch is one Titan was checked
against. ``tests/test_private_api.py`` imports every registered list, so a torch upgrade
that renames one fails loudly in ``make test`` instead of silently weakening a guarantee.
Cost: a few imports and ``getattr`` calls (the modules are imported by the caller anyway).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Iterable

from titan.errors import UserError

__all__ = ["PrivateName", "CHECKED_TORCH", "missing", "require", "torch_checked", "REGISTRY", "register"]

#: torch releases (major.minor) whose internals the listed names were read from and tested on.
CHECKED_TORCH = ("2.13",)

#: feature name → the private names it rests on (filled by the modules that use them).
REGISTRY: dict[str, tuple["PrivateName", ...]] = {}


@dataclasses.dataclass(frozen=True)
class PrivateName:
    """``module`` + dotted ``attr`` path (``Class.method``), and what Titan needs it for."""

    module: str
    attr: str
    why: str
    #: For attributes set in ``__init__`` (not on the class): a string the owning class's
    #: ``__init__`` source must contain.
    in_init_of: str | None = None

    def present(self) -> bool:
        try:
            obj = importlib.import_module(self.module)
        except ImportError:
            return False
        if self.in_init_of is not None:
            import inspect

            try:
                cls = _walk(obj, self.in_init_of)
                return f"self.{self.attr}" in inspect.getsource(cls.__init__)
            except (AttributeError, OSError, TypeError):
                return False
        try:
            _walk(obj, self.attr)
            return True
        except AttributeError:
            return False

    def __str__(self) -> str:
        owner = f"{self.in_init_of}." if self.in_init_of else ""
        return f"{self.module}.{owner}{self.attr}"


def _walk(obj: object, dotted: str) -> object:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def register(feature: str, names: Iterable[PrivateName]) -> tuple[PrivateName, ...]:
    """Record ``feature``'s private names (for the test) and return them."""
    REGISTRY[feature] = tuple(names)
    return REGISTRY[feature]


def torch_checked() -> tuple[str, bool]:
    """(torch version, whether its major.minor is one of ``CHECKED_TORCH``)."""
    import torch

    v = torch.__version__.split("+")[0]
    return v, ".".join(v.split(".")[:2]) in CHECKED_TORCH


def missing(names: Iterable[PrivateName]) -> list[PrivateName]:
    """The names that are not where Titan expects them."""
    return [n for n in names if not n.present()]


def require(names: Iterable[PrivateName], *, feature: str) -> None:
    """Refuse (``UserError``) when any of ``names`` moved in the running torch."""
    gone = missing(names)
    if gone:
        version, checked = torch_checked()
        raise UserError(
            f"torch {version} does not have {', '.join(map(str, gone))}, which Titan's {feature} rests on "
            f"({gone[0].why}); Titan was checked against torch {', '.join(CHECKED_TORCH)}"
            + ("" if checked else " only"),
            f"use torch {CHECKED_TORCH[-1]}.x, or a Titan release made for torch {version}")
