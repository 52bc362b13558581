"""The drill driver's OS-level injector: applies faults from outside the job when a rank
waits at their gate (``chaos.gate``), and keeps the undos that heal them.

Signals by PID (checked to descend from the job's launchers), a preempting SIGTERM to the
launchers, a lost node (its launcher tree SIGKILLed, its node-local folder deleted, a
replacement launcher started with an empty one), disk faults on ``checkpoints/`` (ENOSPC, slow fsync, damaged checkpoint files),
CPU/memory stress and network faults between namespace nodes. Each writes its
``inject.*`` event (:mod:`titan.chaos.oslevel`); the go file releases the waiting ranks.
"""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from titan.chaos.jobs import Job, kill_tree
from titan.chaos.oslevel import (damage_newest_checkpoint, emit_inject, fill_disk, send_signal, set_fsync_delay,
                                 start_stress)
from titan.chaos.plan import IN_PROCESS_KINDS, KINDS, FaultSpec
from titan.chaos.runtime import chaos_dir, fault_id, noop
from titan.errors import TitanError
from titan.events import Event, RunDir

if TYPE_CHECKING:
    from titan.chaos.drills import PlanDrill

__all__ = ["OSInjector"]

log = logging.getLogger(__name__)


def _stops_rank(f: FaultSpec) -> bool:
    """Does this OS-level fault stop or end a rank (kill, preemption, damage + kill)?"""
    return f.kind in ("kill", "preempt") or (f.kind == "disk" and str(f.get("what")) in ("corrupt", "truncate"))


class OSInjector:
    """Applies OS-level faults when a rank waits at their gate; keeps the undos."""

    def __init__(self, cfg: "PlanDrill", rd: RunDir, topo: Any, control: Path | None, fill: Path,
                 env: dict[str, str] | None = None) -> None:
        self.cfg, self.rd, self.topo, self.control, self.fill = cfg, rd, topo, control, fill
        self.faults = {fault_id(i, f): f for i, f in enumerate(cfg.plan.faults) if f.kind not in IN_PROCESS_KINDS}
        self.done: set[str] = set()
        self.undos: list[tuple[float, Callable[[], None]]] = []
        self.preempted = False
        self.problems: list[str] = []
        self.noop = noop(env)  # faults switched off: write the inject.* events, change nothing

    def on_gate(self, ev: Event, job: Job) -> None:
        fid = str(ev.data.get("fault"))
        f = self.faults.get(fid)
        if f is None or fid in self.done:
            return
        self.done.add(fid)
        try:
            self._prepare(f)
            if _stops_rank(f):  # caught in the phase the rank really was in
                self._release(fid, ev.rank)
                self._inject(f, ev, job)
            else:
                # A link, stress or disk fault leaves the ranks running: set it up while they
                # wait in phase ``gate`` (its own budget) — starting the delayer took > 4 s under
                # load, inside the data phase, and the watchdog called it a hang.
                self._inject(f, ev, job)
                self._release(fid, ev.rank)
        except Exception as e:  # noqa: BLE001 - a failed injection is a failed verdict, not a crash
            self.problems.append(f"{fid}: injection failed: {e}")
            log.warning("%s: injection failed: %s", fid, e)
        (chaos_dir(self.rd.path) / f"go.{fid}").touch()

    def _prepare(self, f: FaultSpec) -> None:
        """What must be true before the fault lands (ranks wait in their ``gate`` phase)."""
        if f.kind == "kill" or (f.kind == "disk" and str(f.get("what")) in ("corrupt", "truncate")):
            # A kill after the checkpoint before this step is on disk (an async save may still
            # be in flight): the lost steps are exactly those since it. Damage must hit the
            # checkpoint the restart will read.
            self._wait_latest(f.step)

    def _release(self, fid: str, rank: int | None, timeout_s: float = 5.0) -> None:
        """Let the waiting rank go back to the phase it was in, and wait until it has."""
        d = chaos_dir(self.rd.path)
        (d / f"ready.{fid}").touch()
        armed = d / f"armed.{fid}.r{rank}"
        deadline = time.monotonic() + timeout_s
        while rank is not None and not armed.exists() and time.monotonic() < deadline:
            time.sleep(0.01)

    def _later(self, seconds: float, undo: Callable[[], None], *, until: Callable[[], bool] | None = None,
               at_most_s: float | None = None) -> None:
        """Run ``undo`` in ``seconds`` — or, with ``until``, once that is also true (checked
        each tick), at the latest ``at_most_s`` after now."""
        now = time.monotonic()
        if until is not None:
            deadline = now + (at_most_s if at_most_s is not None else seconds)
            inner = undo

            def undo() -> None:
                if until() or time.monotonic() >= deadline:
                    inner()
                else:
                    self.undos.append((time.monotonic() + 0.2, undo))
            undo.net = getattr(inner, "net", False)  # type: ignore[attr-defined]
            undo.force = inner  # type: ignore[attr-defined]  # heal_all heals at once
        self.undos.append((now + seconds, undo))

    def tick(self) -> None:
        now = time.monotonic()
        due = [u for u in self.undos if u[0] <= now]
        self.undos = [u for u in self.undos if u[0] > now]
        for _, u in due:
            u()

    def _latest_step(self) -> int:
        """The step of the newest committed checkpoint (``latest``), -1 when none."""
        try:
            name = (self.rd.checkpoints / "latest").read_text().strip()
            return int(name.rsplit("-", 1)[1])
        except (OSError, ValueError, IndexError):
            return -1

    def heal_all(self) -> None:
        for _, u in list(self.undos):
            try:
                getattr(u, "force", u)()
            except Exception as e:  # noqa: BLE001
                log.warning("undo failed: %s", e)
        self.undos.clear()

    def _ckpt_root(self, node: str | None = None) -> Path:
        """The checkpoint folder as ``node`` sees it (its private folder in a node-local drill)."""
        if getattr(self.cfg, "node_local", False):
            from titan.chaos.jobs import node_ckpt_dir

            return node_ckpt_dir(self.rd, int((node or "node0").removeprefix("node") or 0))
        return self.rd.checkpoints

    def _wait_latest(self, step: int, timeout_s: float = 20.0, node: str | None = None) -> bool:
        """Wait until ``latest`` names the checkpoint of the last multiple of ``ckpt_every``
        before ``step`` (it may still be an async save in flight: the ranks are parked at the
        gate, the save thread is not). True when it does; False after ``timeout_s``."""
        want_step = (step - 1) // self.cfg.ckpt_every * self.cfg.ckpt_every
        if want_step <= 0:
            return True
        want = f"step-{want_step:08d}"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if (self._ckpt_root(node) / "latest").read_text().strip() == want:
                    return True
            except OSError:
                pass
            time.sleep(0.05)
        return False

    def _beacon_phase(self, pid: int) -> str | None:
        """The phase the beacon of worker ``pid`` shows now (None without a beacon)."""
        from titan.beacon import scan_beacons

        snap = next((b for b in scan_beacons(self.rd.path / "beacons") if b.pid == pid), None)
        return snap.phase if snap is not None else None

    def _node_of(self, ev: Event) -> str:
        return ev.node or "node0"

    def _inject(self, f: FaultSpec, ev: Event, job: Job) -> None:
        rd, node, step = self.rd, self._node_of(ev), f.step
        if self.noop:
            self._inject_noop(f, ev, node)
            return
        if f.kind == "kill":
            sig = str(f.get("signal"))
            # A stopped rank is a hang: its phase at the stop is what the watchdog must name.
            extra = {"phase": self._beacon_phase(int(ev.pid or 0))} if sig == "SIGSTOP" else {}
            send_signal(rd, node, int(ev.pid or 0), sig, rank=ev.rank, step=step,
                        attempt=ev.attempt, parents=[p.pid for p in job.procs], **extra)
        elif f.kind == "node_loss":
            self._node_loss(f, job)
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
                # On until two checkpoints after the fault committed (the detector's fsync
                # probe runs after the first slow save — under load saves take seconds, and
                # a fixed 8 s healed the disk before the probe looked), at least 8 s, at most 90 s.
                past = (step // self.cfg.ckpt_every + 2) * self.cfg.ckpt_every
                self._later(max(float(f.get("seconds")) * 6, 8.0),
                            set_fsync_delay(rd, node, self.control, float(f.get("seconds")), step=step),
                            until=lambda: self._latest_step() >= past, at_most_s=90.0)
            else:
                damage_newest_checkpoint(rd, node, what, step=step)
                # The damage matters on restore: end the rank so the group restarts from disk.
                send_signal(rd, node, int(ev.pid or 0), "SIGKILL", kind="kill_for_restore", rank=ev.rank,
                            step=step, attempt=ev.attempt, parents=[p.pid for p in job.procs])
        elif f.kind == "stress":
            secs = float(f.get("seconds"))
            undo, sample = start_stress(rd, node, str(f.get("what")), int(f.get("workers")), secs, step=step,
                                        planned_step=step)
            self._later(secs / 2, sample)  # the stressor's memory and CPU, half-way through
            self._later(secs + 1, undo)
        elif f.kind == "net":
            self._net(f, node, step)

    def _node_loss(self, f: FaultSpec, job: Job) -> None:
        """SIGKILL node ``f.node``'s launcher and everything under it, delete its folder, start
        a replacement launcher with an empty one; ``inject.node_loss``."""
        import shutil

        lost = f.node or "node1"
        i = int(lost.removeprefix("node")) if lost.removeprefix("node").isdigit() else -1
        if self.topo is None or not 0 <= i < len(job.procs):
            raise TitanError(f"node_loss of {lost}: the drill has no such namespace node (use --nodes 2)")
        # Every node's checkpoint of the step before must be committed: the survivors resume from it.
        for k in range(len(job.procs)):
            self._wait_latest(f.step, node=f"node{k}")
        launcher = job.procs[i]
        try:
            tree = kill_tree(launcher)
        except Exception:  # noqa: BLE001 - a launcher that does not die is a failed injection
            raise TitanError(f"node {lost}'s launcher (pid {launcher.pid}) survived SIGKILL") from None
        from titan.chaos.jobs import node_memory_dir

        folder = self._ckpt_root(lost)
        files = [p for p in folder.rglob("*") if p.is_file()] if folder.exists() else []
        size = sum(p.stat().st_size for p in files)
        if folder.exists():
            shutil.rmtree(folder)
        memory = node_memory_dir(self.rd, i)  # its RAM goes too: the in-memory snapshots
        held = [p for p in memory.rglob("*") if p.is_file()] if memory.exists() else []
        shutil.rmtree(memory, ignore_errors=True)
        emit_inject(self.rd, "driver", "node_loss", f"node {lost} lost: {len(tree)} process(es) SIGKILLed, "
                    f"{len(files)} file(s) of its folder and {len(held)} of its memory deleted; a replacement "
                    "starts with an empty folder", step=f.step, rank=None, lost_node=lost, pids=tree,
                    deleted_files=len(files), deleted_bytes=size, folder=str(folder), memory=str(memory),
                    deleted_memory_files=len(held))
        job.restart_node(i)

    def _inject_noop(self, f: FaultSpec, ev: Event, node: str) -> None:
        """Faults switched off: each kind's ``inject.*`` event (with the fields its verdict
        reads), and nothing else — no signal, no fill, no delay, no stress, no rule."""
        step = f.step
        what = str(f.get("what")) if "what" in KINDS[f.kind] else None
        if f.kind == "kill":
            emit_inject(self.rd, node, "kill", f"(switched off) {f.get('signal')} to pid {ev.pid}", step=step,
                        rank=ev.rank, pid=ev.pid, signal=str(f.get("signal")), attempt=ev.attempt, noop=True)
        elif f.kind == "preempt":
            emit_inject(self.rd, node, "preempt", "(switched off) SIGTERM to the launcher(s)", step=step, rank=None,
                        noop=True)
        elif f.kind == "node_loss":
            emit_inject(self.rd, "driver", "node_loss", f"(switched off) loss of {f.node or 'node1'}", step=step,
                        rank=None, lost_node=f.node or "node1", pids=[], deleted_files=0, deleted_bytes=0, noop=True)
        elif f.kind == "disk":
            data: dict[str, Any] = {"what": what, "noop": True}
            if what == "enospc":
                import shutil

                data.update(filled_bytes=0, free_after_bytes=shutil.disk_usage(self.fill).free)
            elif what in ("corrupt", "truncate"):
                data.update(damaged_bytes=0)
            else:
                data.update(seconds=float(f.get("seconds")))
            emit_inject(self.rd, node, "disk", f"(switched off) {what}", step=step, **data)
        elif f.kind == "stress":
            emit_inject(self.rd, node, "stress", f"(switched off) {what} stress", step=step, what=what,
                        seconds=float(f.get("seconds")), workers=0, bytes=0, noop=True)
            emit_inject(self.rd, node, "stress_end", "(switched off) stress ended", what=what, planned_step=step,
                        cpu_seconds=0.0, memory_taken_bytes=0, noop=True)
        elif f.kind == "net":
            emit_inject(self.rd, "driver", "net", f"(switched off) {what}", step=step, rank=None, what=what,
                        seconds=float(f.get("seconds")), noop=True)
            emit_inject(self.rd, "driver", "net_healed", f"(switched off) {what} healed", step=None, rank=None,
                        what=what, planned_step=step, dropped_packets=0, delayed_packets=0, shaped_packets=0, noop=True)

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

            def undo() -> None:
                healed["shaped_packets"] = topo.shaped_packets(i)  # evidence: packets the shaper held back
                topo.clear_bandwidth(i)
            data["rate"] = f.get("rate")
        elif what == "delay":
            proc = topo.start_delay(i, float(f.get("delay_ms")))

            def undo() -> None:
                healed.update(topo.stop_delay(i, proc) or {})  # evidence: packets/bytes the delayer held
            data["delay_ms"] = f.get("delay_ms")
        elif what in ("partition", "partition_long"):
            # Every packet dropped by a counted nftables rule inside the node, then the link
            # cut: the counter is the evidence the cut bit (a stall of a few steps is within
            # a loaded box's noise).
            topo.set_loss(i, 100.0, both=True)
            topo.set_link(i, False)

            def undo() -> None:
                healed["dropped_packets"] = topo.nft_dropped(i)
                topo.clear_nft(i)
                topo.set_link(i, True)
        else:
            raise TitanError(f"unknown net fault {what!r}")
        emit_inject(self.rd, "driver", "net", f"{what} on the link to node{i} for {secs:g} s", step=step,
                    rank=None, **data)
        def heal() -> None:
            undo()
            emit_inject(self.rd, "driver", "net_healed", f"{what} healed", step=None, rank=None, what=what,
                        planned_step=step, **healed)
        heal.net = True  # type: ignore[attr-defined]
        self._later(secs, heal)
