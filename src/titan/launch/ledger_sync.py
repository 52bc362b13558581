"""A cluster-wide node ledger: every node's strikes visible to every node of the job.

Each node's ledger stays a local SQLite file (single writer, never on NFS: a *cache*). What a
node knows about itself is published into the job's rendezvous store — the agent's store,
which outlives worker restarts and rendezvous rounds — as one value per node, sealed with
the job secret (``titan.security``), so a process that can write the store but has no secret
cannot add or remove a strike; every node reads all of them and merges them into its cache.
Values are scoped by the job family (the run id: a Slurm requeue keeps it), so unrelated jobs
never strike each other, and they are kept across job restarts by the nodes' caches: a node
that comes back republishes what it knows, a replacement with an empty disk learns its
strikes from the others.

When: before each join (so a node over its limit stays out of the round: ``excluded``),
after each round (``titan.launch.cluster``), and when ``titan run`` ends. Cost per sync: a
short-lived store connection, two ``set`` and one ``get`` per node of the job, a few SQLite rows.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Iterable

__all__ = ["LedgerSync", "LEDGER_PURPOSE"]

log = logging.getLogger(__name__)

LEDGER_PURPOSE = "titan.ledger.strikes.v1"


class LedgerSync:
    """Publish this node's strikes and merge everyone's, through one store (module doc)."""

    def __init__(self, ledger: Any, signer: Any, *, scope: str, node: str) -> None:
        self.ledger, self.signer, self.scope, self.node = ledger, signer, scope, node
        self._prefix = f"titan/ledger/{scope}"

    def _mine(self) -> list[dict[str, Any]]:
        return [{"node": s.node, "kind": s.kind, "t": s.t, "run": s.run, "detail": s.detail}
                for s in self.ledger.strikes(self.node)]

    def sync(self, store: Any) -> dict[str, Any]:
        """Publish, then merge every node's published strikes into the local cache.

        Returns ``{"nodes": [...], "merged": n, "rejected": [...]}``; a value that does not
        open with the job secret is skipped and named in ``rejected``. Anyone who reaches the
        store may overwrite or delete any key, so only ``get``/``set``/``check`` are used (an
        ``add`` on planted bytes breaks the connection), over a connection of its own with a
        short timeout when the store is a TCPStore (the agent's own is never put at risk).
        Raises what the store raises (the caller logs it)."""
        store = _own_connection(store)
        me = f"{self._prefix}/node/{self.node}"
        # What the store already says about me (an earlier life of this node id) comes first.
        merged = self._merge(self._read(store, me, []))
        store.set(me, self.signer.seal(LEDGER_PURPOSE, json.dumps(self._mine()).encode(), context=self.scope))
        rejected: list[str] = []
        directory = f"{self._prefix}/nodes"
        listed = self._read_json(store, directory, rejected, what="the node list")
        nodes = sorted({self.node, *(str(n) for n in (listed if isinstance(listed, list) else []))})
        if self.node not in (listed or []):
            store.set(directory, self.signer.seal(LEDGER_PURPOSE, json.dumps(nodes).encode(),
                                                  context=self.scope + "/nodes"))
        for who in nodes:
            if who != self.node:
                merged += self._merge(self._read(store, f"{self._prefix}/node/{who}", rejected, who=who))
        return {"nodes": nodes, "merged": merged, "rejected": rejected}

    def _read_json(self, store: Any, key: str, rejected: list[str], *, what: str) -> Any:
        if not store.check([key]):
            return None
        try:
            return json.loads(self.signer.open(LEDGER_PURPOSE, bytes(store.get(key)), context=self.scope + "/nodes"))
        except Exception as e:  # noqa: BLE001 - a forged value is skipped, not trusted
            rejected.append(f"{what}: {type(e).__name__}")
            return None

    def _read(self, store: Any, key: str, rejected: list[str], *, who: str | None = None) -> list[dict[str, Any]]:
        if not store.check([key]):
            return []
        try:
            raw = self.signer.open(LEDGER_PURPOSE, bytes(store.get(key)), context=self.scope)
            rows = json.loads(raw)
        except Exception as e:  # noqa: BLE001 - a forged or stale value is skipped, not trusted
            rejected.append(f"{who or key}: {type(e).__name__}")
            log.warning("ledger value of %s rejected: %s", who or key, e)
            return []
        # A node vouches for its own strikes only: another node's rows in its value are ignored.
        owner = who or self.node
        return [r for r in rows if isinstance(r, dict) and r.get("node") == owner] if isinstance(rows, list) else []

    def _merge(self, rows: Iterable[dict[str, Any]]) -> int:
        return self.ledger.merge(rows)


def _own_connection(store: Any, timeout_s: float = 15.0) -> Any:
    """A client of its own to the same TCPStore, else ``store`` itself.

    A store whose host has gone is refused at once by the plain connect below; the client's
    own timeout covers a live store only. It is 15 s, not less: on this project's VM a
    TCPStore client's connect to a live loopback store takes 5.0 s about once in 30-50
    (measured 3/100 and 3/150 with the server in another process, any backend), so a 5 s
    timeout lost the sync now and then (a node that then missed another's exclusion)."""
    import datetime

    from torch.distributed import TCPStore

    if isinstance(store, TCPStore):
        import socket

        # A store whose host has already left refuses at once; TCPStore's client would retry
        # the refused connect for its whole timeout (seconds at the end of every job).
        with socket.create_connection((store.host, store.port), timeout=min(timeout_s, 1.0)):
            pass
        return TCPStore(store.host, store.port, is_master=False, wait_for_workers=False,
                        timeout=datetime.timedelta(seconds=timeout_s))
    return store
