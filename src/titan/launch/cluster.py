"""What ``titan run`` does for a job of several nodes: know the storage, host the replica server.

* **The storage probe, every rendezvous round.** Once a round has formed, every node's
  ``titan run`` writes a token into the checkpoint folder and reads everybody's, through
  the round's store (values signed with the job secret): the folder is shared, node-local
  or partly shared (``titan.checkpoint.domains``). The verdict goes into ``run.json``
  (``storage``), a ``launcher.storage`` event, the start line, and the workers'
  environment (``TITAN_STORAGE_VIEW``), so their checkpointer needs no probe of its own.
  Node-local storage with ``checkpoint.replicate=off`` ends the launch on every node with
  a :class:`StorageRefused` (exit 2 + hint) before any worker starts.
* **The replica server** (``titan.replica``): a thread of this process, listening on the
  node's listen address, keeping the buddy copies other nodes send (``checkpoint.replicate``:
  on this node's disk under ``<checkpoints>/.replicas/<node>``, or in memory), exporting this
  node's checkpoint folder read-only. It outlives worker restarts. The workers get its
  address and the replication key (derived from the job secret) in their environment.
* **Lost nodes, seen by the survivors.** Each round the nodes also exchange who they are: a
  random *incarnation* per ``titan run`` process and the newest step committed in their own
  checkpoint folder. A node id that was in this node's previous round and now comes back
  with another incarnation (its launcher died and was started again: a replacement node) or
  does not come back at all was lost; the survivors write ``launcher.node_lost`` naming it,
  with what its folder holds now (``committed: null`` is an empty disk — its shards come
  from the buddy copies). The same exchange agrees the round's job-wide *attempt* — one more
  than the highest any member ran before (a replacement starts from nothing) — and hands it
  to the workers (``TITAN_ATTEMPT``): every rank of one generation carries one attempt number,
  which the run's accounting (``titan.sla``) counts by.
* **The cluster-wide ledger** (``titan.launch.ledger_sync``): before each join, after each
  round and when ``titan run`` ends, this node publishes its strikes into the job's
  rendezvous store (sealed with the job secret) and merges every node's into its local
  ledger; a node over its strike limit by what the job knows stays out of the next round
  (``node.excluded``, exit 2 — with ``--nnodes MIN:MAX`` a spare takes its place).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import secrets
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, MutableMapping

from titan.checkpoint.domains import StorageView, probe_storage
from titan.checkpoint.layout import refuse_unreplicated, replication_mode
from titan.errors import UserError
from titan.settings.env import (TITAN_ATTEMPT, TITAN_REPLICA_ENDPOINT, TITAN_REPLICA_EXPORT, TITAN_REPLICA_KEY,
                                TITAN_STORAGE_VIEW)

__all__ = ["ClusterServices", "ClusterRefused", "StorageRefused", "NodeExcluded", "store_exchange", "PROBE_PURPOSE"]

log = logging.getLogger(__name__)

PROBE_PURPOSE = "titan.storage.probe.v1"
_PROBE_WAIT_S = 60.0


class ClusterRefused(UserError):
    """The job's nodes refuse to go on together (raised inside the rendezvous, before workers start)."""


class StorageRefused(ClusterRefused):
    """Several nodes keep checkpoints node-locally and nothing replicates them."""


class NodeExcluded(ClusterRefused):
    """This node is over its strike limit by the cluster-wide ledger: it does not join."""


def store_exchange(store: Any, rank: int, world: int, signer: Any, context: str,
                   timeout_s: float = _PROBE_WAIT_S) -> Callable[[str, Any], list[Any]]:
    """An ``exchange`` for :func:`probe_storage` over a rendezvous round's store: each value
    is sealed with the job's signer and opened (verified) before it is parsed."""
    def exchange(tag: str, value: Any) -> list[Any]:
        prefix = f"titan/storage/{tag}/"
        store.set(prefix + str(rank), signer.seal(PROBE_PURPOSE, json.dumps(value).encode(), context=context))
        keys = [prefix + str(r) for r in range(world)]
        store.wait(keys, _dt.timedelta(seconds=timeout_s))
        return [json.loads(signer.open(PROBE_PURPOSE, bytes(store.get(k)), context=context)) for k in keys]
    return exchange


class ClusterServices:
    """The storage probe (a rendezvous hook) and the replica server of one ``titan run``.

    ``record(updates)`` merges into ``run.json``; ``emit`` is the launcher's event writer;
    ``say`` prints one line on the terminal (or nothing).
    """

    def __init__(self, *, run_id: str, node: str, settings: Any, security: Any, root: Path, multi_node: bool,
                 record: Callable[[Mapping[str, Any]], None], emit: Callable[..., None],
                 say: Callable[[str], None] | None = None, nnodes: tuple[int, int] = (1, 1)) -> None:
        self.run_id, self.node, self.settings, self.security = run_id, node, settings, security
        self.root = Path(root).resolve()
        self.multi_node = multi_node
        self.record, self.emit, self.say = record, emit, say
        self.view: StorageView | None = None
        self.server: Any = None
        self._said: str | None = None
        self.incarnation = secrets.token_hex(8)
        self._base_store: Any = None  # the rendezvous store (outlives rounds): the ledger's
        self.ledger_sync = self._make_ledger_sync()
        self._members: dict[str, str] = {}  # node id -> incarnation, as of the previous round
        self.attempt: int | None = None  # the job-wide attempt of the last round this node joined
        self.nnodes = nnodes  # --nnodes MIN:MAX
        self._round_nodes: int | None = None  # nodes in the previous round

    # --- the replica server -----------------------------------------------------------
    @property
    def replicate(self) -> str:
        return self.settings.checkpoint.replicate

    def wants_server(self) -> bool:
        return self.multi_node and self.replicate != "off" and self.security.secret is not None

    @contextlib.contextmanager
    def serving(self, env: MutableMapping[str, str]) -> Iterator["ClusterServices"]:
        """Start the replica server (when the job can need one) and put its address and the
        replication key into ``env``, the workers' environment; stop it on the way out, after
        a last ledger sync (bounded by the store timeout)."""
        try:
            with self._serve(env):
                yield self
        finally:
            # On this thread, not a daemon one: a daemon thread still inside TCPStore's C++
            # connect when the interpreter finalises is killed by a forced unwind, and the
            # launcher aborts (SIGABRT, "terminate called without an active exception") —
            # seen when the host node's store went away first. Each store call is bounded by
            # the sync's own store timeout, so this cannot hang.
            if self.ledger_sync is not None and self._base_store is not None:
                self.sync_ledger(when="at the end")

    @contextlib.contextmanager
    def _serve(self, env: MutableMapping[str, str]) -> Iterator["ClusterServices"]:
        if not self.wants_server():
            yield self
            return
        from titan.replica import DiskStore, MemoryStore, ReplicaServer, replica_key

        key = replica_key(self.security.secret.signer(), self.run_id)
        if self.replicate == "memory":
            store: Any = MemoryStore()
            where = "memory"
        else:
            store = DiskStore(self.root / ".replicas" / self.node, fsync=self.settings.checkpoint.fsync)
            where = str(self.root / ".replicas" / self.node)
        try:
            self.server = ReplicaServer(store, key=key, context=self.run_id, addr=self.security.listen.addr,
                                        exports={"ckpt": self.root}, node=self.node).start()
        except OSError as e:
            self.emit("launcher.replica", f"replica server did not start on {self.security.listen.addr}: {e}",
                      level="warning", data={"error": str(e)})
            yield self
            return
        env.update({TITAN_REPLICA_ENDPOINT: self.server.endpoint, TITAN_REPLICA_KEY: key.hex(),
                    TITAN_REPLICA_EXPORT: str(self.root)})
        self.emit("launcher.replica", f"replica server on {self.server.endpoint} (buddy copies in {where})",
                  data={"endpoint": self.server.endpoint, "store": store.kind, "where": where})
        try:
            yield self
        finally:
            self.server.close()

    # --- the cluster-wide ledger --------------------------------------------------------
    def _make_ledger_sync(self) -> Any:
        if not (self.multi_node and self.settings.watchdog.enabled and getattr(self.security, "secret", None)):
            return None
        from titan.launch.ledger_sync import LedgerSync
        from titan.ledger import ledger_from_settings

        try:
            led = ledger_from_settings(self.settings)
        except Exception as e:  # noqa: BLE001 - an unreadable ledger must not stop a launch
            log.warning("node ledger unavailable (%s); strikes are not shared", e)
            return None
        return LedgerSync(led, self.security.secret.signer(), scope=self.run_id, node=self.node)

    def sync_ledger(self, store: Any = None, *, when: str) -> dict[str, Any] | None:
        """Publish and merge strikes through ``store`` (default: the last rendezvous store);
        ``launcher.ledger`` when something was learned. Never raises: a gone store is logged."""
        store = store if store is not None else self._base_store
        if self.ledger_sync is None or store is None:
            return None
        try:
            res = self.ledger_sync.sync(store)
        except Exception as e:  # noqa: BLE001 - the ledger is best effort; the local cache stays
            # At the end the host's store is often gone already (it left first): not a problem.
            (log.info if when == "at the end" else log.warning)("cluster ledger sync (%s) failed: %s", when, e)
            return None
        if res["merged"] or res["rejected"] or when == "before join":  # a join is worth a line on the timeline
            self.emit("launcher.ledger", f"cluster ledger ({when}): {res['merged']} new strike(s) from "
                      f"{', '.join(n for n in res['nodes'] if n != self.node) or 'nobody'}"
                      + (f"; rejected {', '.join(res['rejected'])}" if res["rejected"] else ""),
                      level="warning" if res["rejected"] else "info", data={**res, "when": when})
        return res

    def before_join(self, handler: Any) -> None:
        """Rendezvous hook: learn the job's strikes; a node over its limit stays out (``NodeExcluded``)."""
        self._base_store = getattr(handler, "_store", None)
        if self.sync_ledger(when="before join") is None:
            return
        led = self.ledger_sync.ledger
        if not led.is_excluded(self.node):
            return
        from titan.ledger.explain import explain_exclusion

        why = explain_exclusion(led, self.node)
        msg = f"{why.message(only_node=False)} (by the cluster-wide ledger); it does not join"
        self.emit("node.excluded", msg, level="error", data={**why.to_dict(), "when": "before join", "by": "cluster"})
        raise NodeExcluded(msg, why.hint())

    # --- the storage probe ------------------------------------------------------------
    def after_join(self, info: Any, handler: Any) -> None:
        """Rendezvous hook: probe the checkpoint folder with the round's nodes (collective)."""
        rnd = getattr(getattr(handler, "_state_holder", None), "state", None)
        rnd = getattr(rnd, "round", None)
        if int(info.world_size) == 1:  # one node: nothing to probe or agree (no file, no store traffic)
            self.attempt = 0 if self.attempt is None else self.attempt + 1
            os.environ[TITAN_ATTEMPT] = str(self.attempt)
            lost = self._note_members([{"node": self.node, "incarnation": self.incarnation}], rnd)
            self._note_size(1, lost, rnd)
            self._publish(StorageView(str(self.root), (self.node,), ((0,),)), rnd)
            return
        context = f"{handler.get_run_id()}:{rnd}"
        exchange = store_exchange(info.store, int(info.rank), int(info.world_size),
                                  self.security.secret.signer(), context)
        view = probe_storage(self.root, int(info.rank), self.node, exchange)
        me = {"node": self.node, "incarnation": self.incarnation, "committed": self._newest_committed(),
              "attempt": 0 if self.attempt is None else self.attempt + 1}
        members = exchange("member", me)
        self._note_size(int(info.world_size), self._note_members(members, rnd), rnd)
        self._base_store = getattr(handler, "_store", self._base_store)
        self.sync_ledger(when="after the round")
        self.attempt = max(int(m.get("attempt") or 0) for m in members if isinstance(m, dict))
        os.environ[TITAN_ATTEMPT] = str(self.attempt)  # this round's workers inherit it
        self._publish(view, rnd)

    def _newest_committed(self) -> int | None:
        from titan.checkpoint.manifest import list_committed

        try:
            done = list_committed(self.root)
        except OSError:
            return None
        return done[-1][0] if done else None

    def _note_size(self, n: int, lost: list[str], rnd: Any) -> None:
        """``launcher.world`` and ``run.json`` → ``elastic`` when a round has fewer nodes than the
        one before (a node lost, no spare to take its place): the job goes on smaller — at
        MIN or above — with its state resharded from the last checkpoint (DCP)."""
        lo, hi = self.nnodes
        prev, self._round_nodes = self._round_nodes, n
        state = {"nodes": n, "min": lo, "max": hi, "at_min": n == lo, "round": rnd}
        if prev is None or n >= prev:
            self.record({"elastic": {**state, "previous": prev}})
            return
        gone = [x for x in lost if x != self.node]
        where = "MIN" if n == lo else f"{n} (MIN {lo})"
        msg = (f"continuing at {where}: {n} of {hi} node{'s' if hi > 1 else ''} (was {prev})"
               + (f"; {', '.join(gone)} lost and no spare took {'its' if len(gone) == 1 else 'their'} place"
                  if gone else "") + "; the model state is resharded from the last checkpoint")
        self.record({"elastic": {**state, "previous": prev, "shrunk": True, "lost": gone}})
        self.emit("launcher.world", msg, level="warning", data={**state, "previous": prev, "lost": gone})
        if self.say is not None:
            self.say(f"titan run: {msg}")

    def _note_members(self, members: list[Any], rnd: Any) -> list[str]:
        """``launcher.node_lost`` for each node of the previous round that was replaced or is gone;
        returns their ids."""
        lost = []
        now = {str(m["node"]): m for m in members if isinstance(m, dict) and "node" in m}
        for node, inc in sorted(self._members.items()):
            if node == self.node:
                continue
            m = now.get(node)
            if m is not None and m.get("incarnation") == inc:
                continue
            how = "gone" if m is None else "replaced"
            lost.append(node)
            held = None if m is None else m.get("committed")
            disk = "" if m is None else (f"; its checkpoint folder holds step {held}" if held is not None else
                                         "; its checkpoint folder is empty (a new disk)")
            self.emit("launcher.node_lost",
                      f"node {node} was lost since the last round: "
                      f"{'a new titan run joined under its id' if m else 'it did not rejoin'}{disk}",
                      level="warning", data={"node": node, "how": how, "round": rnd, "committed": held,
                                             "previous_incarnation": inc,
                                             "incarnation": None if m is None else m.get("incarnation")})
        self._members = {n: str(m.get("incarnation")) for n, m in now.items()}
        return lost

    def _publish(self, view: StorageView, rnd: Any) -> None:
        self.view = view
        mode = replication_mode(self.replicate, not view.shared)
        served = self.server.endpoint if self.server is not None else None
        data = {**view.to_dict(), "round": rnd, "replicate": mode, "replica_server": served}
        line = view.describe() + (f"; buddy copies on ({mode})" if mode != "off" else "")
        self.record({"storage": data})
        try:
            refuse_unreplicated(view, self.replicate)
        except UserError as e:
            self.emit("launcher.storage", f"refused: {e.message}", level="error", data={**data, "refused": True})
            raise StorageRefused(e.message, e.hint) from None
        if mode != "off" and served is None:
            e = StorageRefused(f"{view.describe()}: the buddy copies need the replica server, which is not "
                               "running on this node", "see the launcher.replica event in this run directory")
            self.emit("launcher.storage", f"refused: {e.message}", level="error", data={**data, "refused": True})
            raise e
        os.environ[TITAN_STORAGE_VIEW] = json.dumps(view.to_dict())  # this round's workers inherit it
        self.emit("launcher.storage", line, data=data)
        if self.say is not None and line != self._said:
            self._said = line
            self.say(line)

    def describe_unprobed(self) -> dict[str, Any]:
        """What ``run.json`` says when no probe can run (stock torch rendezvous)."""
        return {"path": str(self.root), "kind": "unknown", "probed_by": "the ranks (insecure rendezvous)"}
