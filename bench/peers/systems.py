"""How each system is launched, and what it says about a fault (its own words).

A :class:`System` turns ``configs/<name>.toml`` into processes: the same script flags,
the same step log (``common/steplog.py``) and the same in-process faults for everyone;
launcher, flags and environment as that system's docs say. A :class:`Job` is one launch:
its processes (each launcher in its own session), their output files tailed live (every
line stamped with the harness's clock when seen, the same for every system), and the step
records of every worker process.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peers.venvs import HERE, ROOT, load_config, python_for, status

__all__ = ["Detection", "Job", "System", "SYSTEMS", "get", "free_port", "kill_job_processes", "run_bounded"]

SYSTEMS = ("titan", "torchft", "lm_resiliency", "nvrx", "torchrun")


def free_port() -> int:
    """A free TCP port on loopback (the kernel's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Detection:
    """A system noticed a fault: when (harness clock), what it said, whom it blamed."""

    t: float
    what: str
    culprit: int | None
    text: str

    @property
    def numeric(self) -> bool:
        """A notice about numbers or speed (a NaN, a spike, a straggler), not about a dead or hung rank."""
        return self.what.startswith(("guard.", "straggler"))


class _Tail:
    """New lines of a growing file; each stamped with the time it was first seen."""

    def __init__(self, path: Path) -> None:
        self.path, self.pos, self.buf = path, 0, b""
        self.lines: list[tuple[float, str]] = []

    def poll(self) -> list[tuple[float, str]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except FileNotFoundError:
            return []
        if not data:
            return []
        self.pos += len(data)
        now = time.time()
        *full, self.buf = (self.buf + data).split(b"\n")
        new = [(now, ln.decode("utf-8", "replace")) for ln in full]
        self.lines.extend(new)
        return new


@dataclass
class Job:
    """One launch of one system."""

    system: "System"
    dir: Path
    world: int
    procs: list[subprocess.Popen] = field(default_factory=list)
    outputs: list[Path] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    _tails: dict[Path, _Tail] = field(default_factory=dict)
    _out_tails: list[_Tail] = field(default_factory=list)

    @property
    def log_dir(self) -> Path:
        return self.dir / "log"

    def poll(self) -> list[dict[str, Any]]:
        """Read what is new (step records, output lines); returns the new step-log records."""
        new: list[dict[str, Any]] = []
        for p in sorted(self.log_dir.glob("*.jsonl")) if self.log_dir.exists() else []:
            tail = self._tails.setdefault(p, _Tail(p))
            for _, line in tail.poll():
                if line.strip():
                    new.append(json.loads(line))
        if len(self._out_tails) != len(self.outputs):
            self._out_tails = [_Tail(p) for p in self.outputs]
        for t in self._out_tails:
            t.poll()
        new.sort(key=lambda r: r["t"])
        self.records.extend(new)
        return new

    def output_lines(self) -> list[tuple[float, str, str]]:
        """Every launcher/worker output line seen so far: (time seen, line, file stem), in time order."""
        return sorted(((t, ln, tail.path.stem) for tail in self._out_tails for t, ln in tail.lines),
                      key=lambda x: x[0])

    def steps(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == "step"]

    def pid_of(self, rank: int) -> int | None:
        """The process that last reported for ``rank``."""
        for r in reversed(self.records):
            if r.get("rank") == rank:
                return int(r["pid"])
        return None

    def alive(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def worker_pids(self) -> set[int]:
        return {int(r["pid"]) for r in self.records}

    def stop(self, grace_s: float = 5.0) -> None:
        """End everything this job started: launchers by process group, workers by PID.

        torchrun's agent starts each worker in a session of its own, and a SIGKILLed
        launcher leaves them running (MACHINE-NOTES), so workers are ended by the PIDs
        they wrote to the step log (checked against their command line first).
        """
        self.poll()
        for p in self.procs:
            if p.poll() is None:
                _signal_group(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self.alive():
            time.sleep(0.1)
        for p in self.procs:
            _signal_group(p.pid, signal.SIGKILL)
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        kill_job_processes(self.dir, self.worker_pids())


def kill_job_processes(job_dir: Path, pids: set[int] | None = None) -> int:
    """SIGKILL every live process whose environment names ``job_dir`` (``PEERS_JOB_DIR``):
    workers in sessions of their own and the helpers peers spawn (rank monitors, hang
    daemons). ``pids`` are checked first; then ``/proc`` is swept. Returns how many."""
    marker, n = str(job_dir), 0
    candidates = set(pids or ()) | {int(d) for d in os.listdir("/proc") if d.isdigit()}
    for pid in candidates:
        if pid != os.getpid() and _ours(pid, marker):
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    break
            n += 1
    return n


def run_bounded(cmd: list[str], *, cwd: Path, env: dict[str, str], out: Path, timeout_s: float) -> int | None:
    """Run a launcher to its end; after ``timeout_s`` kill it and everything of its job
    (``kill_job_processes``). Returns its exit status, None when it was killed."""
    env = {**env, "PEERS_JOB_DIR": str(cwd)}
    with open(out, "wb") as f:
        p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        return p.wait(timeout_s)
    except subprocess.TimeoutExpired:
        _signal_group(p.pid, signal.SIGKILL)
        kill_job_processes(cwd)
        p.wait(10)
        return None
    finally:
        kill_job_processes(cwd)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _ours(pid: int, marker: str) -> bool:
    """``pid`` is alive and one of this job's processes (its environment names the job dir)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"PEERS_JOB_DIR={marker}".encode() in env.split(b"\0")


class System:
    """One system under test, configured by ``configs/<name>.toml``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.cfg = load_config(name)
        self.settings = {k: v["value"] for k, v in self.cfg.get("settings", {}).items()}

    @property
    def python(self) -> Path:
        return python_for(self.cfg)

    def unavailable(self) -> str | None:
        """Why this system cannot run here (None: it can)."""
        st = status(self.cfg)
        return None if st["ok"] else st["reason"]

    def versions(self) -> dict[str, Any]:
        return status(self.cfg)["versions"]

    # -- launching -----------------------------------------------------------------
    def env(self, job: Job, faults: list[dict[str, Any]]) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TITAN_", "TORCHELASTIC_", "PEERS_"))}
        env.update({
            "PYTHONPATH": f"{ROOT / 'src'}:{ROOT / 'bench'}",
            "PYTHONUNBUFFERED": "1",
            "PEERS_LOG_DIR": str(job.log_dir),
            "PEERS_FAULTS": json.dumps(faults),
            "PEERS_CONFIG": json.dumps({k: v for k, v in self.settings.items() if not isinstance(v, dict)}),
            "PEERS_JOB_DIR": str(job.dir),
            "CUDA_VISIBLE_DEVICES": "",
            "OMP_NUM_THREADS": "1",
        })
        return env

    def script_args(self, job: Job, steps: int, wl: dict[str, Any]) -> list[str]:
        return [str(HERE / self.cfg["script"]), "--steps", str(steps), "--seed", str(wl["seed"]),
                "--preset", wl["preset"], "--batch-size", str(wl["batch_size"]),
                "--ckpt-every", str(wl["ckpt_every"]), "--ckpt-dir", str(job.dir / "ckpt"),
                "--threads", str(wl["threads"])]

    def launch(self, job_dir: Path, world: int, steps: int, wl: dict[str, Any],
               faults: list[dict[str, Any]] | None = None) -> Job:
        """Start the system on ``world`` ranks for ``steps`` steps; returns at once."""
        job_dir = job_dir.resolve()
        job_dir.mkdir(parents=True, exist_ok=True)
        job = Job(system=self, dir=job_dir, world=world)
        job.log_dir.mkdir(exist_ok=True)
        self._start(job, steps, wl, self.env(job, list(faults or [])))
        return job

    def _spawn(self, job: Job, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        out = job.dir / f"{name}.out"
        with open(out, "ab") as f:
            p = subprocess.Popen(cmd, cwd=job.dir, env=env, stdout=f, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        job.procs.append(p)
        job.outputs.append(out)
        return p

    def _start(self, job: Job, steps: int, wl: dict[str, Any], env: dict[str, str]) -> None:
        raise NotImplementedError

    def before_fault(self, job: Job, kind: str, rank: int, pid: int) -> None:
        """Called just before the harness signals ``pid`` (a system may be told, as its drills are)."""

    # -- what the system said ------------------------------------------------------
    def detections(self, job: Job, since: float) -> list[Detection]:
        """The system's own notices of a fault after ``since``, from its output lines."""
        out: list[Detection] = []
        for t, line, source in job.output_lines():
            if t < since:
                continue
            for what, pattern in self.patterns():
                m = re.search(pattern, line)
                if m:
                    culprit = m.groupdict().get("rank")
                    if culprit is None and "(?P<source>" in pattern:
                        culprit = re.sub(r"\D", "", source) or None
                    out.append(Detection(t=t, what=what, culprit=int(culprit) if culprit is not None else None,
                                         text=line.strip()[:300]))
                    break
        return out

    def patterns(self) -> list[tuple[str, str]]:
        """(what, regex with an optional ``rank`` group) for this system's output."""
        return []


class Torchrun(System):
    def _start(self, job: Job, steps: int, wl: dict[str, Any], env: dict[str, str]) -> None:
        if self.settings.get("disable_shared_rdzv_store"):
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        cmd = [str(self.python), "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(job.world),
               "--max-restarts", str(self.settings["max_restarts"]), "--rdzv-backend", self.settings["rdzv_backend"],
               "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", job.dir.name,
               *self.script_args(job, steps, wl)]
        self._spawn(job, "torchrun", cmd, env)

    def patterns(self) -> list[tuple[str, str]]:
        # torch.distributed.elastic's agent: "failed (exitcode: -9) local_rank: 1 (pid: …)"
        return [("worker failed", r"failed \(exitcode: -?\d+\) local_rank: (?P<rank>\d+)"),
                ("pg timeout", r"Timed out waiting \d+ms|DistBackendError|Connection closed by peer")]


class Titan(System):
    def _start(self, job: Job, steps: int, wl: dict[str, Any], env: dict[str, str]) -> None:
        env["XDG_STATE_HOME"] = str(job.dir / "state")
        cmd = [str(self.python), "-m", "titan", "run", "--nproc-per-node", str(job.world),
               "--max-restarts", str(self.settings["max_restarts"]), "--runs-dir", str(job.dir / "runs"),
               "--run-id", "run", "--set", f"checkpoint.every_steps={wl['ckpt_every']}",
               "--set", f"checkpoint.snapshot_every_steps={self.settings['snapshot_every_steps']}",
               "--set", f"watchdog.ledger_path={job.dir / 'ledger.sqlite'}", "--",
               *self.script_args(job, steps, wl)]
        self._spawn(job, "titan", cmd, env)

    def run_dir(self, job: Job) -> Path:
        return job.dir / "runs" / "run"

    def before_fault(self, job: Job, kind: str, rank: int, pid: int) -> None:
        """Announce the deliberate fault as Titan's own drills do: an ``inject.*`` event in the
        run directory, so that the node ledger does not strike the node for it
        (``watchdog.strike_injected = false``, docs/hang.md) and the accounting knows the onset."""
        from titan.events import EventWriter

        events = self.run_dir(job) / "events"
        if not events.is_dir():
            return
        w = EventWriter(events / "peers-harness.jsonl", run="run", node=socket.gethostname())
        try:
            w.emit(f"inject.{kind}", f"bench/peers: {'SIGKILL' if kind == 'kill' else 'SIGSTOP'} to rank {rank}",
                   data={"rank": rank, "pid": pid, "t_onset": time.time(), "by": "bench/peers"})
        finally:
            w.close()

    def detections(self, job: Job, since: float) -> list[Detection]:
        """From Titan's own events (run directory), not from its terminal output."""
        from titan.events import read_run  # the main venv runs the harness

        out: list[Detection] = []
        if not self.run_dir(job).exists():
            return out
        for e in read_run(self.run_dir(job)).events:
            if e.t < since:
                continue
            d = e.data or {}
            if e.kind == "worker.failed":
                # exit 10 is Titan's "communication error" class: a consequence, not a culprit
                consequence = d.get("exit_code") == 10
                out.append(Detection(t=e.t, what="worker.failed" + (" (comm error)" if consequence else ""),
                                     culprit=None if consequence else d.get("global_rank"), text=e.msg[:300]))
            elif e.kind == "hang.detected":
                out.append(Detection(t=e.t, what=e.kind, culprit=(d.get("culprit") or {}).get("rank"),
                                     text=e.msg[:300]))
            elif e.kind in ("guard.nonfinite", "guard.spike"):
                ranks = d.get("ranks") or []
                out.append(Detection(t=e.t, what=e.kind, culprit=ranks[0] if len(ranks) == 1 else None,
                                     text=e.msg[:300]))
            elif e.kind == "straggler.detected":
                out.append(Detection(t=e.t, what=e.kind, culprit=d.get("rank"), text=e.msg[:300]))
        return sorted(out, key=lambda x: x.t)


class Torchft(System):
    def _start(self, job: Job, steps: int, wl: dict[str, Any], env: dict[str, str]) -> None:
        bindir = self.python.parent
        port = free_port()
        lh = [str(bindir / "torchft_lighthouse"), "--min_replicas", "1", "--quorum_tick_ms", "100",
              "--join_timeout_ms", "10000", "--heartbeat_timeout_ms", str(self.settings["heartbeat_timeout_ms"]),
              "--bind", f"127.0.0.1:{port}"]
        self._spawn(job, "lighthouse", lh, env)
        env = {**env, "TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{port}", "NUM_REPLICA_GROUPS": str(job.world)}
        _wait_port(port, 30)
        for r in range(job.world):
            cmd = [str(self.python), "-m", "torch.distributed.run", "--master_addr", "127.0.0.1",
                   "--master_port", str(free_port()), "--nnodes", "1", "--nproc_per_node", "1",
                   "--max_restarts", str(self.settings["max_restarts"]), *self.script_args(job, steps, wl)]
            self._spawn(job, f"replica{r}", cmd, {**env, "REPLICA_GROUP_ID": str(r)})

    def patterns(self) -> list[tuple[str, str]]:
        # each replica's own torchrun reports its worker (local_rank 0): the file names the replica
        return [("replica failed", r"(?P<source>)failed \(exitcode: -?\d+\) local_rank"),
                ("lighthouse: replica lost", r"torchft::lighthouse.*replica train_ddp_(?P<rank>\d+).*(expired|timed out|dead|removed)"),
                ("commit failed", r"should_commit=false"),
                ("pg error", r"Timed out waiting \d+ms|errored=Some|ExceptionWithTraceback")]


class Nvrx(System):
    def _start(self, job: Job, steps: int, wl: dict[str, Any], env: dict[str, str]) -> None:
        cfg = job.dir / "fault_tol_cfg_heartbeats.yaml"
        cfg.write_text("fault_tolerance:\n    initial_rank_heartbeat_timeout: null\n"
                       "    rank_heartbeat_timeout: null\n"
                       f"    log_level: \"{self.settings['log_level']}\"\n")
        cmd = [str(self.python.parent / "ft_launcher"), "--nnodes", "1", "--nproc-per-node", str(job.world),
               "--max-restarts", str(self.settings["max_restarts"]), "--ft-restart-policy",
               self.settings["restart_policy"], "--rdzv-backend", "c10d", "--rdzv-endpoint",
               f"127.0.0.1:{free_port()}", "--rdzv-id", job.dir.name, "--ft-cfg-path", str(cfg),
               *self.script_args(job, steps, wl)]
        self._spawn(job, "ft_launcher", cmd, env)

    def patterns(self) -> list[tuple[str, str]]:
        # the launcher names a dead worker; each rank's monitor (RankMonServer<pid>@<host>:<local rank>)
        # reports its own rank's missing heartbeat
        return [("worker failed", r"failed \(exitcode: -?\d+\) local_rank: (?P<rank>\d+)"),
                ("heartbeat timeout", r"RankMonServer\d+@[^:\]]+:(?P<rank>\d+)\] Did not get (initial|subsequent) heartbeat")]


def _wait_port(port: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout_s:.0f} s")


class LmResiliency(Torchrun):
    def env(self, job: Job, faults: list[dict[str, Any]]) -> dict[str, str]:
        env = super().env(job, faults)
        cfg = json.loads(env["PEERS_CONFIG"])
        cfg["run_id"] = job.dir.name
        env["PEERS_CONFIG"] = json.dumps(cfg)
        return env

    def patterns(self) -> list[tuple[str, str]]:
        return [*super().patterns(),
                ("scout fault", r"SCOUT fault at step"),
                ("scout hang", r"(?i)SCOUT.*(hang|stall)|hang detected")]


_CLASSES = {"titan": Titan, "torchrun": Torchrun, "torchft": Torchft, "nvrx": Nvrx, "lm_resiliency": LmResiliency}


def get(name: str) -> System:
    """The system named ``name`` (one of :data:`SYSTEMS`)."""
    return _CLASSES.get(name, System)(name)
