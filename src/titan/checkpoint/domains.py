"""Which members of a job see the same checkpoint folder: the storage probe.

Every member (a node's ``titan run`` through the rendezvous store, or a rank through the
process group) writes a token file into the checkpoint folder, all token names are
exchanged, every member looks for every token, and what each saw is exchanged again.
Members that saw exactly each other's tokens form one *storage domain*: the folder is
**shared** when there is one domain, **node-local** when there are several (each node its
own disk, as on most clusters). A view that is not symmetric (a network file system whose
caches lag) is treated as fully node-local — the safe reading, since it turns replication
on. Nothing is read from another member's files but the presence of its token.

Cost: one small file write + unlink per member, two exchanges, one ``stat`` per member
(retried twice 0.2 s apart when a token is not visible yet). Standard library only.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from titan.security.paths import is_plain_name

__all__ = ["StorageView", "probe_storage", "TOKEN_PREFIX", "Exchange"]

TOKEN_PREFIX = ".titan-storage-"
#: ``exchange(tag, value) -> [every member's value, in member order]``: a collective.
Exchange = Callable[[str, Any], list[Any]]
_RETRIES = (0.2, 0.2)


@dataclasses.dataclass(frozen=True)
class StorageView:
    """The outcome of one probe: the members and which of them share the folder."""

    path: str
    members: tuple[str, ...]
    domains: tuple[tuple[int, ...], ...]
    consistent: bool = True

    @property
    def shared(self) -> bool:
        return len(self.domains) == 1

    @property
    def kind(self) -> str:
        """``shared`` (one domain), ``node-local`` (one per member) or ``partly shared``."""
        if self.shared:
            return "shared"
        return "node-local" if all(len(d) == 1 for d in self.domains) else "partly shared"

    def domain_of(self, member: int) -> int:
        for k, d in enumerate(self.domains):
            if member in d:
                return k
        raise KeyError(member)

    def domain_members(self, k: int) -> list[str]:
        return [self.members[i] for i in self.domains[k]]

    def describe(self) -> str:
        """One line for the start of ``titan run``."""
        if len(self.members) == 1:
            return f"checkpoints in {self.path} (one node: sharing not checked)"
        if self.shared:
            return f"checkpoints in {self.path}: shared by all {len(self.members)} nodes (every token seen everywhere)"
        groups = "; ".join("+".join(self.domain_members(k)) for k in range(len(self.domains)))
        lag = "" if self.consistent else " (views disagreed: treated as node-local)"
        return f"checkpoints in {self.path}: {self.kind} — {len(self.domains)} storage domains ({groups}){lag}"

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "kind": self.kind, "shared": self.shared, "members": list(self.members),
                "domains": [[self.members[i] for i in d] for d in self.domains], "consistent": self.consistent}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "StorageView":
        members = tuple(str(m) for m in d["members"])
        idx = {m: i for i, m in enumerate(members)}
        domains = tuple(tuple(idx[str(m)] for m in dom) for dom in d["domains"])
        return cls(str(d["path"]), members, domains, bool(d.get("consistent", True)))


def probe_storage(path: str | os.PathLike[str], me: int, ident: str, exchange: Exchange) -> StorageView:
    """Probe ``path`` as member ``me`` (named ``ident``) of the members ``exchange`` reaches.

    Collective: every member calls it at the same point. Creates ``path`` if needed.
    Raises ``OSError`` when the folder cannot be written (every member should then fail).
    """
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    token = f"{TOKEN_PREFIX}{secrets.token_hex(8)}"
    tfile = root / token
    fd = os.open(tfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, ident.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        entries = exchange("token", {"ident": ident, "token": token})
        members = tuple(str(e["ident"]) for e in entries)
        tokens = [str(e["token"]) for e in entries]
        seen = _seen(root, tokens, me)
        for pause in _RETRIES:
            if len(seen) == len(tokens):
                break
            time.sleep(pause)
            seen = _seen(root, tokens, me)
        views = [sorted(int(i) for i in v) for v in exchange("seen", sorted(seen))]
    finally:
        try:
            tfile.unlink()
        except FileNotFoundError:
            pass
    return _domains(str(root), members, views)


def _seen(root: Path, tokens: Sequence[str], me: int) -> set[int]:
    try:
        present = set(os.listdir(root))  # a listing revalidates a network file system's cache
    except OSError:
        present = set()
    out = {me}
    for i, t in enumerate(tokens):
        if is_plain_name(t) and t.startswith(TOKEN_PREFIX) and (t in present or (root / t).exists()):
            out.add(i)
    return out


def _domains(path: str, members: tuple[str, ...], views: list[list[int]]) -> StorageView:
    n = len(members)
    groups: dict[tuple[int, ...], list[int]] = {}
    consistent = True
    for i, v in enumerate(views):
        key = tuple(v)
        if i not in key or any(views[j] != v for j in key if 0 <= j < n):
            consistent = False
        groups.setdefault(key, []).append(i)
    if not consistent:  # asymmetric views: the safe reading is "nobody shares"
        return StorageView(path, members, tuple((i,) for i in range(n)), consistent=False)
    domains = tuple(sorted((tuple(sorted(g)) for g in groups.values()), key=lambda d: d[0]))
    return StorageView(path, members, domains)
