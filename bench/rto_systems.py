"""The systems of bench/rto.py's recovery comparison (issue 23): one script, three recovery paths.

Every one runs the same tinygpt job (``python -m titan.workloads.tinygpt``, 2 local ranks,
gloo, the same seed, flags and disk-checkpoint cadence):

* ``titan_fast``  ``titan run`` with per-step in-memory snapshots
  (``checkpoint.snapshot_every_steps=1``) and warm workers (``warm.enabled=true``);
* ``titan_cold``  ``titan run`` with both off (the defaults: disk checkpoint, cold interpreter);
* ``torchrun``    plain ``torchrun --standalone`` of the same module, with the store setting
  Titan uses (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, ``run.disable_shared_rdzv_store``), the
  same monitor interval (``run.monitor_interval_s`` = 0.1 s) and the same restart budget. The
  workers still write Titan's events (``TITAN_RUN_DIR``), which is where the harness reads them.

A fault is placed with the chaos plan's gate (``titan.chaos.runtime``): the target rank waits
at the start of step S+1 until the harness has signalled it, so every system loses the same
work. The step records :func:`rto.analyse` reads come from the workers' events:

* ``start``     the replacement process was created (``/proc/<pid>/stat``: the fork of a warm
  worker, the ``exec`` of a cold one; read when its first event is seen; 10 ms ticks);
* ``announce``  ``worker.started`` (interpreter, imports, worker context);
* ``ready``     ``dist.init_ok`` (process group formed);
* ``restored``  ``ckpt.loaded`` / ``ckpt.none`` (state restored);
* a ``step``    record per ``step`` event;
* ``restart``   Titan's ``launcher.restart`` (the launcher decided); for torchrun its agent's
  ``failed (exitcode: …) local_rank: N`` line, stamped when the harness saw it (≤ 50 ms late).
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from peers.systems import Detection, Job, System, _Tail

__all__ = ["SAME_SCRIPT", "SameScript", "EventJob", "reference_digests"]

SAME_SCRIPT = ("titan_fast", "titan_cold", "torchrun")
_SETS = {
    "titan_fast": ["checkpoint.snapshot_every_steps=1", "warm.enabled=true"],
    "titan_cold": ["checkpoint.snapshot_every_steps=0", "warm.enabled=false"],
}
_MARKS = {"worker.started": "announce", "dist.init_ok": "ready", "ckpt.loaded": "restored", "ckpt.none": "restored"}
_HZ = os.sysconf("SC_CLK_TCK")


def _btime() -> float:
    """Boot time, wall clock, to ~10 ms (``/proc/stat``'s ``btime`` is whole seconds: start
    times from it were up to 1 s early, before the launcher's restart)."""
    try:
        return time.time() - float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    return 0.0


_BOOT = _btime()


def _proc_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) ``pid`` has used so far; None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _HZ


def _proc_start(pid: int) -> float | None:
    """Wall time ``pid`` was created (10 ms resolution); None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return _BOOT + int(fields[19]) / _HZ


@dataclasses.dataclass
class EventJob(Job):
    """A job whose records come from Titan's events in its run directory (see the module doc)."""

    rd: Any = None
    plan: Any = None
    final: Path | None = None
    gates: dict[tuple[int, int], dict[str, Any]] = dataclasses.field(default_factory=dict)
    _events: Any = None
    _seen: set[int] = dataclasses.field(default_factory=set)

    def poll(self) -> list[dict[str, Any]]:
        from titan.events.tail import EventTail

        if self._events is None:
            self._events = EventTail(self.rd)
        new: list[dict[str, Any]] = []
        for ev in self._events.poll():
            d = ev.data or {}
            base = {"t": ev.t, "pid": ev.pid, "rank": ev.rank, "attempt": ev.attempt or 0}
            if ev.rank is not None and ev.pid and ev.pid not in self._seen:
                self._seen.add(ev.pid)
                t0 = _proc_start(ev.pid)
                if t0 is not None:
                    new.append({**base, "kind": "mark", "what": "start", "t": t0})
            if ev.kind == "step" and ev.rank is not None and ev.step is not None:
                new.append({**base, "kind": "step", "step": int(ev.step),
                            "t_start": ev.t - float(d.get("step_time_s") or 0.0)})
            elif ev.kind in _MARKS and ev.rank is not None:
                new.append({**base, "kind": "mark", "what": _MARKS[ev.kind], "step": d.get("step", ev.step or 0),
                            "source": d.get("source"), "spawn": d.get("spawn")})
            elif ev.kind == "launcher.restart":
                new.append({**base, "kind": "mark", "what": "restart", "rank": None})
            elif ev.kind == "chaos.gate" and ev.rank is not None:
                self.gates[(int(ev.rank), int(ev.step or 0))] = {"fault": d.get("fault"), "pid": ev.pid}
        if len(self._out_tails) != len(self.outputs):
            self._out_tails = [_Tail(p) for p in self.outputs]
        for t in self._out_tails:
            t.poll()
        for r in new:  # CPU the process had used when the harness saw the record (a load-independent clue)
            if r.get("rank") is not None and r["kind"] != "mark" or r.get("what") in ("announce", "ready", "restored"):
                cpu = _proc_cpu(int(r["pid"])) if r.get("pid") else None
                if cpu is not None:
                    r["cpu_s"] = cpu
        new.sort(key=lambda r: r["t"])
        self.records.extend(new)
        return new


class SameScript(System):
    """One of :data:`SAME_SCRIPT`; ``wl`` keys: ``ckpt_every`` (disk cadence), ``sets`` (extra
    ``titan run --set`` items for the two Titan systems; plain torchrun has no such settings)."""

    def __init__(self, name: str) -> None:
        if name not in SAME_SCRIPT:
            raise ValueError(f"unknown system {name!r}")
        self.name, self.cfg, self.settings = name, {}, {}

    @property
    def python(self) -> Path:
        return Path(sys.executable)

    def unavailable(self) -> str | None:
        return None

    def versions(self) -> dict[str, Any]:
        import torch

        return {"torch": torch.__version__}

    def launch(self, job_dir: Path, world: int, steps: int, wl: dict[str, Any],
               faults: list[dict[str, Any]] | None = None) -> Job:
        """Start the job; ``faults`` (``{"kind": "kill"|"stop", "rank", "step"}``, step = completed
        steps before the signal) become chaos gates. Returns at once."""
        from titan.chaos.drills import PlanDrill, _base_sets
        from titan.chaos.jobs import final_state, job_cmd
        from titan.chaos.plan import Plan
        from titan.chaos.runtime import chaos_dir
        from titan.events import RunDir
        from titan.settings.env import TITAN_FINAL_STATE

        job_dir = job_dir.resolve()
        job_dir.mkdir(parents=True, exist_ok=True)
        plan = Plan(name="rto")
        for f in faults or []:  # the gate counts steps from 1: "at step S+1" fires once S completed
            if f["kind"] not in ("kill", "stop"):
                continue
            plan = getattr(plan, "kill" if f["kind"] == "kill" else "stop")(rank=f["rank"], step=f["step"] + 1)
        cfg = PlanDrill(plan=plan, steps=steps, ckpt_every=wl["ckpt_every"], runs_dir=job_dir / "runs",
                        timeout_s=600.0, reference=False)
        rd = RunDir.create(cfg.runs_dir, "run")
        job = EventJob(system=self, dir=job_dir, world=world, rd=rd, plan=plan, final=final_state(rd))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TITAN_", "TORCHELASTIC_", "PEERS_"))}
        env.update({"TITAN_CHAOS_PLAN": str(plan.save(chaos_dir(rd.path) / "plan.json")),
                    "TITAN_WATCHDOG_LEDGER_PATH": str(rd.path / "ledger.sqlite"), TITAN_FINAL_STATE: str(job.final),
                    "PEERS_JOB_DIR": str(job_dir), "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
                    "PYTHONUNBUFFERED": "1", "XDG_STATE_HOME": str(job_dir / "state")})
        if self.name == "torchrun":  # what titan run sets for its workers, by hand
            env.update(TITAN_RUN_DIR=str(rd.path), TITAN_NODE_ID="node0", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
            tail = job_cmd(cfg, rd)
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world),
                   "--max-restarts", "3", "--monitor-interval", "0.1", *tail[tail.index("--") + 1:]]
        else:
            cmd = job_cmd(cfg, rd, sets=_base_sets(cfg, rd) + _SETS[self.name] + list(wl.get("sets") or []))
            cmd[cmd.index("--nproc-per-node") + 1] = str(world)
        self._spawn(job, self.name, cmd, env)
        return job

    def gated(self, job: Job, fault: dict[str, Any]) -> bool:
        """The target rank waits at its gate (it completed ``fault["step"]`` steps), back in the
        step's own phase (the gate's ``ready``/``armed`` handshake, as the chaos driver does: a
        stopped rank is caught in the phase it really is in, not in ``gate``)."""
        from titan.chaos.runtime import chaos_dir

        job.poll()
        g = getattr(job, "gates", {}).get((fault["rank"], fault["step"] + 1))
        if not g or not g.get("fault"):
            return False
        d = chaos_dir(job.rd.path)  # type: ignore[attr-defined]
        (d / f"ready.{g['fault']}").touch()
        return (d / f"armed.{g['fault']}.r{fault['rank']}").exists()

    def before_fault(self, job: Job, kind: str, rank: int, pid: int) -> None:
        """``inject.<kind>`` in the run directory, as Titan's drills write it (the node ledger
        does not strike the node for it; the report knows the onset)."""
        from titan.events import EventWriter

        w = EventWriter(job.rd.events_dir / "rto-harness.jsonl", run="run", node="node0")  # type: ignore[attr-defined]
        try:
            w.emit(f"inject.{kind}", f"bench/rto: {'SIGKILL' if kind == 'kill' else 'SIGSTOP'} to rank {rank}",
                   data={"rank": rank, "pid": pid, "t_onset": time.time(), "by": "bench/rto",
                         "host": socket.gethostname()})
        finally:
            w.close()

    def after_fault(self, job: Job, fault: dict[str, Any]) -> None:
        """Open the gate (the signal has been sent)."""
        from titan.chaos.runtime import chaos_dir

        g = getattr(job, "gates", {}).get((fault["rank"], fault["step"] + 1))
        if g and g.get("fault"):
            (chaos_dir(job.rd.path) / f"go.{g['fault']}").touch()  # type: ignore[attr-defined]

    def detections(self, job: Job, since: float) -> list[Detection]:
        if self.name == "torchrun":
            return System.detections(self, job, since)
        from peers.systems import Titan

        return Titan.detections(self, job, since)  # type: ignore[arg-type]

    def run_dir(self, job: Job) -> Path:
        return job.rd.path  # type: ignore[attr-defined]

    def patterns(self) -> list[tuple[str, str]]:
        return [("worker failed", r"failed \(exitcode: -?\d+\) local_rank: (?P<rank>\d+)")]


def reference_digests(job: Job) -> dict[str, Any] | None:
    """The final-state digests one run wrote (``TITAN_FINAL_STATE``), None when absent."""
    from titan.checkpoint.digest import read_digests

    final = getattr(job, "final", None)
    return read_digests(final) if final is not None else None
