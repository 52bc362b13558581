"""The watchdog: runs in each node's ``titan run`` process (a thread), outside the workers.

Every ``poll_interval_s`` it reads the node's beacon files (no collective, no lock, ~10 µs
per file), feeds the phase-duration and step rings into the learned timeouts and the
straggler detector, and checks each live local rank: *stalled* = time since its beacon
last changed; a hang is a rank stalled longer than its phase's timeout while the rank the
group waits for (:mod:`titan.watchdog.culprit`) is itself past its own phase budget (so a
long checkpoint on one rank does not make its waiting peers look hung). Once that rank is
past its *suspicion point* (``evidence_lead_s`` before its timeout, at the earliest half
way), the evidence is collected already (:mod:`titan.watchdog.evidence`), so the restart
waits for nothing after the verdict; the time a native py-spy held a rank stopped does not
count as its stall (the watchdog must not cause the hang it then declares), and a capture
whose suspect moves on is dropped. On a hang:

1. evidence from every local rank (started at suspicion, else now);
2. this node's rank views into ``<run_dir>/hang/attempt<N>/<node>.json``, then up to
   ``agree_wait_s`` for the other nodes' views (all ranks), then the verdict: the first
   node to hard-link ``verdict.json`` decides, the others adopt it — one culprit per hang;
3. ``hang.detected`` (the decider) / ``hang.observed`` (the others) with culprit, phase,
   evidence paths and detection latency;
4. a ledger strike for the culprit's node (written by that node only);
5. SIGKILL of the local workers, so torchrun's agent restarts the group from the latest
   checkpoint; a node over its strike limit first asks its own ``titan run`` to leave.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable

from titan.beacon import BeaconSnapshot, beacon_dir, scan_beacons
from titan.beacon.layout import STATE_RUNNING
from titan.events import EventWriter, RunDir, atomic_write_json
from titan.watchdog.culprit import RankView, Verdict, fr_last_seq, identify
from titan.watchdog.evidence import Capture, add_native, kill_workers, same_process, start_capture
from titan.watchdog.straggler import StragglerDetector
from titan.watchdog.strikes import StrikeTracker
from titan.watchdog.timeouts import PhaseTimeouts

__all__ = ["Watchdog", "watchdog_events_file"]

log = logging.getLogger(__name__)


def watchdog_events_file(rd: RunDir, node: str) -> Path:
    """The watchdog's own event file (read by ``read_run`` with the workers' files)."""
    return rd.events_dir / f"watchdog.{node}.jsonl"


class Watchdog:
    """Hang and straggler watchdog of one node. ``start()`` / ``stop()``; ``tick()`` for tests.

    ``ledger``: a :class:`titan.ledger.Ledger` (strikes, exclusion) or ``None``.
    ``on_exclude(reason)`` is called once when this node goes over its strike limit
    (default: a node-scoped abort file that ends this node's ``titan run``).
    """

    def __init__(self, run_dir: RunDir | str | os.PathLike[str], node: str, settings: Any, *,
                 ledger: Any = None, kill: bool = True,
                 on_exclude: Callable[[str], None] | None = None) -> None:
        self.rd = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
        self.node = node
        self.settings = settings
        self.cfg = settings.watchdog
        self.bdir = beacon_dir(self.rd.path, self.cfg.beacon_dir)
        self.timeouts = PhaseTimeouts(self.cfg)
        self.straggler = StragglerDetector(self.cfg)
        self.kill = kill
        self.ledger = ledger
        self.on_exclude = on_exclude or self._default_exclude
        self.rd.events_dir.mkdir(parents=True, exist_ok=True)
        self.events = EventWriter(watchdog_events_file(self.rd, node), run=self.rd.run_id, node=node)
        self._cursor: dict[str, tuple[int, int, int]] = {}  # beacon path -> (pid, phase count, step count)
        # beacon path -> (pid, heartbeat, when this watchdog first saw that heartbeat): a stall
        # is never longer than the watchdog itself watched the heartbeat stand still.
        self._hb_seen: dict[str, tuple[int, int, int]] = {}
        self._handled: set[int] = set()
        self._attempt: int | None = None
        self._straggler_flags: dict[int, int] = {}
        self._killed: set[int] = set()
        self._excluded = False
        self.hangs: list[dict[str, Any]] = []
        self.strikes = StrikeTracker(self)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_strike_scan = 0.0
        self._capture: Capture | None = None
        self._abandoned: list[tuple[subprocess.Popen[bytes], Path]] = []
        #: Evidence captures started at suspicion, and those dropped because the suspect moved on.
        self.suspicions = 0
        self.dropped = 0

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> "Watchdog":
        """Start the polling thread (daemon)."""
        self.events.emit("watchdog.started", f"watchdog on node {self.node}", data={
            "beacon_dir": str(self.bdir), "poll_interval_s": self.cfg.poll_interval_s, "floor_s": self.cfg.floor_s,
            "factor": self.cfg.factor, "percentile": self.cfg.percentile, "ceiling_s": self.cfg.ceiling_s})
        self._thread = threading.Thread(target=self._run, name=f"titan-watchdog-{self.node}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread, record the learned timeouts, close the event file."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._capture is not None:
            self._abandoned.extend(self._capture.abandon())
            self._capture = None
        self._reap(kill=True)
        try:
            self.strikes.scan(final=True)
        except Exception:  # noqa: BLE001 - shutting down
            log.exception("final strike scan failed")
        self.events.emit("watchdog.stopped", f"{len(self.hangs)} hang(s) handled",
                         data={"hangs": len(self.hangs), "timeouts": self.timeouts.summary(),
                               "stragglers": len(self.straggler.flags)})
        self.events.close()

    def _run(self) -> None:
        while not self._stop.wait(self.cfg.poll_interval_s):
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the watchdog must survive its own bugs
                log.exception("watchdog tick failed")

    # -- one poll --------------------------------------------------------------------
    def tick(self) -> dict[str, Any] | None:
        """Read beacons once; handle a hang if there is one (returns its record)."""
        snaps = scan_beacons(self.bdir)
        now = time.monotonic_ns()
        local = [s for s in snaps if s.node == self.node and s.state == STATE_RUNNING and same_process(s)]
        if local:
            attempt = max(s.attempt for s in local)
            local = [s for s in local if s.attempt == attempt]
            if attempt != self._attempt:
                self._attempt = attempt
                self.straggler.reset()
        for s in snaps:
            self._ingest(s, local=s.node == self.node)
        self._check_stragglers({s.rank for s in snaps if s.node == self.node})
        if time.monotonic() - self._last_strike_scan > 1.0:
            self._last_strike_scan = time.monotonic()
            self.strikes.scan()
        self._reap()
        if not local or self._attempt in self._handled:
            self._drop_capture()
            return None
        attempt = self._attempt
        cap = self._capture if self._capture is not None and self._capture.attempt == attempt else None
        worst, suspect = None, False
        for s in local:
            stalled = self._stall_s(s, now)
            to, basis = self.timeouts.timeout(s.phase)
            eff = stalled - self._paused(cap, s)
            if eff > to and (worst is None or eff / to > (worst[1] - self._paused(cap, worst[0])) / worst[2]):
                worst = (s, stalled, to, basis)
            suspect = suspect or stalled > self._suspect_at(to)
        if worst is None and not suspect:
            self._drop_capture()
            return None
        views = [self._view(s, now) for s in local]
        v = identify(views)
        assert v is not None
        cv = next(x for x in views if x.rank == v.rank)
        cs = next(s for s in local if s.rank == v.rank)
        if cap is not None and any(not cap.current(s) for s in local if s.rank in cap.native):
            self._drop_capture()  # the suspect moved on: not this stall's evidence
            cap = None
        if worst is None or cv.stalled_s - self._paused(cap, cs) <= cv.timeout_s:
            # Not a hang (yet): the rank everyone waits for is within its own phase budget.
            # Past its suspicion point, collect the evidence now, while the verdict ripens.
            if cap is None and cv.stalled_s > self._suspect_at(cv.timeout_s):
                self._reap(kill=True)  # a dropped capture's py-spy must not write into this one's files
                self._capture = start_capture(local, self.rd.stacks, attempt=attempt, py_spy=self.cfg.py_spy,
                                              native={cv.rank}, why="suspicion")
                self.suspicions += 1
                log.info("rank %d stalled %.1fs in %s (timeout %.1fs): collecting evidence", cv.rank, cv.stalled_s,
                         cv.phase, cv.timeout_s)
            return None
        return self._on_hang(local, views, worst, attempt, cap)

    # -- early evidence ------------------------------------------------------------------
    def _suspect_at(self, timeout_s: float) -> float:
        """Stall after which a rank's evidence is collected (``evidence_lead_s`` before its
        timeout, not before half of it; the timeout itself when the lead is 0)."""
        lead = self.cfg.evidence_lead_s
        return timeout_s if lead <= 0 else max(0.5 * timeout_s, timeout_s - lead)

    def _paused(self, cap: Capture | None, s: BeaconSnapshot) -> float:
        """Seconds of ``s``'s current stall that a native py-spy of ours held it stopped."""
        if cap is None or not cap.current(s):
            return 0.0
        return cap.paused_s(s.rank, self.cfg.py_spy_wait_s)

    def _drop_capture(self) -> None:
        if self._capture is not None:
            log.info("suspicion cleared; dropping the evidence collected since %s", self._capture.why)
            self._abandoned.extend(self._capture.abandon())
            self._capture = None
            self.dropped += 1

    def _reap(self, kill: bool = False) -> None:
        """Delete the py-spy output of dropped captures once their py-spy ended (``kill``: end it)."""
        left = []
        for proc, path in self._abandoned:
            if kill and proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.poll() is None:
                left.append((proc, path))
            else:
                path.unlink(missing_ok=True)
        self._abandoned = left

    def _stall_s(self, s: BeaconSnapshot, now: int) -> float:
        """Seconds ``s`` has shown no progress: since its last update by its own clock, but
        never longer than this watchdog has seen its heartbeat stand still. A clean CI run
        was once declared hung with "rank 0 stalled 25418.6s" — the whole monotonic clock, a
        last update read as 0 — while its heartbeat kept moving (716 at the end); a
        timestamp can be wrong, a heartbeat that changed between two reads cannot."""
        seen = self._hb_seen.get(s.path)
        if seen is None or seen[0] != s.pid or seen[1] != s.heartbeat:
            seen = (s.pid, s.heartbeat, now)
            self._hb_seen[s.path] = seen
        own = (now - s.last_mono_ns) / 1e9
        watched = (now - seen[2]) / 1e9
        if own > watched + 60.0 and seen[2] == now:
            log.warning("beacon %s: last update %.1fs ago by its clock but its heartbeat just moved; using %.1fs",
                        s.path, own, watched)
        return min(own, watched)

    def _view(self, s: BeaconSnapshot, now: int) -> RankView:
        return RankView(node=s.node, rank=s.rank, local_rank=s.local_rank, pid=s.pid, attempt=s.attempt, step=s.step,
                        phase=s.phase, issued=list(s.issued), completed=list(s.completed), last_wall_ns=s.last_wall_ns,
                        phase_wall_ns=s.phase_wall_ns, stalled_s=self._stall_s(s, now),
                        timeout_s=self.timeouts.timeout(s.phase)[0])

    def _ingest(self, s: BeaconSnapshot, *, local: bool) -> None:
        pid, pc, sc = self._cursor.get(s.path, (s.pid, 0, 0))
        if pid != s.pid:
            pc, sc = 0, 0
        new_p = min(s.phase_count - pc, len(s.phase_ring))
        if local and new_p > 0:
            for ph, dur in s.phase_ring[-new_p:]:
                self.timeouts.observe(ph, dur / 1e9)
        new_s = min(s.step_count - sc, len(s.step_ring))
        if new_s > 0:
            for step, compute_ns, step_ns in s.step_ring[-new_s:]:
                if local:
                    self.timeouts.observe_step(step_ns / 1e9)
                if s.attempt == self._attempt or self._attempt is None:
                    self.straggler.add(s.rank, step, compute_ns / 1e9)
        self._cursor[s.path] = (s.pid, s.phase_count, s.step_count)

    # -- stragglers --------------------------------------------------------------------
    def _check_stragglers(self, local_ranks: set[int]) -> None:
        for f in self.straggler.check():
            if f["rank"] not in local_ranks:
                continue  # the straggler's own node reports it
            n = self._straggler_flags[f["rank"]] = self._straggler_flags.get(f["rank"], 0) + 1
            self.events.emit("straggler.detected",
                             f"rank {f['rank']} is {f['slowdown']:.2f}x slower than its peers (compute, "
                             f"median of {f['window']} steps)", level="warning", step=f["step"],
                             data={**f, "node": self.node, "flags": n, "attempt": self._attempt})
            if n % self.cfg.straggler_strike_after == 0:
                self.strikes.add("straggler", f"rank {f['rank']} {f['slowdown']:.2f}x slower, flagged {n} times",
                                 fault_t=time.time(), window_s=600.0)

    # -- hangs -------------------------------------------------------------------------
    def _on_hang(self, local: list[BeaconSnapshot], views: list[RankView],
                 worst: tuple[BeaconSnapshot, float, float, str], attempt: int,
                 cap: Capture | None) -> dict[str, Any]:
        t_trigger = time.time()
        self._handled.add(attempt)
        trig, stalled, to, basis = worst
        if cap is None:
            self._reap(kill=True)  # a dropped capture's py-spy must not write into this one's files
            cap = start_capture(local, self.rd.stacks, attempt=attempt, py_spy=self.cfg.py_spy,
                                native={identify(views).rank}, why="verdict")  # type: ignore[union-attr]
        self._capture = None
        cap.wait_dumps(self.cfg.dump_wait_s)
        evidence = cap.evidence()
        for v in views:
            fr = evidence.get(v.rank, {}).get("flight_recorder")
            v.fr_seq = fr_last_seq(fr) if fr else None
        hang_dir = self.rd.path / "hang" / f"attempt{attempt}"
        hang_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_json(hang_dir / f"{self.node}.json", {
            "node": self.node, "t": time.time(), "views": [v.to_dict() for v in views],
            "evidence": {str(k): e for k, e in evidence.items()}})
        world = max(s.world for s in local)
        all_views, all_evidence = self._gather(hang_dir, world)
        verdict, decided = self._decide(hang_dir, identify(list(all_views.values())))
        t_done = time.time()
        mine = next((s for s in local if s.rank == verdict.rank and s.node == verdict.node), None)
        if mine is not None and add_native(cap, mine, self.rd.stacks, py_spy=self.cfg.py_spy):
            all_evidence.setdefault(str(mine.rank), {})["py_spy"] = str(cap.evidence()[mine.rank]["py_spy"])
        culprit_view = all_views.get(verdict.rank)
        stall_start = (culprit_view.last_wall_ns / 1e9) if culprit_view else (t_trigger - stalled)
        rec = {
            "culprit": {"rank": verdict.rank, "node": verdict.node, "phase": verdict.phase, "step": verdict.step},
            "reason": verdict.reason, "detail": verdict.detail, "attempt": attempt,
            "trigger": {"rank": trig.rank, "phase": trig.phase, "stalled_s": stalled, "timeout_s": to, "basis": basis},
            "detection_latency_s": t_done - stall_start, "evidence_s": t_done - t_trigger,
            "evidence": all_evidence, "capture": cap.summary(self.cfg.py_spy_wait_s),
            "decided_by": self.node if decided else "another node",
            "views": [v.to_dict() for v in sorted(all_views.values(), key=lambda x: x.rank)],
            "verdict_file": str(hang_dir / "verdict.json"),
        }
        self.hangs.append(rec)
        msg = (f"hang: rank {verdict.rank} (node {verdict.node}) stuck in {verdict.phase} at step {verdict.step} "
               f"[{verdict.reason}]; rank {trig.rank} stalled {stalled:.1f}s > {to:.1f}s ({basis})")
        self.events.emit("hang.detected" if decided else "hang.observed", msg, level="error", step=verdict.step,
                         phase=verdict.phase, data=rec)
        if verdict.node == self.node:
            self.strikes.add("hang", f"rank {verdict.rank} stuck in {verdict.phase} at step {verdict.step}",
                             fault_t=stall_start)
        t_spy = time.monotonic()
        spied = cap.wait_spies(self.cfg.py_spy_wait_s) if cap.spies else 0  # needs the processes alive
        if self.kill:
            pids = kill_workers(local)
            self._killed.update(pids)
            self.events.emit("hang.killed", f"SIGKILL to {len(pids)} local worker(s) so the group restarts",
                             level="warning", data={"pids": pids, "attempt": attempt, "py_spy_done": spied,
                                                    "py_spy_s": time.monotonic() - t_spy})
        return rec

    def _gather(self, hang_dir: Path, world: int) -> tuple[dict[int, RankView], dict[str, dict[str, str]]]:
        deadline = time.monotonic() + self.cfg.agree_wait_s
        while True:
            views: dict[int, RankView] = {}
            evidence: dict[str, dict[str, str]] = {}
            for p in sorted(hang_dir.glob("*.json")):
                if p.name == "verdict.json":
                    continue
                try:
                    obj = json.loads(p.read_text())
                except (OSError, ValueError):
                    continue
                for d in obj.get("views", []):
                    rv = RankView.from_dict(d)
                    views[rv.rank] = rv
                evidence.update(obj.get("evidence", {}))
            if len(views) >= world or time.monotonic() >= deadline:
                return views, evidence
            time.sleep(0.05)

    def _decide(self, hang_dir: Path, mine: Verdict | None) -> tuple[Verdict, bool]:
        """First node to link ``verdict.json`` decides; the others adopt its verdict."""
        assert mine is not None
        final = hang_dir / "verdict.json"
        tmp = hang_dir / f".verdict.{self.node}.tmp"
        atomic_write_json(tmp, {"rank": mine.rank, "node": mine.node, "phase": mine.phase, "step": mine.step,
                                "reason": mine.reason, "detail": mine.detail, "by": self.node})
        try:
            os.link(tmp, final)
            return mine, True
        except FileExistsError:
            obj = json.loads(final.read_text())
            return Verdict(int(obj["rank"]), obj["node"], obj["phase"], int(obj["step"]), obj["reason"],
                           obj.get("detail", {})), False
        finally:
            tmp.unlink(missing_ok=True)

    # -- exclusion ---------------------------------------------------------------------
    def _default_exclude(self, reason: str) -> None:
        from titan.exitcodes import ExitCode
        from titan.events.abort import request_abort

        request_abort(self.rd, reason, exit_code=ExitCode.JOB_FAILED, node=self.node, by="watchdog")

    def check_exclusion(self) -> None:
        """Leave the job (once) when this node is over its strike limit."""
        if self._excluded or self.ledger is None or not self.ledger.is_excluded(self.node):
            return
        self._excluded = True
        n = self.ledger.count(self.node)
        reason = f"node {self.node} has {n} strikes (limit {self.ledger.limit}); it leaves the job"
        self.events.emit("node.excluded", reason, level="error",
                         data={"node": self.node, "strikes": n, "limit": self.ledger.limit, "when": "during run"})
        self.on_exclude(reason)
