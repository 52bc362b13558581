"""Network-namespace "nodes", each with a private folder at one path, running `titan run`.

Each node runs in its own network namespace (``titan.chaos.netns``) with its own mount
namespace in which ``<base>/node<i>-private`` is bind-mounted over ``<base>/local``
(``titan.chaos.private``): the same path, different contents per node — node-local disks.
Killing a node kills its launcher, workers and node agent by PID.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from titan.chaos.netns import Topology
from titan.chaos.private import node_folder, private_prefix

sys.path.insert(0, str(Path(__file__).parent))
from _sockets import kill_tree, process_tree  # noqa: E402


class NetCluster:
    def __init__(self, base: Path, n: int, *, tag: str = "tmn", private: bool = True) -> None:
        self.base, self.n, self.private = base, n, private
        self.local = base / "local"
        self.local.mkdir(parents=True, exist_ok=True)
        self.topo = Topology(tag, n).create()
        self.port = random.randrange(20000, 60000)
        self.secret = "hex:" + os.urandom(32).hex()
        self.procs: dict[int, subprocess.Popen] = {}
        self.logs: dict[int, Path] = {}

    def folder(self, i: int) -> Path:
        """Node ``i``'s private folder as the host sees it (its ``local`` is this)."""
        return node_folder(self.base, i) if self.private else self.local

    def run_dir(self, i: int, run_id: str) -> Path:
        return self.folder(i) / "runs" / run_id

    def start(self, i: int, run_id: str, nnodes: str, script: Sequence[str], *, nproc: int = 2,
              sets: Sequence[str] = (), extra: Sequence[str] = (), node_id: str | None = None,
              host: int = 0, env: dict[str, str] | None = None) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "titan", "run", "--nnodes", nnodes, "--nproc-per-node", str(nproc),
               "--rdzv-endpoint", f"{self.topo.addr(host)}:{self.port}", "--local-addr", self.topo.addr(i),
               "--node-id", node_id or f"node{i}", "--run-id", run_id, "--runs-dir", str(self.local / "runs"),
               "--rdzv-conf", f"is_host={1 if i == host else 0}", "--max-restarts", "6", *extra]
        for s in sets:
            cmd += ["--set", s]
        cmd += ["--", *script]
        prefix = private_prefix(self.topo, i, self.folder(i), self.local) if self.private else self.topo.exec_prefix(i)
        e = dict(os.environ, GLOO_SOCKET_IFNAME=self.topo.ns_if(i), TITAN_RDZV_SECRET=self.secret,
                 PYTHONUNBUFFERED="1", **(env or {}))
        log = self.base / f"console-node{i}-{len(self.logs)}.log"
        self.logs[i] = log
        p = subprocess.Popen([*prefix, *cmd], env=e, cwd=self.base, stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                             start_new_session=True)
        self.procs[i] = p
        return p

    def kill(self, i: int) -> list[int]:
        """SIGKILL node ``i``'s launcher and every process under it (workers, node agent)."""
        p = self.procs[i]
        tree = sorted(process_tree(p.pid))
        kill_tree(p.pid)
        p.wait(10)
        return tree

    def lose_disk(self, i: int) -> None:
        shutil.rmtree(self.folder(i))

    def wait(self, timeout_s: float) -> dict[int, int | None]:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and any(p.poll() is None for p in self.procs.values()):
            time.sleep(0.2)
        return {i: p.poll() for i, p in self.procs.items()}

    def events(self, run_id: str, kind: str | None = None) -> list[dict[str, Any]]:
        out = []
        for i in range(self.n):
            rd = self.run_dir(i, run_id)
            for f in [*sorted((rd / "events").glob("*.jsonl")), *sorted(rd.glob("launcher.*.jsonl"))]:
                for line in f.read_text(errors="replace").splitlines():
                    try:
                        e = json.loads(line)
                    except ValueError:
                        continue
                    if kind is None or e.get("kind") == kind:
                        out.append(e)
        return sorted(out, key=lambda e: e["t"])

    def console(self) -> str:
        return "\n".join(f"--- {p.name}\n" + p.read_text(errors="replace")[-3000:]
                         for p in sorted(self.base.glob("console-node*.log")))

    def close(self) -> None:
        for i in list(self.procs):
            if self.procs[i].poll() is None:
                self.kill(i)
        self.topo.destroy()
