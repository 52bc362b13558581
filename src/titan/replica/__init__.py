"""The replication transport: put a named blob set on a buddy node, fetch it back, checksummed.

One layer for every copy Titan keeps on another node — checkpoint shards of node-local
storage (``titan.checkpoint``) and per-step in-memory state. A :class:`ReplicaServer` runs
in each node's ``titan run`` (it outlives worker restarts) and keeps what it is sent in a
:class:`MemoryStore` or a :class:`DiskStore` on that node; workers talk to any node's
server with a :class:`ReplicaClient`. Every frame is signed with a key derived from the
job secret (:func:`replica_key`); blobs are CRC-32-checked at rest and on arrival.
Standard library only (no torch): ``docs/checkpoint.md`` ("Node-local storage").
"""

from __future__ import annotations

from titan.replica.client import ReplicaClient, parse_endpoint
from titan.replica.server import ReplicaServer
from titan.replica.stores import BlobInfo, BlobStore, DiskStore, MemoryStore
from titan.replica.wire import ReplicaError

__all__ = ["ReplicaServer", "ReplicaClient", "ReplicaError", "BlobInfo", "BlobStore", "MemoryStore", "DiskStore",
           "parse_endpoint", "replica_key", "KEY_PURPOSE"]

KEY_PURPOSE = "titan.replica.key.v1"


def replica_key(signer, run_id: str) -> bytes:  # noqa: ANN001 - titan.security.signing.Signer
    """The job's replication key: derived from the job secret for ``run_id``. A worker holds
    this key, never the secret; it authenticates replica traffic only."""
    return signer.derive(KEY_PURPOSE, context=run_id)
