"""The node ledger: strikes per node id in a small SQLite file on a node-local path.

Single writer per file by construction: each node's ``titan run`` (its watchdog) writes
the ledger on its own disk, about its own node. SQLite's locking makes concurrent
``titan nodes`` readers (and a second ``titan run`` on the same machine, as in the
two-"nodes"-on-one-host tests) safe; do **not** put the file on NFS (SQLite locking is
unreliable there) — a shared ledger would need one writer (e.g. rank 0's node) instead.

A strike has a kind (``hang``, ``crash``, ``guard``, ``straggler``, ``manual``), a time
and the run it came from. A node is *excluded* when it has ``limit`` or more strikes
within ``window_s``; ``clear`` removes a node's strikes (``titan nodes --clear NODE``).
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

__all__ = ["Ledger", "NodeRecord", "Strike", "default_ledger_path", "KINDS"]

KINDS = ("hang", "crash", "guard", "straggler", "manual")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS strikes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    node TEXT NOT NULL,
    kind TEXT NOT NULL,
    t REAL NOT NULL,
    run TEXT NOT NULL DEFAULT '',
    detail TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS strikes_node_t ON strikes(node, t);
"""


def default_ledger_path() -> Path:
    """``$XDG_STATE_HOME/titan/ledger.sqlite`` (default ``~/.local/state/titan/ledger.sqlite``)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "titan" / "ledger.sqlite"


@dataclasses.dataclass(frozen=True)
class Strike:
    node: str
    kind: str
    t: float
    run: str
    detail: str


@dataclasses.dataclass(frozen=True)
class NodeRecord:
    """One node's standing: strikes in the window (by kind), total, excluded or not."""

    node: str
    strikes: int
    by_kind: dict[str, int]
    last_t: float
    excluded: bool


class Ledger:
    """Open (and create) the ledger at ``path``. Each call is one short transaction (~1 ms)."""

    def __init__(self, path: str | os.PathLike[str] | None = None, *, limit: int = 3, window_s: float = 86400.0) -> None:
        self.path = Path(path) if path else default_ledger_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.limit = limit
        self.window_s = window_s
        with self._conn() as c:
            c.executescript(_SCHEMA)

    def _conn(self) -> sqlite3.Connection:
        c = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
        c.execute("PRAGMA busy_timeout=10000")
        return c

    def add(self, node: str, kind: str, *, run: str = "", detail: str = "", t: float | None = None) -> int:
        """Record one strike; returns the node's strike count within the window afterwards."""
        if kind not in KINDS:
            raise ValueError(f"unknown strike kind {kind!r}; one of {', '.join(KINDS)}")
        now = time.time() if t is None else t
        c = self._conn()
        try:
            c.execute("INSERT INTO strikes(node, kind, t, run, detail) VALUES (?,?,?,?,?)", (node, kind, now, run, detail))
        finally:
            c.close()
        return self.count(node)

    def merge(self, rows: Iterable[Mapping[str, Any]]) -> int:
        """Add strikes learned from other nodes (``node``, ``kind``, ``t``, ``run``, ``detail``)
        unless the same (node, kind, t, run) is already here; unknown kinds and malformed rows
        are skipped. Returns how many were added. One transaction."""
        added = 0
        c = self._conn()
        try:
            c.execute("BEGIN")
            for r in rows:
                try:
                    node, kind, t = str(r["node"]), str(r["kind"]), float(r["t"])
                    run, detail = str(r.get("run", "")), str(r.get("detail", ""))[:2000]
                except (KeyError, TypeError, ValueError):
                    continue
                if kind not in KINDS or not node:
                    continue
                if c.execute("SELECT 1 FROM strikes WHERE node=? AND kind=? AND t=? AND run=?",
                             (node, kind, t, run)).fetchone():
                    continue
                c.execute("INSERT INTO strikes(node, kind, t, run, detail) VALUES (?,?,?,?,?)",
                          (node, kind, t, run, detail))
                added += 1
            c.execute("COMMIT")
        finally:
            c.close()
        return added

    def count(self, node: str, *, now: float | None = None) -> int:
        """Strikes of ``node`` within the window."""
        since = (time.time() if now is None else now) - self.window_s
        c = self._conn()
        try:
            return int(c.execute("SELECT COUNT(*) FROM strikes WHERE node=? AND t>=?", (node, since)).fetchone()[0])
        finally:
            c.close()

    def is_excluded(self, node: str) -> bool:
        """True when ``node`` has ``limit`` or more strikes within the window."""
        return self.count(node) >= self.limit

    def strikes(self, node: str | None = None) -> list[Strike]:
        """All strikes (of ``node``), oldest first."""
        c = self._conn()
        try:
            q = "SELECT node, kind, t, run, detail FROM strikes"
            rows = c.execute(q + " WHERE node=? ORDER BY t" if node else q + " ORDER BY t", (node,) if node else ()).fetchall()
        finally:
            c.close()
        return [Strike(*r) for r in rows]

    def nodes(self) -> list[NodeRecord]:
        """Every node with strikes, with its standing."""
        since = time.time() - self.window_s
        out: dict[str, dict[str, int]] = {}
        last: dict[str, float] = {}
        for s in self.strikes():
            last[s.node] = max(last.get(s.node, 0.0), s.t)
            if s.t >= since:
                out.setdefault(s.node, {}).setdefault(s.kind, 0)
                out[s.node][s.kind] += 1
            else:
                out.setdefault(s.node, {})
        return [NodeRecord(n, sum(k.values()), k, last[n], sum(k.values()) >= self.limit) for n, k in sorted(out.items())]

    def clear(self, node: str) -> int:
        """Delete every strike of ``node``; returns how many were removed."""
        c = self._conn()
        try:
            return int(c.execute("DELETE FROM strikes WHERE node=?", (node,)).rowcount)
        finally:
            c.close()

    def __iter__(self) -> Iterator[NodeRecord]:
        return iter(self.nodes())
