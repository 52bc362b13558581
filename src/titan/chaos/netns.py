"""Test "nodes" made of network namespaces on one machine, and real faults on their links.

``Topology(prefix, n)`` creates ``n`` namespaces joined to one bridge in the root namespace
by veth pairs, addresses ``198.18.<subnet>.<i+1>/24`` (the benchmarking range, never routed
outside). Link faults are real kernel mechanisms: ``tc tbf`` for bandwidth, nftables
``numgen random`` for loss (:meth:`Topology.set_loss`), link down or an nftables drop for a
partition, and an NFQUEUE rule with a user-space delayer for delay (:meth:`Topology.start_delay`). Needs root and ``iproute2``; every
command is checked and the whole topology is removed by ``destroy()`` (also on errors).
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from typing import Sequence

from titan.errors import TitanError

__all__ = ["Topology", "NetnsUnavailable", "netns_unavailable_reason"]


class NetnsUnavailable(TitanError):
    """This machine cannot make network namespaces (not root, no ``ip``)."""


def netns_unavailable_reason() -> str | None:
    """``None`` when namespaces can be made here, else why not (for skips and errors)."""
    import os

    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "iproute2 (ip, tc) is not installed"
    probe = subprocess.run(["ip", "netns", "add", "titan-probe"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"ip netns add failed: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", "titan-probe"], capture_output=True)
    return None


def run_checked(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a system command (30 s bound); ``TitanError`` with its message when it fails."""
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise TitanError(f"{' '.join(cmd)} failed: {(p.stderr or p.stdout).strip()}")
    return p


_sh = run_checked


@dataclasses.dataclass
class Topology:
    """``n`` namespaces ``<prefix>0..`` on bridge ``<prefix>br``; see the module doc."""

    prefix: str
    n: int
    subnet: int = 0

    def ns(self, i: int) -> str:
        return f"{self.prefix}{i}"

    def addr(self, i: int) -> str:
        return f"198.18.{self.subnet}.{i + 1}"

    def host_if(self, i: int) -> str:
        return f"{self.prefix}h{i}"

    def ns_if(self, i: int) -> str:
        return f"{self.prefix}n{i}"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    def create(self) -> "Topology":
        reason = netns_unavailable_reason()
        if reason:
            raise NetnsUnavailable(reason)
        self.destroy()  # leftovers of a killed earlier run
        try:
            _sh("ip", "link", "add", self.bridge, "type", "bridge")
            _sh("ip", "link", "set", self.bridge, "up")
            for i in range(self.n):
                ns = self.ns(i)
                _sh("ip", "netns", "add", ns)
                _sh("ip", "link", "add", self.host_if(i), "type", "veth", "peer", "name", self.ns_if(i))
                _sh("ip", "link", "set", self.ns_if(i), "netns", ns)
                _sh("ip", "link", "set", self.host_if(i), "master", self.bridge)
                _sh("ip", "link", "set", self.host_if(i), "up")
                _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{self.addr(i)}/24", "dev", self.ns_if(i))
                _sh("ip", "netns", "exec", ns, "ip", "link", "set", self.ns_if(i), "up")
                _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        except BaseException:
            self.destroy()
            raise
        return self

    def destroy(self) -> None:
        """Remove namespaces, veths and the bridge; ignores what is already gone."""
        for i in range(self.n):
            _sh("ip", "netns", "del", self.ns(i), check=False)
            _sh("ip", "link", "del", self.host_if(i), check=False)
        _sh("ip", "link", "del", self.bridge, check=False)

    def exec_prefix(self, i: int) -> list[str]:
        """Prepend to a command to run it inside node ``i``."""
        return ["ip", "netns", "exec", self.ns(i)]

    def limit_bandwidth(self, i: int, rate: str = "20mbit", burst: str = "32kbit", latency: str = "400ms") -> None:
        """``tc tbf`` on both directions of node ``i``'s link."""
        _sh("tc", "qdisc", "replace", "dev", self.host_if(i), "root", "tbf", "rate", rate, "burst", burst, "latency", latency)
        _sh(*self.exec_prefix(i), "tc", "qdisc", "replace", "dev", self.ns_if(i), "root", "tbf", "rate", rate,
            "burst", burst, "latency", latency)

    def clear_bandwidth(self, i: int) -> None:
        _sh("tc", "qdisc", "del", "dev", self.host_if(i), "root", check=False)
        _sh(*self.exec_prefix(i), "tc", "qdisc", "del", "dev", self.ns_if(i), "root", check=False)

    def set_link(self, i: int, up: bool) -> None:
        """Partition (``up=False``) or heal node ``i``'s link."""
        _sh("ip", "link", "set", self.host_if(i), "up" if up else "down")

    # -- nftables (loss, drop) and NFQUEUE (delay) inside node ``i``'s namespace -----------
    def _nft(self, i: int, *rule: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return _sh(*self.exec_prefix(i), "nft", *rule, check=check)

    def _nft_table(self, i: int) -> None:
        self._nft(i, "add", "table", "inet", "titanchaos")
        for chain, hook in (("out", "output"), ("in", "input")):
            self._nft(i, "add", "chain", "inet", "titanchaos", chain,
                      f"{{ type filter hook {hook} priority 0 ; policy accept ; }}")

    def set_loss(self, i: int, percent: float, *, both: bool = False) -> None:
        """Drop ``percent`` % of node ``i``'s outgoing packets (and incoming with ``both``) at
        random: nftables ``numgen random mod 100 < N drop``. ``percent >= 100``: a partition by
        nftables drop. Needs the ``nft`` binary (Debian nftables)."""
        if not shutil.which("nft"):
            raise TitanError("nftables (nft) is not installed; apt-get install nftables")
        self.clear_nft(i)
        self._nft_table(i)
        n = int(round(percent))
        for chain, d in (("out", "oifname"), ("in", "iifname"))[: 2 if both else 1]:
            cond = [] if n >= 100 else ["numgen", "random", "mod", "100", "<", str(n)]
            self._nft(i, "add", "rule", "inet", "titanchaos", chain, d, self.ns_if(i), *cond, "counter", "drop")

    def nft_dropped(self, i: int) -> int:
        """Packets dropped so far by this topology's nftables rules on node ``i``."""
        out = self._nft(i, "list", "table", "inet", "titanchaos", check=False).stdout
        return sum(int(w.split()[0]) for w in out.split("packets")[1:] if w.split()[0].isdigit()) if out else 0

    def clear_nft(self, i: int) -> None:
        self._nft(i, "delete", "table", "inet", "titanchaos", check=False)

    def start_delay(self, i: int, delay_ms: float, jitter_ms: float = 0.0, queue: int = 7) -> "subprocess.Popen[str]":
        """Delay node ``i``'s outgoing packets by ``delay_ms``: an ``iptables-legacy … -j NFQUEUE``
        rule plus the user-space delayer :mod:`titan.chaos.nfqdelay` in the namespace (this
        kernel has no ``sch_netem``). Stop with :meth:`stop_delay`."""
        import sys
        import time

        if not shutil.which("iptables-legacy"):
            raise TitanError("iptables-legacy is not installed; apt-get install iptables")
        proc = subprocess.Popen([*self.exec_prefix(i), sys.executable, "-m", "titan.chaos.nfqdelay", str(queue),
                                 str(delay_ms), str(jitter_ms)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        line = proc.stdout.readline() if proc.stdout else ""
        if line.strip() != "ready":
            proc.kill()
            err = proc.stderr.read() if proc.stderr else ""
            raise TitanError(f"NFQUEUE delayer did not start: {err.strip()[-300:]}")
        # --queue-bypass: if the delayer dies, packets flow instead of being dropped.
        _sh(*self.exec_prefix(i), "iptables-legacy", "-I", "OUTPUT", "-o", self.ns_if(i), "-j", "NFQUEUE",
            "--queue-num", str(queue), "--queue-bypass")
        time.sleep(0.05)
        return proc

    def stop_delay(self, i: int, proc: "subprocess.Popen[str] | None", queue: int = 7) -> None:
        _sh(*self.exec_prefix(i), "iptables-legacy", "-D", "OUTPUT", "-o", self.ns_if(i), "-j", "NFQUEUE",
            "--queue-num", str(queue), "--queue-bypass", check=False)
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()

    def __enter__(self) -> "Topology":
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    @staticmethod
    def ifnames(topo: "Topology") -> Sequence[str]:
        return [topo.ns_if(i) for i in range(topo.n)]
