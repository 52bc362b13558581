"""Test "nodes" made of network namespaces on one machine, and real faults on their links.

``Topology(tag, n)`` creates ``n`` namespaces joined to one bridge in the root namespace
by veth pairs, addresses ``198.18.<k>.<i+1>/24`` or ``198.19.<k>.<i+1>/24`` (the benchmarking
range, never routed outside). Names and subnet belong to one *slot* of 512 that the topology
claims with an exclusive ``flock`` on ``/run/titan-netns/slot-<k>.lock`` for its lifetime, so
concurrent runs — two ``titan drill --nodes 2``, other people's tests — never share a name or
a subnet; the lock dies with its process, and the next claimer of a slot first removes what
a killed run left behind. Link faults are real kernel mechanisms: ``tc tbf`` for bandwidth, nftables
``numgen random`` for loss (:meth:`Topology.set_loss`), link down or an nftables drop for a
partition, and an NFQUEUE rule with a user-space delayer for delay (:meth:`Topology.start_delay`). Needs root and ``iproute2``; every
command is checked and the whole topology is removed by ``destroy()`` (also on errors).
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import random
import re
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

from titan.errors import TitanError

__all__ = ["Topology", "NetnsUnavailable", "netns_unavailable_reason", "SLOTS", "LOCK_DIR"]

#: Where slot claims live: one path for the whole machine (not $TMPDIR, which differs per user).
LOCK_DIR = Path("/run/titan-netns")
#: 198.18.0.0/15 holds 512 /24 subnets: one per slot.
SLOTS = 512
_TAG = re.compile(r"^[a-z]{1,6}$")


class NetnsUnavailable(TitanError):
    """This machine cannot make network namespaces (not root, no ``ip``)."""


def netns_unavailable_reason() -> str | None:
    """``None`` when namespaces can be made here, else why not (for skips and errors)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip") or not shutil.which("tc"):
        return "iproute2 (ip, tc) is not installed"
    name = f"titan-probe-{os.getpid()}-{random.randrange(1 << 30):x}"  # concurrent probes must not collide
    probe = subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"ip netns add failed: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def run_checked(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a system command (30 s bound); ``TitanError`` with its message when it fails."""
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise TitanError(f"{' '.join(cmd)} failed: {(p.stderr or p.stdout).strip()}")
    return p


_sh = run_checked


def _claim_slot(tag: str) -> tuple[int, int, str | None]:
    """Lock a free slot; returns (slot, the locked fd, the tag of its previous holder).
    ``TitanError`` when all are taken."""
    LOCK_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    start = random.randrange(SLOTS)
    for k in range(SLOTS):
        slot = (start + k) % SLOTS
        fd = os.open(LOCK_DIR / f"slot-{slot}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        prev = os.pread(fd, 200, 0).decode(errors="replace").split()
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {tag}\n".encode(), 0)
        return slot, fd, (prev[1] if len(prev) > 1 and _TAG.match(prev[1]) else None)
    raise TitanError(f"all {SLOTS} network-namespace slots in {LOCK_DIR} are held by running processes")


@dataclasses.dataclass
class Topology:
    """``n`` namespaces on one bridge, named and addressed by a claimed slot (module doc).

    ``tag`` (1–6 lowercase letters) starts every name so a person can tell whose they are;
    names and addresses exist from :meth:`create` until :meth:`destroy`."""

    tag: str
    n: int
    slot: int | None = dataclasses.field(default=None, init=False)
    _fd: int | None = dataclasses.field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not _TAG.match(self.tag):
            raise ValueError(f"netns tag {self.tag!r} must be 1-6 lowercase letters (interface names are <= 15 chars)")
        if not 1 <= self.n <= 99:
            raise ValueError(f"a topology has 1..99 nodes, not {self.n}")

    @property
    def prefix(self) -> str:
        """``<tag><slot, 3 digits>``: every name of this topology starts with it (letters
        then digits, so no two tags or slots give the same names)."""
        if self.slot is None:
            raise TitanError("the topology has no names before create()")
        return f"{self.tag}{self.slot:03d}"

    @property
    def subnet(self) -> str:
        """This topology's /24, e.g. ``198.18.42``."""
        if self.slot is None:
            raise TitanError("the topology has no subnet before create()")
        return f"198.{18 + self.slot // 256}.{self.slot % 256}"

    def ns(self, i: int) -> str:
        return f"{self.prefix}{i}"

    def addr(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    def host_if(self, i: int) -> str:
        return f"{self.prefix}h{i}"

    def ns_if(self, i: int) -> str:
        return f"{self.prefix}n{i}"

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    def create(self) -> "Topology":
        """Claim a slot and build the namespaces. Cost: ~10 ``ip`` commands per node.
        Raises ``NetnsUnavailable`` (not root, no iproute2) or ``TitanError``."""
        reason = netns_unavailable_reason()
        if reason:
            raise NetnsUnavailable(reason)
        if self.slot is not None:
            raise TitanError(f"topology {self.prefix} is already created")
        self.slot, self._fd, prev = _claim_slot(self.tag)
        try:
            # What a killed earlier holder of this slot left behind (its lock died with it).
            self._remove(f"{prev}{self.slot:03d}" if prev else None)
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

    def _remove(self, earlier: str | None = None) -> None:
        for pre in {earlier or self.prefix, self.prefix}:
            # An earlier holder may have had any node count: match its names by prefix.
            names = {ln.split()[0] for ln in _sh("ip", "netns", "list", check=False).stdout.splitlines() if ln.strip()}
            for ns in sorted(x for x in names if re.fullmatch(rf"{re.escape(pre)}\d+", x)):
                _sh("ip", "netns", "del", ns, check=False)
            for link in (f"{pre}br", *(f"{pre}h{i}" for i in range(100))):
                if Path("/sys/class/net", link).exists():
                    _sh("ip", "link", "del", link, check=False)
        for i in range(self.n):
            _sh("ip", "netns", "del", self.ns(i), check=False)
            _sh("ip", "link", "del", self.host_if(i), check=False)
        _sh("ip", "link", "del", self.bridge, check=False)  # its veths go with their namespaces

    def destroy(self) -> None:
        """Remove namespaces, veths and the bridge, then give the slot back; ignores what
        is already gone. Safe to call twice."""
        if self.slot is None:
            return
        try:
            self._remove()
        finally:
            if self._fd is not None:
                os.close(self._fd)  # releases the flock
            self.slot, self._fd = None, None

    def exec_prefix(self, i: int) -> list[str]:
        """Prepend to a command to run it inside node ``i``."""
        return ["ip", "netns", "exec", self.ns(i)]

    def limit_bandwidth(self, i: int, rate: str = "20mbit", burst: str = "32kbit", latency: str = "400ms") -> None:
        """``tc tbf`` on both directions of node ``i``'s link."""
        _sh("tc", "qdisc", "replace", "dev", self.host_if(i), "root", "tbf", "rate", rate, "burst", burst, "latency", latency)
        _sh(*self.exec_prefix(i), "tc", "qdisc", "replace", "dev", self.ns_if(i), "root", "tbf", "rate", rate,
            "burst", burst, "latency", latency)

    def shaped_packets(self, i: int) -> int:
        """Packets the ``tbf`` shapers on node ``i``'s link held back so far (``overlimits``
        of both directions): the evidence that a bandwidth cut bit."""
        total = 0
        for cmd in (["tc", "-s", "qdisc", "show", "dev", self.host_if(i)],
                    [*self.exec_prefix(i), "tc", "-s", "qdisc", "show", "dev", self.ns_if(i)]):
            out = _sh(*cmd, check=False).stdout or ""
            for m in re.finditer(r"tbf.*?overlimits (\d+)", out, re.S):
                total += int(m.group(1))
        return total

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

    def stop_delay(self, i: int, proc: "subprocess.Popen[str] | None", queue: int = 7) -> dict[str, int]:
        """Remove the NFQUEUE rule and end the delayer; returns what it held back
        (``delayed_packets``, ``delayed_bytes``; empty when it could not say)."""
        _sh(*self.exec_prefix(i), "iptables-legacy", "-D", "OUTPUT", "-o", self.ns_if(i), "-j", "NFQUEUE",
            "--queue-num", str(queue), "--queue-bypass", check=False)
        if proc is None:
            return {}
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                return {}
        out = proc.stdout.read() if proc.stdout else ""
        m = re.search(r"delayed (\d+) packets (\d+) bytes", out or "")
        return {"delayed_packets": int(m.group(1)), "delayed_bytes": int(m.group(2))} if m else {}

    def __enter__(self) -> "Topology":
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    @staticmethod
    def ifnames(topo: "Topology") -> Sequence[str]:
        return [topo.ns_if(i) for i in range(topo.n)]
