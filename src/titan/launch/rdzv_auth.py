"""Authenticated rendezvous: torch's c10d/etcd-v2 rendezvous with signed state, bound stores.

torch elastic's dynamic rendezvous keeps its state as a pickle in a store anyone who
reaches the store port can write; ``_BackendRendezvousStateHolder.sync()`` unpickles the
bytes it gets from ``backend.get_state()`` *and* from ``backend.set_state()`` (a lost
``compare_set`` returns whatever the store holds) — a client that guessed the run id ran
code in the agent. This module registers three rendezvous backends with torch's
``rendezvous_handler_registry`` (no launcher fork):

* ``titan-c10d`` / ``titan-etcd-v2``: torch's backend wrapped in :class:`SignedBackend`,
  which seals every state it writes (HMAC-SHA256 under the job secret, a sequence number
  against replays) and verifies every state it reads — from ``get_state`` and from
  ``set_state``'s return — *before* the state holder unpickles it. A rejected state is
  never unpickled: it is reported as ``rdzv.unauthenticated``; the job keeps its last
  verified state and the next write replaces the bad value (the store heals), unless the
  value was sealed with another key (the nodes do not share one secret: the job stops).
  The handler, a ``DynamicRendezvousHandler`` subclass, binds the rendezvous store and a
  fresh worker store per round to the listen address (``titan.launch.listen``) and checks
  a signed copy of ``MASTER_ADDR:MASTER_PORT``.
* ``titan-static``: torch's static rendezvous (nothing unpickled) with its store bound.

Cost: one HMAC per state read/write (the state is a few KB); one extra store key per round.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import logging
import struct
import threading
from typing import Any, Callable, Iterator

from titan.private_api import PrivateName, register, require
from titan.security.signing import SignatureError, Signer

__all__ = ["AuthContext", "SignedBackend", "authenticated_rendezvous", "WRAPPED", "PRIVATE_NAMES",
           "STATE_PURPOSE", "BOOTSTRAP_PURPOSE", "BOOTSTRAP_KEY", "check_private_api"]

log = logging.getLogger(__name__)

#: torchrun backend name → the Titan backend registered for it.
WRAPPED = {"c10d": "titan-c10d", "etcd-v2": "titan-etcd-v2", "static": "titan-static"}
STATE_PURPOSE = "titan.rdzv.state.v1"
BOOTSTRAP_PURPOSE = "titan.rdzv.bootstrap.v1"
BOOTSTRAP_KEY = "titan/bootstrap"
ROUND_PURPOSE = "titan.rdzv.round.v1"
_SEQ = struct.Struct("!Q")
_MAX_REPORTS = 20

_DR = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
PRIVATE_NAMES = register("authenticated rendezvous", [
    PrivateName(_DR, "_BackendRendezvousStateHolder.sync",
                "the only place the rendezvous state is unpickled; its bytes come from the backend"),
    PrivateName(_DR, "DynamicRendezvousHandler._create_tcp_store_server",
                "the worker store the agent opens; Titan binds it to the listen address"),
    PrivateName(_DR, "_shared_tcp_store_server", "dropped each round for a fresh worker store",
                in_init_of="DynamicRendezvousHandler"),
    PrivateName(_DR, "_bootstrap_store_info", "dropped each round for a fresh worker store",
                in_init_of="DynamicRendezvousHandler"),
    PrivateName(_DR, "DynamicRendezvousHandler._get_store",
                "the round's store: Titan names its prefix with the secret"),
    PrivateName(_DR, "_state_holder", "the round number for the round's store prefix",
                in_init_of="DynamicRendezvousHandler"),
    PrivateName(_DR, "_store", "the rendezvous store under the round's prefix", in_init_of="DynamicRendezvousHandler"),
    PrivateName("torch.distributed.elastic.rendezvous.c10d_rendezvous_backend", "C10dRendezvousBackend._decode_state",
                "an undecodable store value is handed to the verifier (and replaced) instead of raising"),
    PrivateName("torch.distributed.elastic.rendezvous.c10d_rendezvous_backend", "C10dRendezvousBackend._call_store",
                "replaces a store value that is not even text"),
    PrivateName("torch.distributed.elastic.rendezvous.c10d_rendezvous_backend", "_key",
                "the store key of the state", in_init_of="C10dRendezvousBackend"),
    PrivateName("torch.distributed.elastic.rendezvous.static_tcp_rendezvous", "_store",
                "the static rendezvous store, created bound by Titan", in_init_of="StaticTCPRendezvous"),
])


#: Optional (a restart just keeps torch's skew when it moved): see :func:`_no_restart_skew`.
SKEW_NAMES = register("restart without the first round's join skew", [
    PrivateName(_DR, "_delay", "the random 0-0.3 s join skew torch applies in round 0, skipped on a restart"),
])


def check_private_api() -> None:
    """Refuse (``UserError``) when torch moved a name the authenticated rendezvous rests on."""
    require(PRIVATE_NAMES, feature="authenticated rendezvous")


@dataclasses.dataclass
class AuthContext:
    """What the registered backends need from the launch that uses them."""

    signer: Signer
    listen_addr: str
    fresh_store_per_round: bool = True
    report: Callable[[str, str, dict[str, Any]], None] = lambda kind, msg, data: None
    #: Called with the handler before this node joins a round (the cluster ledger decides
    #: whether it may), and with (RendezvousInfo, handler) once the round formed (the
    #: storage probe); ``titan.launch.cluster``. An exception ends this node's launch.
    before_join: list[Callable[[Any], None]] = dataclasses.field(default_factory=list)
    after_join: list[Callable[[Any, Any], None]] = dataclasses.field(default_factory=list)
    _reports: int = 0
    _lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def reject(self, msg: str, data: dict[str, Any]) -> None:
        """Record one ``rdzv.unauthenticated`` event (the first 20; then every 100th)."""
        with self._lock:
            self._reports += 1
            n = self._reports
        if n <= _MAX_REPORTS or n % 100 == 0:
            self.report("rdzv.unauthenticated", f"unauthenticated rendezvous state rejected: {msg}",
                        {**data, "count": n})
        log.warning("unauthenticated rendezvous state rejected (%d): %s", n, msg)


class _Rejected(Exception):
    def __init__(self, msg: str, reason: str) -> None:
        super().__init__(msg)
        self.reason = reason


def _state_error(msg: str) -> Exception:
    from torch.distributed.elastic.rendezvous.api import RendezvousStateError

    return RendezvousStateError(f"unauthenticated rendezvous state: {msg}")


@contextlib.contextmanager
def _no_restart_skew(restart: bool) -> Iterator[None]:
    """On a restart, join without torch's random 0-0.3 s skew.

    torch delays a node's join by a random 0-0.3 s while the rendezvous is in round 0, to
    spread the first join of many nodes over time; the *first restart* still finds round 0
    and pays it again (a restart from round 1 on does not). On one node it is pure RTO
    (measured: 0.08-0.26 s of a 0.5 s restart round). The fixed 1 s pause of a node that
    must wait for others (``_delay(seconds=1)``) is kept; a torch without ``_delay`` keeps
    its skew.
    """
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    orig = getattr(dr, "_delay", None)
    if not restart or orig is None:
        yield
        return

    def delay(seconds: Any) -> None:
        if not isinstance(seconds, tuple):
            orig(seconds)

    dr._delay = delay
    try:
        yield
    finally:
        dr._delay = orig


def _signed_backend_class() -> type:
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend

    class _Signed(RendezvousBackend):  # type: ignore[misc]
        """``inner`` with every state sealed on write and verified on read (see module doc)."""

        def __init__(self, inner: Any, ctx: AuthContext, *, run_id: str, name: str) -> None:
            self._inner = inner
            self._ctx = ctx
            self._context = run_id.encode()
            self._name = name
            self._max_seq = 0
            self._last_good: bytes | None = None
            self._lock = threading.Lock()

        @property
        def name(self) -> str:
            return self._name

        def _seal(self, state: bytes) -> bytes:
            with self._lock:
                seq = self._max_seq + 1
            return self._ctx.signer.seal(STATE_PURPOSE, _SEQ.pack(seq) + state, context=self._context)

        def _accept(self, raw: bytes) -> bytes:
            try:
                payload = self._ctx.signer.open(STATE_PURPOSE, raw, context=self._context)
            except SignatureError as e:
                raise _Rejected(str(e), e.reason) from None
            if len(payload) < _SEQ.size:
                raise _Rejected("signed record too short", "bad_tag")
            (seq,) = _SEQ.unpack_from(payload)
            with self._lock:
                if seq < self._max_seq:
                    raise _Rejected(f"replayed state (sequence {seq}, already saw {self._max_seq})", "replay")
                self._max_seq = seq
            state = payload[_SEQ.size:]
            self._last_good = state
            return state

        def _rejected(self, e: _Rejected, op: str, raw: bytes, action: str) -> None:
            self._ctx.reject(f"{e} (from {op}; {len(raw)} bytes; nothing was unpickled; {action})",
                             {"op": op, "reason": e.reason, "bytes": len(raw), "action": action,
                              "backend": self._name})
            if e.reason == "other_key":
                raise _state_error(f"{e}: every node must use the same secret") from None

        def get_state(self) -> tuple[bytes, Any] | None:
            got = self._inner.get_state()
            if got is None:
                return None
            raw, token = got
            try:
                return self._accept(raw), token
            except _Rejected as e:
                last = self._last_good
                self._rejected(e, "get_state", raw, "kept the last verified state; the next write replaces it"
                               if last is not None else "treated as no state; the next write replaces it")
                # The bad value's token lets the next compare_set overwrite it.
                return (last, token) if last is not None else None

        def set_state(self, state: bytes, token: Any = None) -> tuple[bytes, Any, bool] | None:
            sealed = self._seal(state)
            for attempt in (1, 2):
                got = self._inner.set_state(sealed, token)
                if got is None:
                    return None
                raw, new_token, ok = got
                try:
                    return self._accept(raw), new_token, bool(ok)
                except _Rejected as e:
                    if attempt == 2:
                        self._rejected(e, "set_state", raw, "the job stops")
                        raise _state_error(f"{e}; the store kept returning it") from None
                    self._rejected(e, "set_state", raw, "replaced by this node's state")
                    token = new_token  # compare_set against the bad value replaces it
            raise AssertionError("unreachable")

    return _Signed


_SIGNED: type | None = None


def SignedBackend(inner: Any, ctx: AuthContext, *, run_id: str, name: str) -> Any:  # noqa: N802 - a factory
    """Wrap a ``RendezvousBackend`` so every state is sealed on write and verified on read."""
    global _SIGNED
    if _SIGNED is None:
        _SIGNED = _signed_backend_class()
    return _SIGNED(inner, ctx, run_id=run_id, name=name)


# --- handlers ---------------------------------------------------------------------------

_CURRENT: AuthContext | None = None
_REGISTERED = False
_REG_LOCK = threading.Lock()


def _ctx() -> AuthContext:
    if _CURRENT is None:
        raise RuntimeError("Titan's rendezvous backends are used only inside `titan run`")
    return _CURRENT


def _handler_classes() -> tuple[type, type, type]:
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous

    from titan.launch.listen import bound_store

    class RawC10dBackend(C10dRendezvousBackend):  # type: ignore[misc]
        """An undecodable value goes to the verifier (and is replaced), not raised."""

        def _decode_state(self, base64_state: bytes) -> Any:
            try:
                return super()._decode_state(base64_state)
            except Exception as e:  # RendezvousStateError wrapping binascii.Error
                if not isinstance(e.__cause__, binascii.Error):
                    raise
                return b"", base64_state

        def set_state(self, state: bytes, token: Any = None) -> Any:
            if isinstance(token, bytes):
                try:
                    token.decode()
                except UnicodeDecodeError:
                    # The store holds bytes torch never writes (not even text): compare_set
                    # against them directly, so the bad value is replaced.
                    raw = self._call_store("compare_set", self._key, token, base64.b64encode(state).decode())
                    pair = self._decode_state(raw)
                    return None if pair is None else (pair[0], pair[1], pair[0] == state)
            return super().set_state(state, token)

    class TitanRendezvousHandler(DynamicRendezvousHandler):  # type: ignore[misc]
        """Worker store bound to the listen address, fresh each round; bootstrap checked."""

        _titan_ctx: AuthContext

        def _create_tcp_store_server(self, master_addr: Any, master_port: Any) -> Any:
            return bound_store(self._titan_ctx.listen_addr, int(master_port or 0))

        def next_rendezvous(self) -> Any:
            if self._titan_ctx.fresh_store_per_round:
                # Restarted workers never see the dead workers' keys (the restart fix).
                self._shared_tcp_store_server = None
                self._bootstrap_store_info = None
            for hook in self._titan_ctx.before_join:
                hook(self)
            with _no_restart_skew(getattr(self, "_titan_joined", False)):
                info = super().next_rendezvous()
            self._titan_joined = True
            _check_bootstrap(self._titan_ctx, info, self.get_run_id())
            for after in self._titan_ctx.after_join:
                after(info, self)
            return info

        def _get_store(self) -> Any:
            # The round's keys (MASTER_ADDR/PORT, ranks, barriers) live under a name derived
            # from the secret: nobody without it can plant them before rank 0 writes them.
            import torch.distributed as dist

            rnd = self._state_holder.state.round
            tag = self._titan_ctx.signer.tag(ROUND_PURPOSE, str(rnd).encode(), context=self.get_run_id())
            return dist.PrefixStore(f"titan.rendezvous.{tag[:12].hex()}", self._store)

    class TitanStaticRendezvous(StaticTCPRendezvous):  # type: ignore[misc]
        """torch's static rendezvous whose rank-0 store listens on the listen address only."""

        _titan_ctx: AuthContext

        def get_backend(self) -> str:
            return WRAPPED["static"]

        def next_rendezvous(self) -> Any:
            if self._store is None and self.rank == 0:
                self._store = bound_store(self._titan_ctx.listen_addr, int(self.master_port),
                                          timeout_s=self.timeout.total_seconds())
            return super().next_rendezvous()

    return RawC10dBackend, TitanRendezvousHandler, TitanStaticRendezvous


def _check_bootstrap(ctx: AuthContext, info: Any, run_id: str) -> None:
    """Rank 0 signs ``MASTER_ADDR:MASTER_PORT``; the others refuse an address it did not sign."""
    bi = info.bootstrap_store_info
    rec = f"{bi.master_addr}:{bi.master_port}".encode()
    store = info.store
    if info.rank == 0:
        store.set(BOOTSTRAP_KEY, ctx.signer.seal(BOOTSTRAP_PURPOSE, rec, context=run_id))
        return
    raw = bytes(store.get(BOOTSTRAP_KEY))
    try:
        signed = ctx.signer.open(BOOTSTRAP_PURPOSE, raw, context=run_id)
    except SignatureError as e:
        ctx.reject(f"worker store address record: {e}", {"op": "bootstrap", "reason": e.reason, "bytes": len(raw),
                                                         "action": "the job stops"})
        raise _state_error(f"the worker store address is not signed ({e.reason})") from None
    if signed != rec:
        ctx.reject(f"MASTER_ADDR:MASTER_PORT read as {rec.decode(errors='replace')}, rank 0 signed "
                   f"{signed.decode(errors='replace')}", {"op": "bootstrap", "reason": "rewritten",
                                                         "action": "the job stops"})
        raise _state_error("MASTER_ADDR/MASTER_PORT were rewritten in the store")


def _timeouts(params: Any) -> Any:
    from datetime import timedelta

    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousTimeout

    def get(key: str) -> timedelta | None:
        v = params.get_as_int(key + "_timeout")
        return None if v is None else timedelta(seconds=v)

    return RendezvousTimeout(get("join"), get("last_call"), get("close"), get("heartbeat"))


def _dynamic(store: Any, backend: Any, params: Any, ctx: AuthContext) -> Any:
    _, handler_cls, _ = _classes()
    h = handler_cls.from_backend(params.run_id, store, backend, params.min_nodes, params.max_nodes,
                                 params.local_addr, _timeouts(params),
                                 keep_alive_interval=params.get_as_int("keep_alive_interval", 5),
                                 keep_alive_max_attempt=params.get_as_int("keep_alive_max_attempt", 3))
    h._titan_ctx = ctx
    return h


def _create_c10d(params: Any) -> Any:
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    from titan.launch.listen import bound_store, client_store, is_local_address, resolve_host

    ctx = _ctx()
    if params.get("store_type", "tcp").strip().lower() != "tcp":
        raise ValueError("titan run's c10d rendezvous supports store_type=tcp only")
    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=29400)
    timeout = float(params.get_as_int("read_timeout", 60))
    cfg_is_host = params.get_as_bool("is_host")
    try:
        ep_addr = resolve_host(host)
    except OSError:
        ep_addr = None
    ep_local = ep_addr is not None and is_local_address(ep_addr)
    is_host = cfg_is_host if cfg_is_host is not None else (ep_local or port == 0)
    store = None
    if is_host:
        addr = ep_addr if ep_local else ctx.listen_addr
        try:
            store = bound_store(addr, port, timeout_s=timeout)
        except (OSError, RuntimeError) as e:
            if cfg_is_host is not None or port == 0:
                raise RendezvousConnectionError(f"cannot listen on {addr}:{port} for the rendezvous store: {e}") from e
            log.info("rendezvous store %s:%s is hosted by another process here (%s); joining it", addr, port, e)
    if store is None:
        store = client_store(host, port, timeout_s=timeout)
    backend = SignedBackend(_classes()[0](store, params.run_id), ctx, run_id=params.run_id, name=WRAPPED["c10d"])
    return _dynamic(store, backend, params, ctx)


def _create_etcd_v2(params: Any) -> Any:
    from torch.distributed.elastic.rendezvous.etcd_rendezvous_backend import create_backend

    ctx = _ctx()
    inner, store = create_backend(params)
    return _dynamic(store, SignedBackend(inner, ctx, run_id=params.run_id, name=WRAPPED["etcd-v2"]), params, ctx)


def _create_static(params: Any) -> Any:
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    ctx = _ctx()
    addr, port = parse_rendezvous_endpoint(params.endpoint, default_port=-1)
    if port < 0:
        raise ValueError(f"the static rendezvous needs HOST:PORT, got {params.endpoint!r}")
    timeout = int(params.config.get("timeout", 600))
    h = _classes()[2](addr, port, int(params.config.get("rank", 0)), params.max_nodes, params.run_id, timeout)
    h._titan_ctx = ctx
    return h


_CLASSES: tuple[type, type, type] | None = None


def _classes() -> tuple[type, type, type]:
    global _CLASSES
    if _CLASSES is None:
        _CLASSES = _handler_classes()
    return _CLASSES


@contextlib.contextmanager
def authenticated_rendezvous(ctx: AuthContext) -> Iterator[None]:
    """Register Titan's backends (once per process) and serve ``ctx`` to them while inside."""
    global _CURRENT, _REGISTERED
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    check_private_api()
    with _REG_LOCK:
        if not _REGISTERED:
            rendezvous_handler_registry.register(WRAPPED["c10d"], _create_c10d)
            rendezvous_handler_registry.register(WRAPPED["etcd-v2"], _create_etcd_v2)
            rendezvous_handler_registry.register(WRAPPED["static"], _create_static)
            _REGISTERED = True
        prev, _CURRENT = _CURRENT, ctx
    try:
        yield
    finally:
        _CURRENT = prev
