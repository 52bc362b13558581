"""Node-local folders for network-namespace "nodes": each node sees its own folder at one path.

On a real cluster every node has its own disk at the same path (``/local``); on one machine a
mount namespace per node gives the same picture: :func:`private_prefix` wraps a command so it
runs in node ``i``'s network namespace *and* with ``backing`` bind-mounted over ``at``
(``ip netns exec`` already gives the process its own mount namespace, with mounts that do not
propagate back), so the other nodes and the host keep seeing what is really at ``at``. The
host reads node ``i``'s files at ``backing``. Deleting ``backing`` is losing the node's disk.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Sequence

__all__ = ["private_prefix", "node_folder"]


def node_folder(base: Path, i: int) -> Path:
    """Where the host keeps node ``i``'s private folder under ``base``."""
    return base / f"node{i}-private"


def private_prefix(topo: object, i: int, backing: Path, at: Path) -> list[str]:
    """Prepend to a command to run it inside node ``i`` with ``backing`` seen at ``at``.

    ``topo`` is a :class:`titan.chaos.netns.Topology` (or ``None``: a mount namespace only,
    by ``unshare --mount``). Both folders are created by the wrapper; needs root.
    """
    script = (f"mkdir -p {shlex.quote(str(backing))} {shlex.quote(str(at))} && "
              f"mount --bind {shlex.quote(str(backing))} {shlex.quote(str(at))} && exec \"$@\"")
    inner: Sequence[str] = ["sh", "-c", script, "sh"]
    if topo is None:
        return ["unshare", "--mount", "--propagation", "private", *inner]
    return [*topo.exec_prefix(i), *inner]  # type: ignore[attr-defined]
