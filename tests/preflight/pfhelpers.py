"""Helpers: launch preflight jobs of several "nodes" (one torchrun agent each, c10d rendezvous)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Sequence


from titan.events import RunDir


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def run_nodes(tmp_path: Path, node_envs: Sequence[dict[str, str]], worker_args: Sequence[str], *,
              host: str = "127.0.0.1", addrs: Sequence[str] | None = None, netns: Sequence[str] | None = None,
              ifnames: Sequence[str] | None = None, timeout_s: float = 120) -> dict:
    """Start one torchrun agent per entry of ``node_envs``; return rank 0's verdict."""
    rd = RunDir.create(tmp_path, "pf")
    port = free_port() if netns is None else 29611
    n = len(node_envs)
    procs = []
    try:
        for i, extra in enumerate(node_envs):
            env = dict(os.environ, TITAN_RUN_DIR=str(rd.path), TITAN_RUN_ID=rd.run_id, TITAN_NODE_ID=f"node{i}",
                       TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", **extra)
            endpoint = f"{(addrs[0] if addrs else host)}:{port}"
            cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={n}", "--nproc-per-node=1",
                   "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=pf", "--max-restarts=0",
                   f"--rdzv-conf=is_host={1 if i == 0 else 0},join_timeout=60"]
            if addrs:
                cmd.append(f"--local-addr={addrs[i]}")
                env["GLOO_SOCKET_IFNAME"] = ifnames[i]
            cmd += ["-m", "titan.preflight.worker", *worker_args]
            if netns:
                cmd = ["ip", "netns", "exec", netns[i]] + cmd
            log = open(tmp_path / f"node{i}.log", "wb")
            procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True), log))
        for p, _ in procs:
            p.wait(timeout_s)
    finally:
        for p, log in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            log.close()
    out = rd.path / "preflight.json"
    logs = "\n".join((tmp_path / f"node{i}.log").read_text(errors="replace")[-2000:] for i in range(n))
    assert out.is_file(), f"no verdict written; node logs:\n{logs}"
    return json.loads(out.read_text())
