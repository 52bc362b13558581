#!/usr/bin/env python3
"""A real two-node Slurm cluster on this one machine, for tests and for trying the recipes.

Debian's Slurm is built with MULTIPLE_SLURMD, so two ``slurmd -N n1|n2`` on one host form
two nodes. Each slurmd can run in its own mount namespace with a private folder bind-mounted
over a shared path (``--private PATH``): jobs on n1 and n2 then see *different* contents at
that path, as node-local storage on a real cluster would look.

    python scripts/slurm_cluster.py up   --dir /tmp/slurm [--private /local]   # prints env
    python scripts/slurm_cluster.py down --dir /tmp/slurm

``up`` writes ``<dir>/env.sh`` (``SLURM_CONF``) and ``<dir>/pids``; ``down`` stops exactly those
PIDs. Needs root and Debian's ``slurm-wlm`` and ``munge`` (``.ci/run`` installs them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

NODES = ("n1", "n2")


def _free_ports(n: int) -> list[int]:
    """n distinct free TCP ports on loopback, consecutive where possible (slurm wants a range)."""
    for _ in range(200):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1]
        s.close()
        if base + n >= 65000:
            continue
        ok = True
        for p in range(base, base + n):
            t = socket.socket()
            try:
                t.bind(("127.0.0.1", p))
            except OSError:
                ok = False
            finally:
                t.close()
            if not ok:
                break
        if ok:
            return list(range(base, base + n))
    raise RuntimeError("no run of free ports found")


def _conf(d: Path, host: str, ctl_port: int, node_ports: list[int]) -> str:
    cpus = os.cpu_count() or 2
    return f"""# written by scripts/slurm_cluster.py
ClusterName=titan
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctl_port}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge/munge.socket.2
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MailProg=/bin/true
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=10
MinJobAge=300
NodeName=n[1-2] NodeHostname={host} NodeAddr=127.0.0.1 Port=[{node_ports[0]}-{node_ports[-1]}] CPUs={cpus} RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


def _spawn(argv: list[str], log: Path) -> int:
    f = open(log, "ab")
    p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    return p.pid


def _wait(pred, timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.3)
    raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def up(d: Path, private: str | None) -> dict[str, str]:
    for b in ("munged", "slurmctld", "slurmd", "sinfo"):
        if not shutil.which(b) and not Path(f"/usr/sbin/{b}").exists():
            raise SystemExit(f"slurm_cluster: {b} not found (apt-get install slurm-wlm munge)")
    d = d.resolve()
    for sub in ("munge", "state", "spool/n1", "spool/n2", "node/n1", "node/n2"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(d / "munge", 0o700)
    key = d / "munge" / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
    host = socket.gethostname()
    ports = _free_ports(3)
    conf = d / "slurm.conf"
    conf.write_text(_conf(d, host, ports[0], ports[1:]))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    pids: dict[str, int] = {}
    pids["munged"] = _spawn(["munged", "-F", "-f", "--key-file", str(key), "-S", str(d / "munge/munge.socket.2"),
                             "--pid-file", str(d / "munge/munged.pid"), "--log-file", str(d / "munge/munged.log"),
                             "--seed-file", str(d / "munge/munged.seed")], d / "munged.out")
    _wait(lambda: (d / "munge/munge.socket.2").exists(), 15, "munged's socket")
    pids["slurmctld"] = _spawn(["slurmctld", "-D", "-i", "-f", str(conf)], d / "slurmctld.out")
    for i, n in enumerate(NODES):
        cmd = ["slurmd", "-D", "-N", n, "-f", str(conf)]
        if private:
            # Own mount namespace: <dir>/node/<n> appears at PRIVATE for this node's jobs only.
            cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                   f'mkdir -p "{private}" && mount --bind "{d}/node/{n}" "{private}" && exec "$@"', "sh", *cmd]
        pids[f"slurmd-{n}"] = _spawn(cmd, d / f"slurmd.{n}.out")
    (d / "pids").write_text(json.dumps(pids))
    (d / "env.sh").write_text(f"export SLURM_CONF={conf}\n")

    def idle() -> bool:
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=env, capture_output=True, text=True)
        states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
        return all(states.get(n, "").startswith("idle") for n in NODES)
    try:
        _wait(idle, 60, "both slurmd nodes idle (see <dir>/slurmctld.log)")
    except RuntimeError:
        down(d)
        raise
    return {"SLURM_CONF": str(conf)}


def down(d: Path) -> None:
    pf = d / "pids"
    if not pf.exists():
        return
    pids = json.loads(pf.read_text())
    for name in ("slurmd-n2", "slurmd-n1", "slurmctld", "munged"):
        pid = pids.get(name)
        if not pid:
            continue
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    end = time.monotonic() + 10
    for pid in pids.values():
        while time.monotonic() < end:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    pf.unlink()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("verb", choices=("up", "down"))
    ap.add_argument("--dir", required=True, type=Path)
    ap.add_argument("--private", help="path each node sees as its own private folder")
    a = ap.parse_args()
    if a.verb == "up":
        print(json.dumps(up(a.dir, a.private)))
    else:
        down(a.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
