"""Plan-driven drills: run tinygpt under ``titan run`` with a fault plan, inject every fault
for real, then judge each one against a fault-free reference run.

Flow of :func:`run_plan_drill`:

1. create the run directory, save the plan to ``chaos/plan.json``, prepare disk faults
   (a small tmpfs or a slow-fsync FUSE mount on ``checkpoints/``) and, with ``nodes=2``, two
   network-namespace "nodes" on a bridge (real c10d rendezvous over veth);
2. start the job with ``TITAN_CHAOS_PLAN``: ranks apply in-process kinds themselves and wait
   at the step of each OS-level fault (``chaos.gate``) until the driver has injected it
   (:mod:`titan.chaos.oslevel`, :class:`titan.chaos.netns.Topology`) and touched the go file;
   faults with a duration are healed by timed undos; a preempted job (exit 9) is resubmitted;
3. run the reference alongside: the same job without faults, skipping the updates of the steps the
   faulty run skipped (``TITAN_CHAOS_SKIP_STEPS``), cached by its arguments;
4. :func:`titan.chaos.verdict.judge` turns the events into one verdict per fault.

Every child is ended by PID on the way out; every mount, rule and namespace is removed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from titan.chaos.drill import _stop_tree
from titan.chaos.oslevel import (damage_newest_checkpoint, emit_inject, fill_disk, mount_slow_fs, mount_tmpfs,
                                 send_signal, set_fsync_delay, start_stress)
from titan.chaos.plan import IN_PROCESS_KINDS, FaultSpec, Plan
from titan.chaos.runtime import chaos_dir, fault_id
from titan.chaos.tail import EventTail
from titan.chaos.verdict import FaultVerdict, judge, skipped_steps
from titan.errors import TitanError
from titan.events import Event, RunDir, read_run
from titan.events.rundir import new_run_id
from titan.exitcodes import ExitCode

__all__ = ["PlanDrill", "PlanReport", "run_plan_drill", "reference_params", "predicted_skips"]

log = logging.getLogger(__name__)
ProgressFn = Callable[[int, int, str], None]


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanDrill:
    """A plan-driven drill (see the module doc)."""

    plan: Plan
    steps: int = 40
    ckpt_every: int = 5
    nproc: int = 2
    nodes: int = 1
    seed: int = 0
    runs_dir: Path = Path("runs")
    run_id: str | None = None
    timeout_s: float = 300.0
    sets: tuple[str, ...] = ()
    workload_args: tuple[str, ...] = ()
    reference: bool = True
    netns_prefix: str = "tcd"
    subnet: int = 91


@dataclasses.dataclass
class PlanReport:
    """The drill's outcome: ``passed`` only if every fault met its expectation."""

    passed: bool
    run_dir: str
    plan: str
    nodes: int
    steps: int
    target_steps: int
    failures: int
    restarts: int
    submissions: int
    rto_s: float | None
    steps_recomputed: int
    final_state_equal: bool | None
    reference: str | None
    skipped_steps: list[int]
    launcher_exit: list[int | None]
    wall_s: float
    reference_s: float | None
    faults: list[FaultVerdict]
    problems: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["faults"] = [f.to_dict() for f in self.faults]
        return d


def _base_sets(cfg: PlanDrill, rd: RunDir) -> list[str]:
    kinds = {f.kind for f in cfg.plan.faults}
    restarts = sum(1 for f in cfg.plan.faults if f.kind in ("kill", "hang", "exception", "disk", "net"))
    sets = [f"watchdog.ledger_path={rd.path / 'ledger.sqlite'}", "guard.spike_warmup=8",
            "watchdog.warmup_timeout_s=15", "watchdog.warmup_samples=10", "watchdog.restart_backoff_s=0.2",
            f"watchdog.giveup_restarts={restarts + 3}",
            # Injected faults are not the node's fault: no strike may exclude it mid-drill.
            "watchdog.strike_limit=1000", "guard.strikes_to_report=1000"]
    if kinds & {"bitflip", "gemm_perturb"}:
        sets += ["sdc.every_steps=2", "sdc.canary_every_steps=2"]
    if "slow" in kinds:  # a short drill's straggler spans ~15 steps, not the default 20-step window x 2
        sets += ["watchdog.straggler_window=8"]
    return sets + list(cfg.sets)


def _job_cmd(cfg: PlanDrill, rd: RunDir, out: Path, *, node: int | None = None, topo: Any = None,
             port: int = 29517, sets: list[str] | None = None) -> list[str]:
    restarts = sum(1 for f in cfg.plan.faults if f.kind in ("kill", "hang", "exception", "disk", "net")) + 2
    cmd = [sys.executable, "-m", "titan", "run", "--max-restarts", str(restarts), "--runs-dir", str(rd.path.parent),
           "--run-id", rd.run_id]
    if topo is not None and node is not None:
        cmd = topo.exec_prefix(node) + cmd + [
            "--nnodes", str(cfg.nodes), "--nproc-per-node", str(cfg.nproc // cfg.nodes),
            "--rdzv-endpoint", f"{topo.addr(0)}:{port}", "--local-addr", topo.addr(node), "--node-id", f"node{node}",
            "--rdzv-conf", f"is_host={1 if node == 0 else 0},last_call_timeout=3,keep_alive_interval=1,"
                           "keep_alive_max_attempt=3"]
    else:
        cmd += ["--nproc-per-node", str(cfg.nproc), "--node-id", "node0"]
    for s in sets or []:
        cmd += ["--set", s]
    return cmd + ["--", "-m", "titan.workloads.tinygpt", "--steps", str(cfg.steps), "--ckpt-every",
                  str(cfg.ckpt_every), "--seed", str(cfg.seed), "--threads", "1", "--log-every", "0",
                  "--out", str(out), *cfg.workload_args]


class _Job:
    """The launcher process(es) of one submission."""

    def __init__(self, procs: list[subprocess.Popen[bytes]]) -> None:
        self.procs = procs

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def codes(self) -> list[int | None]:
        return [p.returncode for p in self.procs]

    def stop(self) -> None:
        for p in self.procs:
            _stop_tree(p, grace_s=10)


def _start(cfg: PlanDrill, rd: RunDir, out: Path, env: dict[str, str], topo: Any, sets: list[str],
           cwd: Path, log_fh: Any) -> _Job:
    procs = []
    if topo is None:
        procs.append(subprocess.Popen(_job_cmd(cfg, rd, out, sets=sets), cwd=cwd, env=env, stdout=log_fh,
                                      stderr=subprocess.STDOUT, start_new_session=True))
    else:
        for i in range(cfg.nodes):
            e = dict(env, GLOO_SOCKET_IFNAME=topo.ns_if(i), TITAN_NODE_ID=f"node{i}")
            procs.append(subprocess.Popen(_job_cmd(cfg, rd, out, node=i, topo=topo, sets=sets), cwd=cwd, env=e,
                                          stdout=log_fh, stderr=subprocess.STDOUT, start_new_session=True))
    return _Job(procs)


class _Injector:
    """Applies OS-level faults when a rank waits at their gate; keeps the undos."""

    def __init__(self, cfg: PlanDrill, rd: RunDir, topo: Any, control: Path | None, fill: Path) -> None:
        self.cfg, self.rd, self.topo, self.control, self.fill = cfg, rd, topo, control, fill
        self.faults = {fault_id(i, f): f for i, f in enumerate(cfg.plan.faults) if f.kind not in IN_PROCESS_KINDS}
        self.done: set[str] = set()
        self.undos: list[tuple[float, Callable[[], None]]] = []
        self.preempted = False
        self.problems: list[str] = []

    def on_gate(self, ev: Event, job: _Job) -> None:
        fid = str(ev.data.get("fault"))
        f = self.faults.get(fid)
        if f is None or fid in self.done:
            return
        self.done.add(fid)
        try:
            self._inject(f, ev, job)
        except Exception as e:  # noqa: BLE001 - a failed injection is a failed verdict, not a crash
            self.problems.append(f"{fid}: injection failed: {e}")
            log.warning("%s: injection failed: %s", fid, e)
        (chaos_dir(self.rd.path) / f"go.{fid}").touch()

    def _later(self, seconds: float, undo: Callable[[], None]) -> None:
        self.undos.append((time.monotonic() + seconds, undo))

    def tick(self) -> None:
        now = time.monotonic()
        due = [u for u in self.undos if u[0] <= now]
        self.undos = [u for u in self.undos if u[0] > now]
        for _, u in due:
            u()

    def heal_all(self) -> None:
        for _, u in self.undos:
            try:
                u()
            except Exception as e:  # noqa: BLE001
                log.warning("undo failed: %s", e)
        self.undos.clear()

    def _node_of(self, ev: Event) -> str:
        return ev.node or "node0"

    def _inject(self, f: FaultSpec, ev: Event, job: _Job) -> None:
        rd, node, step = self.rd, self._node_of(ev), f.step
        if f.kind == "kill":
            send_signal(rd, node, int(ev.pid or 0), str(f.get("signal")), rank=ev.rank, step=step,
                        attempt=ev.attempt, parents=[p.pid for p in job.procs])
        elif f.kind == "preempt":
            self.preempted = True
            emit_inject(rd, node, "preempt", "SIGTERM to the launcher(s), as a scheduler preempts", step=step,
                        rank=None, pids=[p.pid for p in job.procs])
            for p in job.procs:
                p.send_signal(signal.SIGTERM)
        elif f.kind == "disk":
            what = str(f.get("what"))
            if what == "enospc":
                self._later(float(f.get("seconds")), fill_disk(rd, node, self.fill, step=step))
            elif what == "slow_fsync":
                assert self.control is not None
                self._later(max(float(f.get("seconds")) * 6, 8.0),
                            set_fsync_delay(rd, node, self.control, float(f.get("seconds")), step=step))
            else:
                # The checkpoint of the last multiple of ckpt_every may still be an async save in
                # flight: wait (ranks are parked at the gate, the save thread is not) until
                # ``latest`` names it, so the damage hits the checkpoint the restart will read.
                want = f"step-{(step - 1) // self.cfg.ckpt_every * self.cfg.ckpt_every:08d}"
                deadline = time.monotonic() + 20.0
                while time.monotonic() < deadline:
                    try:
                        if (rd.checkpoints / "latest").read_text().strip() == want:
                            break
                    except OSError:
                        pass
                    time.sleep(0.05)
                damage_newest_checkpoint(rd, node, what, step=step)
                # The damage matters on restore: end the rank so the group restarts from disk.
                send_signal(rd, node, int(ev.pid or 0), "SIGKILL", kind="kill_for_restore", rank=ev.rank,
                            step=step, attempt=ev.attempt, parents=[p.pid for p in job.procs])
        elif f.kind == "stress":
            secs = float(f.get("seconds"))
            self._later(secs + 1, start_stress(rd, node, str(f.get("what")), int(f.get("workers")), secs, step=step))
        elif f.kind == "net":
            self._net(f, node, step)

    def _net(self, f: FaultSpec, node: str, step: int) -> None:
        topo = self.topo
        if topo is None:
            raise TitanError("net faults need --nodes 2 (network-namespace nodes)")
        i = 1 if topo.n > 1 else 0
        # One link fault at a time: a new one first heals the one still active.
        for due, u in [x for x in self.undos if getattr(x[1], "net", False)]:
            self.undos.remove((due, u))
            u()
        what, secs = str(f.get("what")), float(f.get("seconds"))
        data = {"what": what, "seconds": secs, "link": f"{topo.ns(0)}<->{topo.ns(i)}"}
        healed: dict[str, Any] = {}
        if what == "loss":
            topo.set_loss(i, float(f.get("percent")))

            def undo() -> None:
                healed["dropped_packets"] = topo.nft_dropped(i)  # evidence the loss was real
                topo.clear_nft(i)
            data["percent"] = f.get("percent")
        elif what == "bandwidth":
            topo.limit_bandwidth(i, str(f.get("rate")))
            undo = lambda: topo.clear_bandwidth(i)  # noqa: E731
            data["rate"] = f.get("rate")
        elif what == "delay":
            proc = topo.start_delay(i, float(f.get("delay_ms")))
            undo = lambda: topo.stop_delay(i, proc)  # noqa: E731
            data["delay_ms"] = f.get("delay_ms")
        elif what in ("partition", "partition_long"):
            topo.set_link(i, False)
            undo = lambda: topo.set_link(i, True)  # noqa: E731
        else:
            raise TitanError(f"unknown net fault {what!r}")
        emit_inject(self.rd, "driver", "net", f"{what} on the link to node{i} for {secs:g} s", step=step,
                    rank=None, **data)
        def heal() -> None:
            undo()
            emit_inject(self.rd, "driver", "net_healed", f"{what} healed", step=None, rank=None, what=what, **healed)
        heal.net = True  # type: ignore[attr-defined]
        self._later(secs, heal)


def _load_params(path: Path) -> dict[str, Any] | None:
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, EOFError, ValueError):
        return None


def _equal(a: Path, b: Path) -> bool | None:
    import torch

    pa, pb = _load_params(a), _load_params(b)
    if pa is None or pb is None:
        return None
    return pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


def _code_version() -> str:
    """torch's version and a digest of the workload's source: a cached reference from other
    code is never reused."""
    import importlib.metadata
    import importlib.util

    spec = importlib.util.find_spec("titan.workloads.tinygpt")  # without importing it (torch)
    where = list(spec.submodule_search_locations or []) if spec else []
    h = hashlib.sha256()
    for f in sorted(p for d in where for p in Path(d).glob("*.py")):
        h.update(f.read_bytes())
    try:
        torch_v = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_v = "?"
    return f"{torch_v}:{h.hexdigest()[:16]}"


def reference_params(cfg: PlanDrill, skips: list[int], *, cwd: Path, env: dict[str, str]) -> tuple[Path | None, float]:
    """The final parameters of a fault-free run skipping ``skips`` (cached under
    ``<runs>/.reference/<key>.pt``); returns (path, seconds spent, 0 when cached)."""
    runs = cfg.runs_dir if cfg.runs_dir.is_absolute() else cwd / cfg.runs_dir
    key = hashlib.sha256(json.dumps([cfg.steps, cfg.ckpt_every, cfg.nproc, cfg.seed, list(cfg.workload_args),
                                     skips, _code_version()], sort_keys=True).encode()).hexdigest()[:16]
    cache = runs / ".reference" / f"{key}.pt"
    if cache.exists():
        return cache, 0.0
    t0 = time.monotonic()
    ref_cfg = dataclasses.replace(cfg, plan=Plan([], name="reference"), nodes=1)
    rd = RunDir.create(runs / ".reference", f"ref-{key}-{new_run_id()}")
    out = rd.path / "final.pt"
    e = dict(env, TITAN_CHAOS_SKIP_STEPS=",".join(map(str, skips)))
    e.pop("TITAN_CHAOS_PLAN", None)
    with open(rd.path / "console.log", "ab") as fh:
        job = _start(ref_cfg, rd, out, e, None, [f"watchdog.ledger_path={rd.path / 'ledger.sqlite'}"], cwd, fh)
        try:
            job.procs[0].wait(cfg.timeout_s)
        except subprocess.TimeoutExpired:
            pass
        finally:
            job.stop()
    if not out.exists():
        return None, time.monotonic() - t0
    shutil.copyfile(out, cache)
    return cache, time.monotonic() - t0


def predicted_skips(plan: Plan) -> list[int]:
    """Steps whose update the plan's skip-kind faults should make the guard skip."""
    from titan.chaos.verdict import expect_for

    return sorted({f.step for f in plan.faults if expect_for(f).recovery == "skip"})


def _prepare_disk(cfg: PlanDrill, rd: RunDir, undos: list[Callable[[], None]]) -> tuple[Path | None, Path]:
    """Mount what the plan's disk faults need on ``checkpoints/``; returns (the slow-fsync
    control file or None, the folder whose filesystem ENOSPC fills). With both kinds the
    FUSE passthrough sits on top of the small tmpfs, so a full tmpfs fails FUSE writes too."""
    whats = {str(f.get("what")) for f in cfg.plan.faults if f.kind == "disk"}
    fill = rd.checkpoints
    if "slow_fsync" in whats:
        backing = rd.path / "chaos" / "ckpt-backing"
        control = rd.path / "chaos" / "fsync-delay"
        if "enospc" in whats:
            undos.append(mount_tmpfs(backing, "48m"))
            fill = backing
        undos.append(mount_slow_fs(backing, rd.checkpoints, control))
        return control, fill
    if "enospc" in whats:
        undos.append(mount_tmpfs(rd.checkpoints, "48m"))
    return None, fill


def run_plan_drill(cfg: PlanDrill, *, cwd: Path, env: dict[str, str] | None = None,
                   progress: ProgressFn | None = None) -> PlanReport:
    """Run the drill end to end and judge it; never raises for a failed drill.

    Cost: one ``titan run`` job (per node with ``nodes=2``, each in its own network
    namespace) plus a reference job when not cached, both bounded by ``cfg.timeout_s``.
    Raises ``TitanError`` only when the machine cannot set the drill up (no root for mounts
    or namespaces).
    """
    t0 = time.monotonic()
    env = dict(env if env is not None else os.environ)
    runs_root = cfg.runs_dir if cfg.runs_dir.is_absolute() else cwd / cfg.runs_dir
    rd = RunDir.create(runs_root, cfg.run_id or new_run_id())
    plan_file = cfg.plan.save(chaos_dir(rd.path) / "plan.json")
    env["TITAN_CHAOS_PLAN"] = str(plan_file)
    out = rd.path / "final.pt"
    undos: list[Callable[[], None]] = []
    problems: list[str] = []
    ref_env = {k: v for k, v in env.items() if k != "TITAN_CHAOS_PLAN"}
    # The reference runs alongside, skipping the steps the plan's skip-kind faults name; if
    # the faulty run skipped other steps (a fault lost to a restart), it is run again.
    predicted = predicted_skips(cfg.plan)
    ref_thread: dict[str, Any] = {}
    if cfg.reference:
        th = threading.Thread(target=lambda: ref_thread.update(
            r=reference_params(cfg, predicted, cwd=cwd, env=ref_env)), daemon=True)
        th.start()
        ref_thread["thread"] = th
    topo = None
    codes: list[int | None] = []
    submissions = 0
    inj: _Injector | None = None
    log_fh = open(rd.path / "console.log", "ab")
    try:
        control, fill = _prepare_disk(cfg, rd, undos)
        if cfg.nodes > 1:
            from titan.chaos.netns import Topology

            topo = Topology(cfg.netns_prefix, cfg.nodes, subnet=cfg.subnet).create()
        sets = _base_sets(cfg, rd)
        inj = _Injector(cfg, rd, topo, control, fill)
        tail = EventTail(rd)
        best = 0
        while True:
            submissions += 1
            job = _start(cfg, rd, out, env, topo, sets, cwd, log_fh)
            inj.preempted = False
            while job.running():
                if time.monotonic() - t0 > cfg.timeout_s:
                    problems.append(f"timed out after {cfg.timeout_s:g} s")
                    break
                for ev in tail.poll():
                    if ev.kind == "chaos.gate":
                        inj.on_gate(ev, job)
                    elif ev.kind == "step" and ev.step is not None:
                        best = max(best, ev.step)
                inj.tick()
                if progress:
                    progress(best, cfg.steps, "training")
                time.sleep(0.02)
            job.stop()
            codes = job.codes()
            if inj.preempted and any(c == int(ExitCode.PREEMPTED) for c in codes) and submissions < 4 \
                    and time.monotonic() - t0 < cfg.timeout_s:
                continue  # the scheduler gives the job its nodes back: resubmit, it resumes
            break
        problems += inj.problems
    finally:
        if inj is not None:
            inj.heal_all()
        if topo is not None:
            topo.destroy()
        for u in reversed(undos):
            try:
                u()
            except Exception as e:  # noqa: BLE001
                problems.append(f"cleanup: {e}")
        log_fh.close()
    wall = time.monotonic() - t0
    evs = read_run(rd).events
    skips = skipped_steps(cfg.plan, evs)
    ref_path, ref_s = (None, None)
    final_equal: bool | None = None
    if cfg.reference:
        if progress:
            progress(best, cfg.steps, "reference run")
        ref_thread["thread"].join(cfg.timeout_s)
        ref_path, ref_s = ref_thread.get("r", (None, None))
        if skips != predicted or ref_path is None:
            ref_path, ref_s = reference_params(cfg, skips, cwd=cwd, env=ref_env)
        if ref_path is None:
            problems.append("the reference run did not finish")
        elif not out.exists():
            final_equal = False
        else:
            final_equal = _equal(out, ref_path)
    launcher_ok = bool(codes) and all(c == int(ExitCode.SUCCEEDED) for c in codes)
    verdicts = judge(cfg.plan, evs, final_equal=final_equal, launcher_ok=launcher_ok)
    steps = [e for e in evs if e.kind == "step" and e.step is not None]
    final = max((e.step for e in steps), default=0)
    rtos = [v.rto_s for v in verdicts if v.rto_s is not None]
    passed = launcher_ok and final == cfg.steps and all(v.passed for v in verdicts) and not problems \
        and (final_equal is not False)
    report = PlanReport(
        passed=passed, run_dir=str(rd.path), plan=cfg.plan.name, nodes=cfg.nodes, steps=final, target_steps=cfg.steps,
        failures=sum(1 for e in evs if e.kind == "worker.failed"),
        restarts=sum(1 for e in evs if e.kind == "launcher.restart"), submissions=submissions,
        rto_s=max(rtos) if rtos else None, steps_recomputed=sum(v.steps_lost or 0 for v in verdicts),
        final_state_equal=final_equal, reference=str(ref_path) if ref_path else None, skipped_steps=skips,
        launcher_exit=codes, wall_s=round(wall, 2), reference_s=round(ref_s, 2) if ref_s is not None else None,
        faults=verdicts, problems=problems)
    from titan.events import atomic_write_json

    atomic_write_json(rd.path / "chaos" / "verdict.json", report.to_dict())
    return report
