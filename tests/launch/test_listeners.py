"""Every socket a `titan run` job listens on binds the address asked for (loopback by default).

The job runs a plain torch script (no Titan import), so this covers what torch opens on
Titan's behalf: the rendezvous store and the per-round worker store in the launcher, gloo's
sockets in the workers, and the node agent's UDP probe. The control — torch's stock
rendezvous listening on every interface — is in ``test_rdzv_attack.py`` (one stock job
shows both the wildcard listener and the code execution).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from _sockets import kill_tree, listening, process_tree

TITAN = Path(sys.executable).with_name("titan")

SCRIPT = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    dist.all_reduce(torch.ones(1))
    here = Path(sys.argv[1])
    (here / f"ready.{dist.get_rank()}").write_text(str(os.getpid()))
    t0 = time.monotonic()
    while not (here / "done").exists() and time.monotonic() - t0 < 60:
        time.sleep(0.05)
''')


def _job_sockets(cmd: list[str], cwd: Path, ready: list[Path]) -> tuple[list, subprocess.Popen]:
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while not all(p.exists() for p in ready):
        if proc.poll() is not None or time.monotonic() > deadline:
            out = proc.communicate(timeout=10)[0] if proc.poll() is not None else "(still running)"
            raise AssertionError(f"job did not get ready (rc {proc.returncode}):\n{out[-3000:]}")
        time.sleep(0.1)
    return listening(process_tree(proc.pid)), proc


def _finish(proc: subprocess.Popen, cwd: Path) -> str:
    (cwd / "done").write_text("")
    try:
        return proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait(10)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("local_addr", [None, "127.0.0.2"])
def test_every_listening_socket_of_a_job_binds_the_address_asked_for(tmp_path, local_addr):
    (tmp_path / "w.py").write_text(SCRIPT)
    want = local_addr or "127.0.0.1"
    cmd = [str(TITAN), "run", "--nproc-per-node", "2", "--run-id", "lst", "--set", "agent.interval_s=0.2"]
    if local_addr:
        cmd += ["--local-addr", local_addr]
    cmd += ["--", "w.py", str(tmp_path)]
    probe_file = tmp_path / "runs" / "lst" / "metrics"
    socks, proc = _job_sockets(cmd, tmp_path, [tmp_path / "ready.0", tmp_path / "ready.1"])
    try:
        deadline = time.monotonic() + 20  # the node agent binds its probe once it is up
        while not any(probe_file.glob("probe.*.json")) and time.monotonic() < deadline:
            time.sleep(0.1)
        socks = listening(process_tree(proc.pid))
        listing = "\n".join(map(str, socks))
        launcher = [s for s in socks if s.pid == proc.pid]
        agent = [s for s in socks if " agent " in s.cmd]
        workers = [s for s in socks if s not in launcher and s not in agent]
        assert len([s for s in launcher if s.proto.startswith("tcp")]) >= 2, \
            f"expected the rendezvous and the worker store in the launcher:\n{listing}"
        assert {s.pid for s in workers} and all(s.proto.startswith("tcp") for s in workers), listing
        assert [s for s in agent if s.proto.startswith("udp")], f"expected the agent's UDP probe:\n{listing}"
        for s in launcher + agent:
            assert s.addr == want, f"{s} should listen on {want} only:\n{listing}"
        for s in workers:  # gloo binds the chosen interface's (lo's) first address
            assert s.addr == "127.0.0.1", f"{s}: gloo should be on lo's address:\n{listing}"
    finally:
        out = _finish(proc, tmp_path)
    assert proc.returncode == 0, out[-3000:]
    assert f"listening on {want}" in out, f"the start line should say where the job listens:\n{out[:2000]}"
    if local_addr:
        assert f"127.0.0.1, not {local_addr}: torch cannot bind a chosen address there" in out, \
            f"the start line should say where gloo listens instead:\n{out[:2000]}"
