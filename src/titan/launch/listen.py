"""Listen where asked: the address every Titan-made socket binds, and stores bound to it.

torch's ``TCPStore`` server listens on all interfaces whatever host name it is given (with
or without libuv); given ``master_listen_fd`` — a socket bound and listening already — it
serves on that socket only (measured, torch 2.13). :func:`bound_store` binds the socket
itself, so the rendezvous store and the per-round worker store listen on exactly one
address: ``--local-addr`` if given, else the rendezvous endpoint's address when it is this
host's, else the address this host reaches the endpoint from, else loopback.

The collective data plane (gloo, NCCL) binds the interface named by ``GLOO_SOCKET_IFNAME`` /
``NCCL_SOCKET_IFNAME``; :func:`data_plane_env` sets both from the listen address's interface
unless the user set them. torch cannot do better than the interface: gloo and NCCL take
that interface's first address, not a chosen one (docs/security.md).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import ipaddress
import logging
import socket
from typing import Any, Mapping

from titan.errors import UserError

__all__ = ["ListenPlan", "plan_listen", "bound_socket", "bound_store", "client_store", "interface_of",
           "data_plane_env", "is_local_address", "resolve_host", "DATA_PLANE_VARS"]

log = logging.getLogger(__name__)

#: The variables that choose the collectives' interface.
DATA_PLANE_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def resolve_host(host: str) -> str:
    """``host`` as one IP address string (first of ``getaddrinfo``); ``OSError`` if unknown."""
    if host in ("", "localhost"):
        return "127.0.0.1"
    try:
        return str(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        pass
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    v4 = [i for i in infos if i[0] == socket.AF_INET]
    return str((v4 or infos)[0][4][0])


def _family(addr: str) -> int:
    return socket.AF_INET6 if ":" in addr else socket.AF_INET


def is_local_address(addr: str) -> bool:
    """True when this host can bind ``addr`` (it is one of its addresses, or a wildcard)."""
    try:
        with socket.socket(_family(addr), socket.SOCK_STREAM) as s:
            s.bind((addr, 0))
        return True
    except OSError:
        return False


def _route_source(addr: str) -> str | None:
    """The local address this host uses to reach ``addr`` (a UDP ``connect`` sends nothing)."""
    try:
        with socket.socket(_family(addr), socket.SOCK_DGRAM) as s:
            s.connect((addr, 9))
            return str(s.getsockname()[0])
    except OSError:
        return None


def bound_socket(addr: str, port: int, *, backlog: int = 2048) -> socket.socket:
    """A TCP socket bound to ``addr:port`` and listening. ``OSError`` when that is impossible."""
    s = socket.socket(_family(addr), socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if _family(addr) == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind((addr, port))
        s.listen(backlog)
    except BaseException:
        s.close()
        raise
    return s


def bound_store(addr: str, port: int, *, timeout_s: float = 60.0, multi_tenant: bool = True) -> Any:
    """A ``TCPStore`` server listening on ``addr:port`` only (``port`` 0: a free one).

    Cost: one bind/listen and the store's server thread. The store owns (and closes) the
    socket. Raises ``OSError`` when the address cannot be bound, ``RuntimeError`` from torch.
    """
    import torch.distributed as dist

    sock = bound_socket(addr, port)
    actual = sock.getsockname()[1]
    fd = sock.detach()
    try:
        return dist.TCPStore(addr, actual, is_master=True, master_listen_fd=fd, multi_tenant=multi_tenant,
                             timeout=_dt.timedelta(seconds=timeout_s), wait_for_workers=False)
    except BaseException:
        import os

        os.close(fd)
        raise


def client_store(host: str, port: int, *, timeout_s: float = 60.0) -> Any:
    """A ``TCPStore`` client of ``host:port`` (opens no listener)."""
    import torch.distributed as dist

    return dist.TCPStore(host, port, is_master=False, timeout=_dt.timedelta(seconds=timeout_s))


def _addresses() -> list[tuple[str, Any]]:
    """(interface, address) pairs: each interface's primary IPv4 address (``SIOCGIFADDR``,
    what gloo and NCCL take) and its IPv6 addresses (``/proc/net/if_inet6``). No subprocess."""
    import fcntl
    import struct

    pairs: list[tuple[str, Any]] = []
    try:
        names = [n for _, n in socket.if_nameindex()]
    except OSError:
        names = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for name in names:
            try:
                res = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
                pairs.append((name, ipaddress.ip_address(socket.inet_ntoa(res[20:24]))))
            except OSError:
                continue
    try:
        with open("/proc/net/if_inet6") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6:
                    pairs.append((parts[5], ipaddress.ip_address(bytes.fromhex(parts[0]))))
    except OSError:
        pass
    return pairs


def interface_of(addr: str) -> str | None:
    """Name of the network interface that holds ``addr`` (``lo`` for 127.0.0.1), or None.

    Cost: one ioctl per interface and one small /proc read; loopback maps to ``lo`` anyway.
    """
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        return None
    if ip.is_unspecified:
        return None
    for name, a in _addresses():
        if a == ip:
            return name
    return "lo" if ip.is_loopback else None


def first_address(interface: str, like: str) -> str | None:
    """The first address of ``interface`` in ``like``'s family: what gloo and NCCL bind."""
    v6 = ":" in like
    for name, a in _addresses():
        if name == interface and (a.version == 6) == v6:
            return str(a)
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class ListenPlan:
    """Where this node's sockets listen, and why (reported in the start line and run.json)."""

    addr: str
    why: str
    interface: str | None
    data_plane: dict[str, str]
    data_plane_set_by_user: tuple[str, ...] = ()
    #: The address gloo/NCCL will bind on that interface, when it is not ``addr``.
    data_plane_addr: str | None = None

    def describe(self) -> str:
        """One line for the start of ``titan run``."""
        dp = ", ".join(f"{k}={v}" for k, v in self.data_plane.items())
        user = f" (yours: {', '.join(self.data_plane_set_by_user)})" if self.data_plane_set_by_user else ""
        if self.interface is None and not self.data_plane:
            tail = "collectives: gloo/NCCL choose their own interface (no interface holds this address)"
        else:
            tail = f"collectives on {self.interface or 'the interface you chose'} ({dp or 'as you set'}{user}); " \
                   "gloo/NCCL bind that interface's first address"
            if self.data_plane_addr:
                tail += f" ({self.data_plane_addr}, not {self.addr}: torch cannot bind a chosen address there)"
        return f"listening on {self.addr} ({self.why}); {tail}"

    def to_dict(self) -> dict[str, Any]:
        return {"addr": self.addr, "why": self.why, "interface": self.interface, "data_plane": dict(self.data_plane),
                "data_plane_set_by_user": list(self.data_plane_set_by_user), "data_plane_addr": self.data_plane_addr}


def data_plane_env(interface: str | None, environ: Mapping[str, str]) -> tuple[dict[str, str], tuple[str, ...]]:
    """(variables to set, variables the user already set) for the collectives' interface."""
    user = tuple(v for v in DATA_PLANE_VARS if environ.get(v))
    if interface is None:
        return {}, user
    return {v: interface for v in DATA_PLANE_VARS if v not in user}, user


def plan_listen(*, local_addr: str | None, endpoint_host: str | None, multi_node: bool,
                environ: Mapping[str, str]) -> ListenPlan:
    """Decide this node's listen address; ``UserError`` when ``--local-addr`` is not this host's.

    Order: ``--local-addr``; the endpoint's address when this host holds it; the address
    this host reaches the endpoint from (multi-node); loopback.
    """
    if local_addr:
        try:
            addr = resolve_host(local_addr)
        except OSError as e:
            raise UserError(f"--local-addr {local_addr!r} does not resolve: {e}",
                            "give an address of this host, e.g. --local-addr 10.0.0.5") from None
        if not is_local_address(addr):
            raise UserError(f"--local-addr {local_addr} ({addr}) is not an address of this host",
                            "give one of this host's addresses (see `ip addr`)")
        addr, why = addr, "--local-addr"
    else:
        ep = None
        if endpoint_host:
            try:
                ep = resolve_host(endpoint_host)
            except OSError as e:
                raise UserError(f"rendezvous endpoint host {endpoint_host!r} does not resolve: {e}",
                                "check the name, or give its address") from None
        if ep is not None and is_local_address(ep):
            addr, why = ep, "the rendezvous endpoint is this host"
        elif ep is not None and multi_node and (src := _route_source(ep)):
            addr, why = src, f"this host's address towards {endpoint_host}"
        else:
            addr, why = "127.0.0.1", "loopback: single node"
    iface = interface_of(addr)
    dp, user = data_plane_env(iface, environ)
    first = first_address(iface, addr) if iface and not user else None
    return ListenPlan(addr=addr, why=why, interface=iface, data_plane=dp, data_plane_set_by_user=user,
                      data_plane_addr=first if first not in (None, addr) else None)
