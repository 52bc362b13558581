"""Where a job's checkpoint files live: shared by every rank, or one storage domain per node.

Decided once per worker attempt (collective, in ``Checkpointer``'s group set-up): each rank
says its node, its node's replica server and the storage probe ``titan run`` made for this
rendezvous round (``TITAN_STORAGE_VIEW``); when that probe is missing or was made for
another folder, the ranks probe the folder themselves (``titan.checkpoint.domains``).
With several domains the checkpoint is written node-locally and each domain's files are
replicated to the next domain (its *buddy*) — ``titan.checkpoint.nodelocal``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from titan.checkpoint.domains import StorageView, probe_storage
from titan.errors import UserError
from titan.settings.env import TITAN_REPLICA_ENDPOINT, TITAN_REPLICA_EXPORT, TITAN_REPLICA_KEY, TITAN_STORAGE_VIEW

if TYPE_CHECKING:
    from titan.checkpoint.checkpointer import Checkpointer

__all__ = ["Layout", "compute_layout", "replication_mode", "refuse_unreplicated", "REPLICA_PREFIX"]

log = logging.getLogger(__name__)

#: Set ids of checkpoint replicas on a buddy's server: ``ckpt/<step dir>/rank<r>``.
REPLICA_PREFIX = "ckpt"


def replication_mode(setting: str, node_local: bool) -> str:
    """``off``, ``disk`` or ``memory`` for ``checkpoint.replicate`` and the storage found."""
    if not node_local or setting == "off":
        return "off"
    return "disk" if setting == "auto" else setting


def refuse_unreplicated(view: StorageView, setting: str) -> None:
    """``UserError`` (exit 2) when several nodes keep checkpoints node-locally with no replication."""
    if view.shared or setting != "off":
        return
    raise UserError(
        f"{view.describe()}, and checkpoint.replicate=off: a lost node would take its shards with it and "
        "every save would miss the other nodes' files",
        "put checkpoint.dir on storage every node shares, or replicate to a buddy node: "
        "--set checkpoint.replicate=auto (default; disk) or =memory (docs/checkpoint.md)")


@dataclasses.dataclass(frozen=True)
class Layout:
    """Ranks, their nodes, their storage domains and where each node's replica server listens."""

    rank: int
    nodes: tuple[str, ...]
    domains: tuple[tuple[int, ...], ...]
    endpoints: tuple[str | None, ...]
    exports: tuple[str | None, ...]
    replicate: str
    source: str  # "launcher" (titan run's probe), "probe" (the ranks' own) or "single"
    path: str

    @property
    def node_local(self) -> bool:
        return len(self.domains) > 1

    @property
    def domain(self) -> int:
        return self.domain_of(self.rank)

    def domain_of(self, rank: int) -> int:
        for k, d in enumerate(self.domains):
            if rank in d:
                return k
        raise KeyError(rank)

    def leader(self, k: int) -> int:
        return min(self.domains[k])

    @property
    def is_leader(self) -> bool:
        return self.rank == self.leader(self.domain)

    @property
    def leaders(self) -> list[int]:
        return [self.leader(k) for k in range(len(self.domains))]

    def buddy(self, k: int) -> int:
        return (k + 1) % len(self.domains)

    def endpoint_of(self, k: int) -> str | None:
        """The replica server of domain ``k`` (its leader's node)."""
        return self.endpoints[self.leader(k)]

    def name_of(self, k: int) -> str:
        """The domain's nodes, e.g. ``node1`` or ``a+b``."""
        return "+".join(sorted({self.nodes[r] for r in self.domains[k]}))

    def to_dict(self) -> dict[str, Any]:
        return {"storage": "node-local" if self.node_local else "shared", "source": self.source,
                "domains": [self.name_of(k) for k in range(len(self.domains))], "replicate": self.replicate,
                "path": self.path}


def replica_key_from_env() -> bytes | None:
    raw = os.environ.get(TITAN_REPLICA_KEY, "")
    try:
        return bytes.fromhex(raw) if raw else None
    except ValueError:
        return None


def compute_layout(ck: "Checkpointer", group: Any) -> Layout:
    """Collective on ``group`` (every rank): the layout for ``ck.root``. Raises ``UserError``
    when the folder is node-local and replication is off or impossible (no replica servers)."""
    from titan.checkpoint.collectives import gather_json, world_of

    root = str(Path(ck.root).resolve())
    if world_of(group) == 1:  # the replica server (if any) still serves a job that went on at MIN
        return Layout(0, (ck.ctx.node,), ((0,),), (os.environ.get(TITAN_REPLICA_ENDPOINT) or None,),
                      (os.environ.get(TITAN_REPLICA_EXPORT) or None,), "off", "single", root)
    view_raw = os.environ.get(TITAN_STORAGE_VIEW, "")
    view = None
    if view_raw:
        try:
            view = StorageView.from_dict(json.loads(view_raw))
        except (ValueError, KeyError, TypeError):
            view = None
    mine = {"node": ck.ctx.node, "endpoint": os.environ.get(TITAN_REPLICA_ENDPOINT) or None,
            "export": os.environ.get(TITAN_REPLICA_EXPORT) or None,
            "view": view.to_dict() if view is not None and _same_path(view.path, root) else None}
    info = gather_json(mine, group)
    nodes = tuple(str(i["node"]) for i in info)
    views = [i["view"] for i in info]
    domains: tuple[tuple[int, ...], ...] | None = None
    source = "launcher"
    if all(v is not None and v == views[0] for v in views):
        lv = StorageView.from_dict(views[0])
        if set(nodes) <= set(lv.members):
            by_node = {m: lv.domain_of(i) for i, m in enumerate(lv.members)}
            groups: dict[int, list[int]] = {}
            for r, n in enumerate(nodes):
                groups.setdefault(by_node[n], []).append(r)
            domains = tuple(sorted((tuple(g) for g in groups.values()), key=lambda d: d[0]))
    if domains is None:  # no (agreeing) launcher probe for this folder: probe it from the ranks
        source = "probe"
        pv = probe_storage(root, ck.rank, nodes[ck.rank], lambda tag, v: gather_json(v, group))
        domains = pv.domains
        view = pv
    lay_view = StorageView(root, tuple(f"{nodes[r]}/rank{r}" for r in range(len(nodes))), domains)
    refuse_unreplicated(lay_view, ck.cfg.replicate)
    mode = replication_mode(ck.cfg.replicate, len(domains) > 1)
    endpoints = tuple(i["endpoint"] for i in info)
    if mode != "off":
        missing = sorted({nodes[r] for d in domains for r in [min(d)] if not endpoints[r]})
        if missing or replica_key_from_env() is None:
            raise UserError(f"{lay_view.describe()}; replication needs titan run's replica server on every node "
                            f"(none on {', '.join(missing) or 'this node: no replication key'})",
                            "launch with titan run (it starts one per node), or share checkpoint.dir")
    return Layout(ck.rank, nodes, domains, endpoints, tuple(i["export"] for i in info), mode, source, root)


def _same_path(a: str, b: str) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return a == b
