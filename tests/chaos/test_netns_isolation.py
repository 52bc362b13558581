"""Network-namespace "nodes" of concurrent runs never collide: every topology gets its own
names and subnet (a claimed slot), carries its own traffic while the other one lives, and
removes only what it made."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from titan.chaos.netns import Topology, netns_unavailable_reason

_REASON = netns_unavailable_reason()
pytestmark = [pytest.mark.netns, pytest.mark.skipif(_REASON is not None, reason=str(_REASON))]

_ECHO = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], 9000)); s.listen()
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(c.recv(100)); c.close()
"""
_ASK = """
import socket, sys
c = socket.create_connection((sys.argv[1], 9000), timeout=5); c.sendall(sys.argv[2].encode()); print(c.recv(100).decode())
"""


def _netns_names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    return {ln.split()[0] for ln in out.splitlines() if ln.strip()}


def _names(t: Topology) -> set[str]:
    return {t.bridge, *(f(i) for i in range(t.n) for f in (t.ns, t.host_if, t.ns_if))}


class _Echo:
    """An echo server in node 0 of a topology (killed by PID on close)."""

    def __init__(self, t: Topology) -> None:
        self.t = t
        self.proc = subprocess.Popen(t.exec_prefix(0) + [sys.executable, "-c", _ECHO, t.addr(0)],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready", "echo server did not start"

    def ask(self, word: str) -> str:
        p = subprocess.run(self.t.exec_prefix(1) + [sys.executable, "-c", _ASK, self.t.addr(0), word],
                           capture_output=True, text=True, timeout=20)
        return p.stdout.strip() or p.stderr.strip()[-200:]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


@pytest.mark.timeout(120)
def test_two_topologies_at_once_have_own_names_subnets_and_traffic():
    tops = [Topology("tcx", 2), Topology("tcx", 2)]  # the same tag, as two `titan drill --nodes 2` use
    errors: list[BaseException] = []

    def make(t: Topology) -> None:
        try:
            t.create()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=make, args=(t,)) for t in tops]
    echoes: list[_Echo] = []
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert not errors, f"creating two topologies at once failed: {errors}"
        a, b = tops
        assert not (_names(a) & _names(b)), f"shared names: {_names(a) & _names(b)}"
        assert a.subnet != b.subnet, f"both on {a.subnet}"
        echoes = [_Echo(a), _Echo(b)]
        assert echoes[0].ask("from-a") == "from-a" and echoes[1].ask("from-b") == "from-b", \
            [e.ask("x") for e in echoes]
        echoes[0].close()
        names_b = _names(b)
        a.destroy()
        left = _netns_names()
        assert not ({a_ns for a_ns in left if a_ns.startswith("tcx")} - names_b), f"a left namespaces behind: {left}"
        assert {b.ns(0), b.ns(1)} <= left, f"destroying a removed b's namespaces: {left}"
        assert echoes[1].ask("still-b") == "still-b", "b stopped carrying traffic when a went away"
    finally:
        for e in echoes:
            if e.proc.poll() is None:
                e.close()
        for t in tops:
            t.destroy()
    assert not any(n.startswith("tcx") for n in _netns_names()), _netns_names()


_CLAIM = """
import json, sys, time
from titan.chaos.netns import Topology
t = Topology("tcy", 2).create()
print(json.dumps({"ns": [t.ns(0), t.ns(1)], "subnet": t.subnet}), flush=True)
sys.stdin.readline()
t.destroy()
"""


@pytest.mark.timeout(120)
def test_two_processes_claim_different_slots_and_a_killed_ones_leftovers_are_reclaimed():
    procs = [subprocess.Popen([sys.executable, "-c", _CLAIM], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True) for _ in range(2)]
    try:
        got = [json.loads(p.stdout.readline()) for p in procs]
        assert got[0]["ns"] != got[1]["ns"] and got[0]["subnet"] != got[1]["subnet"], got
        procs[0].kill()  # SIGKILL: no cleanup; its slot's lock dies with it
        procs[0].wait(10)
        procs[1].stdin.write("\n")
        procs[1].stdin.flush()
        procs[1].wait(30)
        left = _netns_names()
        assert not set(got[1]["ns"]) & left, f"the process that ended cleanly left {left}"
        assert set(got[0]["ns"]) <= left, "the killed process's namespaces should still be there"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    # Whoever claims that slot next removes the leftovers first: hold every other free slot's
    # lock so the next topology must get it.
    import fcntl

    from titan.chaos.netns import LOCK_DIR, SLOTS

    slot = int(got[0]["ns"][0][3:6])
    held: list[int] = []
    t = Topology("tcz", 1)
    try:
        for k in range(SLOTS):
            if k == slot:
                continue
            fd = os.open(LOCK_DIR / f"slot-{k}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append(fd)
            except BlockingIOError:
                os.close(fd)
        t.create()
        assert t.slot == slot, f"expected the killed process's free slot {slot}, got {t.slot}"
        assert not set(got[0]["ns"]) & _netns_names(), "a reclaimed slot must start without the leftovers"
    finally:
        t.destroy()
        for fd in held:
            os.close(fd)
        for ns in set(got[0]["ns"]) & _netns_names():
            subprocess.run(["ip", "netns", "del", ns], timeout=30)


@pytest.mark.skipif(not shutil.which("nft"), reason="nftables (nft) is not installed")
@pytest.mark.timeout(600)
def test_two_drills_with_two_nodes_each_at_once_both_finish(tmp_path):
    """Two `titan drill --nodes 2` at once (they once shared tcd0/tcd1: the first made 0 steps)."""
    env = dict(os.environ)
    cmd = [sys.executable, "-m", "titan", "drill", "--plan", "loss1", "--nodes", "2", "--no-reference", "--json",
           "--timeout", "400"]
    procs = [subprocess.Popen(cmd + ["--runs-dir", str(tmp_path / f"runs{i}")], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
             for i in range(2)]
    try:
        outs = [p.communicate(timeout=500) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait(10)
    reps = [json.loads(o) for o, _ in outs]
    for rep, (_, err) in zip(reps, outs):
        assert rep["passed"] and rep["steps"] == rep["target_steps"], (rep["problems"], err[-2000:])
    assert not any(Path(r["run_dir"]) == Path(reps[0]["run_dir"]) for r in reps[1:])
