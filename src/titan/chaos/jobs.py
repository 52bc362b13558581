"""The drilled job's processes: the ``titan run`` command line, start, stop by PID.

The job is the user's script (``titan drill -- train.py ARGS``) or, without one, the reference
workload tinygpt.

One drill engine (:mod:`titan.chaos.drills`) starts every job through here — the faulty run,
its resubmissions after a preemption and the clean reference runs — so they differ only in
their environment and settings.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from titan.events import RunDir
from titan.settings.env import TITAN_FINAL_STATE
from titan.settings.env import TITAN_RDZV_SECRET

if TYPE_CHECKING:
    from titan.chaos.drills import PlanDrill

__all__ = ["Job", "job_cmd", "start_job", "stop_tree", "kill_tree", "restarts_for", "final_state", "node_ckpt_dir"]

#: Fault kinds whose recovery is a restart of the worker group.
RESTART_KINDS = frozenset({"kill", "hang", "exception", "disk", "net", "node_loss"})


def final_state(rd: RunDir) -> Path:
    """Where a drilled run's ranks write the digest of their final state (``.rank<r>.json`` added)."""
    return rd.path / "chaos" / "final"


def restarts_for(cfg: "PlanDrill") -> int:
    """Restarts the plan may need: one per restarting fault."""
    return sum(1 for f in cfg.plan.faults if f.kind in RESTART_KINDS)


def stop_tree(proc: subprocess.Popen, grace_s: float = 15.0) -> None:  # type: ignore[type-arg]
    """End the launcher and every worker under it, by PID (SIGKILL of torchrun leaves workers)."""
    import psutil

    if proc.poll() is not None:
        return
    try:
        kids = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        kids = []
    proc.send_signal(signal.SIGTERM)  # the agent forwards it to the workers
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    for k in kids:
        try:
            k.kill()
        except psutil.Error:
            pass


def kill_tree(proc: subprocess.Popen, wait_s: float = 10.0) -> list[int]:  # type: ignore[type-arg]
    """SIGKILL ``proc`` and every process under it at once (a node dying: its launcher,
    workers and node agent get no chance to react), by PID; waits up to ``wait_s`` for
    ``proc``. Returns the PIDs signalled. Raises ``subprocess.TimeoutExpired`` if it lives on."""
    import psutil

    try:
        tree = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    except psutil.Error:
        tree = [proc.pid]
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(wait_s)
    return tree


def node_ckpt_dir(rd: RunDir, i: int) -> Path:
    """Where the host sees node ``i``'s own checkpoint folder in a ``node_local`` drill (the
    node itself sees it at ``<run>/checkpoints``; titan.chaos.private)."""
    from titan.chaos.private import node_folder

    return node_folder(rd.path / "chaos", i)


#: Where namespace nodes keep their in-memory snapshots (tmpfs, like the default ``/dev/shm/titan``).
NODE_MEMORY_ROOT = Path("/dev/shm/titan-drill")


def node_memory_dir(rd: RunDir, i: int) -> Path:
    """Node ``i``'s own ``checkpoint.snapshot_dir`` in a multi-node drill: on one machine every
    namespace node would otherwise read the others' ``/dev/shm``; a lost node loses it."""
    import hashlib

    key = hashlib.sha256(str(rd.path.resolve()).encode()).hexdigest()[:10]
    return NODE_MEMORY_ROOT / f"{rd.run_id}-{key}" / f"node{i}"


def job_cmd(cfg: "PlanDrill", rd: RunDir, *, node: int | None = None, topo: Any = None,
            port: int = 29517, sets: list[str] | None = None, launcher_args: tuple[str, ...] = ()) -> list[str]:
    """``titan run …`` for one node of the drilled job: the user's script (``cfg.script``,
    checkpointing every ``cfg.ckpt_every`` steps) or tinygpt."""
    cmd = [sys.executable, "-m", "titan", "run", "--max-restarts", str(restarts_for(cfg) + 2),
           "--runs-dir", str(rd.path.parent), "--run-id", rd.run_id, *launcher_args]
    if topo is not None and node is not None:
        if getattr(cfg, "node_local", False):
            from titan.chaos.private import private_prefix

            prefix = private_prefix(topo, node, node_ckpt_dir(rd, node), rd.checkpoints)
        else:
            prefix = topo.exec_prefix(node)
        cmd = prefix + cmd + [
            "--nnodes", str(cfg.nodes), "--nproc-per-node", str(cfg.nproc // cfg.nodes),
            "--rdzv-endpoint", f"{topo.addr(0)}:{port}", "--local-addr", topo.addr(node), "--node-id", f"node{node}",
            "--rdzv-conf", f"is_host={1 if node == 0 else 0},last_call_timeout=3,keep_alive_interval=1,"
                           "keep_alive_max_attempt=3", "--set", f"checkpoint.snapshot_dir={node_memory_dir(rd, node)}"]
    else:
        cmd += ["--nproc-per-node", str(cfg.nproc), "--node-id", "node0"]
    for s in sets or []:
        cmd += ["--set", s]
    if cfg.script:
        return cmd + ["--set", f"checkpoint.every_steps={cfg.ckpt_every}", "--", *cfg.script]
    return cmd + ["--", "-m", "titan.workloads.tinygpt", "--steps", str(cfg.steps), "--ckpt-every",
                  str(cfg.ckpt_every), "--seed", str(cfg.seed), "--threads", "1", "--log-every", "0",
                  *cfg.workload_args]


class Job:
    """The launcher process(es) of one submission (one per node); ``restart_node(i)`` starts
    node ``i``'s launcher again (a replacement node) when the job was started per node."""

    def __init__(self, procs: list[subprocess.Popen],  # type: ignore[type-arg]
                 starter: Any = None) -> None:
        self.procs = procs
        self.gone: list[subprocess.Popen] = []  # type: ignore[type-arg]  # launchers replaced
        self._starter = starter

    def restart_node(self, i: int) -> subprocess.Popen:  # type: ignore[type-arg]
        """Start node ``i``'s launcher again (the old one must be dead); ``TitanError`` if
        this job was not started per node."""
        from titan.errors import TitanError

        if self._starter is None:
            raise TitanError("this job has no per-node launchers to start again")
        self.gone.append(self.procs[i])
        self.procs[i] = self._starter(i)
        return self.procs[i]

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def codes(self) -> list[int | None]:
        return [p.returncode for p in self.procs]

    def stop(self) -> None:
        for p in self.procs:
            stop_tree(p, grace_s=10)


def start_job(cfg: "PlanDrill", rd: RunDir, env: dict[str, str], topo: Any, sets: list[str],
              cwd: Path, log_fh: Any, launcher_args: tuple[str, ...] = ()) -> Job:
    """Start one submission of the job (one launcher per node); output goes to ``log_fh``.
    Every rank's ``Checkpointer.close()`` writes the final state's digest to
    ``<run>/chaos/final.rank<r>.json`` (``TITAN_FINAL_STATE``, ``titan.checkpoint.digest``)."""
    env = dict(env, **{TITAN_FINAL_STATE: str(final_state(rd))})
    procs = []
    if topo is None:
        procs.append(subprocess.Popen(job_cmd(cfg, rd, sets=sets, launcher_args=launcher_args), cwd=cwd, env=env,
                                      stdout=log_fh,
                                      stderr=subprocess.STDOUT, start_new_session=True))
    else:
        # One random rendezvous secret shared by the drill's nodes (docs/security.md).
        secret = env.get(TITAN_RDZV_SECRET) or "hex:" + os.urandom(32).hex()

        def start(i: int) -> subprocess.Popen:  # type: ignore[type-arg]
            e = dict(env, GLOO_SOCKET_IFNAME=topo.ns_if(i), TITAN_NODE_ID=f"node{i}", **{TITAN_RDZV_SECRET: secret})
            return subprocess.Popen(job_cmd(cfg, rd, node=i, topo=topo, sets=sets, launcher_args=launcher_args),
                                    cwd=cwd, env=e, stdout=log_fh, stderr=subprocess.STDOUT, start_new_session=True)
        return Job([start(i) for i in range(cfg.nodes)], starter=start)
    return Job(procs)
