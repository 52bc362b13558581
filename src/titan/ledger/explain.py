"""Why a node is excluded, in words a user can act on: which strikes, from which runs, how to clear.

Used by ``titan run`` when the node ledger keeps (or takes) a node out of a job: at the
start (the node declines to join) and during the run (the node went over its limit).
"""

from __future__ import annotations

import collections
import dataclasses
import shlex
import time
from pathlib import Path
from typing import Any

from titan.ledger.store import Ledger, Strike, default_ledger_path

__all__ = ["Exclusion", "explain_exclusion", "clear_command"]


def clear_command(node: str, ledger_path: Path) -> str:
    """The ``titan nodes --clear`` command line for ``node`` in the ledger at ``ledger_path``."""
    cmd = ["titan", "nodes", "--clear", node]
    if Path(ledger_path) != default_ledger_path():
        cmd += ["--ledger", str(ledger_path)]
    return shlex.join(cmd)


@dataclasses.dataclass(frozen=True)
class Exclusion:
    """A node's strikes within the ledger's window, grouped for a message."""

    node: str
    ledger: Path
    limit: int
    window_s: float
    strikes: tuple[Strike, ...]

    @property
    def runs(self) -> dict[str, int]:
        """Run id → strikes from that run (in order of the first strike)."""
        return dict(collections.Counter(s.run or "(no run)" for s in self.strikes))

    def summary(self) -> str:
        """``3 strikes within 24 h (limit 3): guard ×2 in run a, crash ×1 in run b``."""
        parts = []
        grouped: dict[tuple[str, str], int] = collections.Counter((s.kind, s.run or "(no run)") for s in self.strikes)
        for (kind, run), n in grouped.items():
            parts.append(f"{kind} ×{n} in run {run}")
        return (f"{len(self.strikes)} strike(s) within {_span(self.window_s)} (limit {self.limit}): "
                + ", ".join(parts))

    def message(self, *, only_node: bool) -> str:
        """One line: what happened to the node and the strikes behind it."""
        what = ("the only node of this job is excluded by the node ledger, so the job cannot run: "
                if only_node else f"node {self.node} is excluded by the node ledger: ")
        return f"{what}node {self.node} has {self.summary()}"

    def hint(self) -> str:
        """How to look and how to clear, with the ledger's path."""
        return (f"ledger {self.ledger}; list the strikes with `titan nodes --strikes"
                + (f" --ledger {shlex.quote(str(self.ledger))}`" if self.ledger != default_ledger_path() else "`")
                + f"; once the node is fixed, clear them with `{clear_command(self.node, self.ledger)}`")

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "ledger": str(self.ledger), "limit": self.limit, "window_s": self.window_s,
                "strikes": len(self.strikes),
                "strike_list": [{"kind": s.kind, "run": s.run, "t": s.t, "detail": s.detail} for s in self.strikes],
                "runs": self.runs, "clear": clear_command(self.node, self.ledger)}


def explain_exclusion(led: Ledger, node: str, *, now: float | None = None) -> Exclusion:
    """The strikes of ``node`` that count now (within the window). Cost: one small query."""
    since = (time.time() if now is None else now) - led.window_s
    strikes = tuple(s for s in led.strikes(node) if s.t >= since)
    return Exclusion(node, Path(led.path), led.limit, led.window_s, strikes)


def _span(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    return f"{seconds:g} s"
