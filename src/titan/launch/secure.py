"""``titan run``'s security plan: which rendezvous backend, which secret, which address.

Decided in ``prepare`` (before anything is written; a refusal is a ``UserError``, exit 2):

| ``--rdzv-backend`` | single node | multi-node |
|---|---|---|
| ``c10d`` (default) | ``titan-c10d``: signed state, stores bound | same; needs a shared secret |
| ``etcd-v2`` | ``titan-etcd-v2``: signed state, worker store bound | same; needs a shared secret |
| ``static`` | ``titan-static``: store bound (nothing unpickled) | refused: ``titan run`` has no node rank |
| ``etcd`` | refused: unsigned state, rank-0 worker store on every interface | refused |

``--insecure-rdzv`` runs torch's stock backend instead (what plain torchrun does) and says
what that risks. See docs/security.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator, Mapping, MutableMapping

from titan.errors import UserError
from titan.launch.listen import ListenPlan, plan_listen
from titan.security.secret import JobSecret, generate_secret, resolve_secret
from titan.settings.env import (TITAN_LISTEN_ADDR, TITAN_RDZV_SECRET, TITAN_RDZV_SECRET_FILE,
                                TITAN_STORE_PER_ROUND)

__all__ = ["SecurityPlan", "plan_security", "INSECURE_RISK", "DISABLE_SHARED_STORE_VAR"]

#: What ``--insecure-rdzv`` risks, in one line (help text, start line, event).
INSECURE_RISK = ("--insecure-rdzv: anyone who can reach the rendezvous port can run code as this user "
                 "on every node (torch unpickles the store's state)")
#: torch's switch that makes the rank-0 *worker* host the worker store (on every interface).
DISABLE_SHARED_STORE_VAR = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
_SECRET_HINT = ("give every node the same secret: --rdzv-secret-file FILE, or TITAN_RDZV_SECRET_FILE / "
                "TITAN_RDZV_SECRET (docs/security.md); --insecure-rdzv opts out")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SecurityPlan:
    """The rendezvous backend torchrun gets, the job secret, and the listen address."""

    backend: str
    torch_backend: str
    endpoint: str
    listen: ListenPlan
    secret: JobSecret | None
    insecure: bool
    fresh_store_per_round: bool

    @property
    def wrapped(self) -> bool:
        return self.torch_backend.startswith("titan-")

    def describe(self) -> list[str]:
        """Lines for the start of ``titan run`` (no secret in them)."""
        if self.insecure:
            auth = f"rendezvous NOT authenticated ({self.torch_backend}, stock torch); {INSECURE_RISK}"
        else:
            s = self.secret
            assert s is not None
            what = "rendezvous store bound, nothing unpickled" if self.torch_backend == "titan-static" \
                else "rendezvous state signed"
            auth = f"{what} ({self.torch_backend}; key id {s.key_id[:8]}, secret from {s.source})"
        return [auth, self.listen.describe()]

    def to_dict(self) -> dict[str, Any]:
        return {"rdzv_backend": self.backend, "torch_rdzv_backend": self.torch_backend, "endpoint": self.endpoint,
                "authenticated": not self.insecure, "key_id": self.secret.key_id if self.secret else None,
                "secret_source": self.secret.source if self.secret else None,
                "secret_warnings": list(self.secret.warnings) if self.secret else [],
                "worker_store": "fresh per round" if self.fresh_store_per_round else "one for the job",
                "listen": self.listen.to_dict()}

    def apply_env(self, env: MutableMapping[str, str], *, disable_shared_store: bool) -> None:
        """Workers' environment: data-plane interface, store mode; the secret removed."""
        for var in (TITAN_RDZV_SECRET, TITAN_RDZV_SECRET_FILE):
            env.pop(var, None)  # the workers never need it
        env.update(self.listen.data_plane)
        if self.wrapped:
            # The worker store lives in the agent, bound; torch's opt-out would move it to the
            # rank-0 worker, listening on every interface.
            env.pop(DISABLE_SHARED_STORE_VAR, None)
            if self.fresh_store_per_round:
                env[TITAN_STORE_PER_ROUND] = "1"
        elif disable_shared_store:
            env[DISABLE_SHARED_STORE_VAR] = "1"

    def agent_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """The node agent's environment: the workers' plus the secret and listen address."""
        out = dict(env)
        out[TITAN_LISTEN_ADDR] = self.listen.addr
        if self.secret is not None:
            out[TITAN_RDZV_SECRET] = self.secret.env_value()
        return out

    @contextlib.contextmanager
    def rendezvous(self, report: Any, *, before_join: Any = (), after_join: Any = ()) -> Iterator[None]:
        """Serve Titan's registered backends while torchrun runs (no-op when insecure);
        ``before_join`` / ``after_join`` hooks: see ``rdzv_auth.AuthContext``."""
        if not self.wrapped:
            yield
            return
        from titan.launch.rdzv_auth import AuthContext, authenticated_rendezvous

        assert self.secret is not None
        ctx = AuthContext(signer=self.secret.signer(), listen_addr=self.listen.addr,
                          fresh_store_per_round=self.fresh_store_per_round, report=report,
                          before_join=list(before_join), after_join=list(after_join))
        with authenticated_rendezvous(ctx):
            yield


def _host_of(endpoint: str | None) -> str | None:
    if not endpoint:
        return None
    if endpoint.startswith("["):
        return endpoint[1:].split("]", 1)[0]
    return endpoint.rsplit(":", 1)[0] if endpoint.count(":") == 1 else endpoint


def _endpoint(addr: str, port: int) -> str:
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def plan_security(*, backend: str, endpoint: str | None, multi_node: bool, local_addr: str | None,
                  secret_file: str | None, insecure: bool, disable_shared_store: bool,
                  environ: Mapping[str, str]) -> SecurityPlan:
    """Decide the plan; raises ``UserError`` (nothing written yet) for a refusal."""
    if backend == "etcd" and not insecure:
        raise UserError("--rdzv-backend etcd (v1) cannot be authenticated: its state is not signed and the "
                        "rank-0 worker's store listens on every interface",
                        "use --rdzv-backend etcd-v2 or c10d (or --insecure-rdzv to accept the risk)")
    if backend == "static" and multi_node:
        raise UserError("--rdzv-backend static is single-node only in titan run (no --node-rank)",
                        "use the default c10d rendezvous for several nodes")
    secret = resolve_secret(secret_file, environ)
    if secret is None and not insecure:
        if multi_node:
            raise UserError("a multi-node run needs a rendezvous secret shared by every node", _SECRET_HINT)
        secret = generate_secret()
    listen = plan_listen(local_addr=local_addr, endpoint_host=_host_of(endpoint), multi_node=multi_node,
                         environ=environ)
    if backend == "static" and not endpoint:
        backend_used = "c10d"  # torchrun does the same: a single node without an endpoint
    else:
        backend_used = backend
    ep = endpoint or _endpoint(listen.addr, 0)
    torch_backend = backend_used if insecure else f"titan-{backend_used}"
    fresh = disable_shared_store and torch_backend in ("titan-c10d", "titan-etcd-v2")
    return SecurityPlan(backend=backend, torch_backend=torch_backend, endpoint=ep, listen=listen,
                        secret=secret, insecure=insecure, fresh_store_per_round=fresh)
