"""Fast detectors for transients that last seconds: host pressure and a sick link.

The agent's static rules and 3σ baselines are built for hours (a 300 s warm-up, 30–60 s
persistence); a CPU squeeze or a lossy link that lasts five seconds passes under them.
These detectors learn their baselines within the job's first seconds and speak within one
or two ticks, naming what is at fault. Every tick (:meth:`TransientDetectors.evaluate`):

**host_pressure** (names the node). The job's own step time, read from the local workers'
beacons (median of the steps completed in the last ``pressure_window_s``), against its
learned baseline (:class:`titan.monitor.baseline.RobustBaseline` over this attempt's
steps, first steps of an attempt left out). It fires when the steps are more than
``pressure_margin`` slower *and* beyond ``pressure_k`` standard errors (robust σ / √n of
the window's n ≥ 3 steps) — or, when a squeeze nearly froze the job and the window holds
only 1–2 steps, each of them ``pressure_few_factor`` × slower and ``pressure_k`` σ above
the baseline —, **and** at least one host
pressure signal departs from its own baseline by more than its floor:

| signal | source | departs when above its baseline by more than |
|---|---|---|
| ``cpu_wait`` | the workers' run-queue wait per second they ran (``/proc/<pid>/schedstat``; unbounded, so it still rises on a saturated host) | 0.3 and 50 % |
| ``run_queue`` | ``procs_running`` of ``/proc/stat`` | 1.5 tasks and 25 % |
| ``psi_cpu`` / ``psi_memory`` / ``psi_io`` | rate of ``/proc/pressure/*`` ``some`` stall time (a saturated ``psi_cpu`` never departs) | 0.15 / 0.05 / 0.10 |
| ``memory_drop`` | fall of ``MemAvailable`` below its maximum of the last 3 s | 256 MiB |

(and always by more than 4 robust σ of the signal's own history).

Slower steps without host pressure are someone else's case (a straggler, a link); pressure
without slower steps does not hurt this job. A squeeze on top of one still active (the
slowdown grows by :data:`ESCALATE`) closes it and fires anew.

**net_link_slow / net_link_loss / net_link_down** (name the link ``<node><-><peer>``), from
the echo probe (``titan.monitor.probe``) and the TCP counters of the namespace: the
probe's round-trip time — the median of one tick's pongs, judged only with at least
``link_min_pongs`` of them (the probe pings every ``agent.probe_interval_s``) — above
``link_rtt_factor`` × its learned median and ``link_rtt_floor_s`` above it for
``link_slow_samples`` ticks in a row: a busy host's loopback RTT has spikes of 5–130 ms
(a recorded clean hour has one every ~30 s, sometimes two in a row), which the median of
a tick's pongs ignores and a slow link does not; probe loss of
``link_loss_ratio`` or more over the last ``link_loss_window_s`` (at least 2 probes), or a
TCP retransmit ratio over ``link_loss_window_s`` above both ``link_retrans_ratio`` and 5×
its baseline; **down** when at least ``link_down_ratio`` of the probes of the last
``link_down_s`` were lost (at least 3) — a ping counts as lost ``agent.probe_timeout_s``
after it was sent, so a one-second partition shows as about half the pings of the
two-second window. A loss or down alert carries ``evidence_t``: the wall-clock time the
newest lost probe was sent (``titan.monitor.probe``) — when the link lost it, which a drill
uses to tell which fault an alert that came late belongs to.

An alert clears when its condition has been gone for ``clear_ticks`` ticks. Cost per tick:
one read of each local beacon (12 KB) and of each worker's schedstat; a few sorts of at
most ``window`` floats.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import statistics
from pathlib import Path
from typing import Any, Callable, Mapping

from titan.monitor.base import ProcFS, metric_key, parse_key
from titan.monitor.baseline import RobustBaseline

__all__ = ["TransientConfig", "TransientDetectors", "Transition"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TransientConfig:
    """Thresholds of the fast detectors (see the module doc)."""

    pressure_window_s: float = 2.0
    pressure_margin: float = 0.4
    pressure_k: float = 4.0
    pressure_warmup_steps: int = 20
    pressure_skip_steps: int = 5
    pressure_few_factor: float = 2.5
    link_rtt_factor: float = 3.0
    link_rtt_floor_s: float = 0.02
    link_slow_samples: int = 2
    link_min_pongs: int = 3
    link_loss_ratio: float = 0.05
    link_loss_window_s: float = 3.0
    link_retrans_ratio: float = 0.005
    link_down_s: float = 2.0
    link_down_ratio: float = 0.4
    clear_ticks: int = 3


#: Host pressure signals: name → (absolute, relative) floor of a departure from the signal's baseline.
_FLOORS = {"cpu_wait": (0.3, 0.5), "run_queue": (1.5, 0.25), "psi_cpu": (0.15, 0.0), "psi_memory": (0.05, 0.0),
           "psi_io": (0.10, 0.0), "memory_drop": (float(256 << 20), 0.0)}
_MEM_WINDOW_S = 3.0
#: An active host_pressure episode is closed and a new one fired when the slowdown grows
#: beyond this factor of the one it fired at.
ESCALATE = 1.5


@dataclasses.dataclass
class Transition:
    """A detector's fire or clear; ``key`` tells episodes of the same rule apart."""

    rule: str
    key: str
    transition: str  # fire | clear
    message: str
    data: dict[str, Any]


class _Episode:
    __slots__ = ("active", "quiet", "fired", "ratio")

    def __init__(self) -> None:
        self.active = False
        self.quiet = 0
        self.fired = 0
        self.ratio = 0.0  # the slowdown it fired at


def _baseline(warmup: int, window: int = 600) -> RobustBaseline:
    return RobustBaseline(window=window, warmup=warmup, refresh=5, rel_floor=0.05, tail_q=None)


class TransientDetectors:
    """The fast detectors of one node's agent (see the module doc)."""

    def __init__(self, node: str, *, beacon_dir: Path | None, proc: ProcFS | None = None,
                 cfg: TransientConfig | None = None,
                 steps: Callable[[float], tuple[list[int], list[float]]] | None = None) -> None:
        """``steps(now)`` → (worker pids, step times completed since the last call); by default
        read from the local workers' beacons in ``beacon_dir``."""
        self.node = node
        self.beacon_dir = beacon_dir
        self._steps = steps or self._read_steps
        self.proc = proc or ProcFS("/")
        self.cfg = cfg or TransientConfig()
        self._cursor: dict[str, tuple[int, int]] = {}  # beacon path -> (pid, step count)
        self._attempt: int | None = None
        self._attempt_steps = 0
        self._recent: collections.deque[tuple[float, float]] = collections.deque()  # (t, step s)
        self._step_base = _baseline(self.cfg.pressure_warmup_steps)
        self._sig_base = {k: _baseline(5, 120) for k in _FLOORS}
        self._prev: dict[str, tuple[float, float]] = {}  # counter name -> (t or run, total or wait)
        self._mem: collections.deque[tuple[float, float]] = collections.deque()  # (t, MemAvailable)
        self._episodes: dict[str, _Episode] = collections.defaultdict(_Episode)
        self._rtt_base: dict[str, RobustBaseline] = {}
        self._rtt_high: dict[str, int] = collections.defaultdict(int)
        self._probe: dict[str, collections.deque[tuple[float, float, float]]] = {}  # peer -> (t, sent, lost)
        self._tcp: collections.deque[tuple[float, float, float]] = collections.deque()
        self._retrans_base = _baseline(3, 120)
        self.seen: dict[str, float] = {}

    # -- the job's steps ------------------------------------------------------------------
    def _read_steps(self, now: float) -> tuple[list[int], list[float]]:
        """New step times of the local workers since the last tick: (their pids, the times)."""
        if self.beacon_dir is None:
            return [], []
        from titan.beacon.layout import STATE_RUNNING
        from titan.beacon.reader import scan_beacons

        snaps = [s for s in scan_beacons(self.beacon_dir) if s.node == self.node and s.state == STATE_RUNNING]
        if not snaps:
            return [], []
        attempt = max(s.attempt for s in snaps)
        if attempt != self._attempt:  # a new attempt: warm-up and compile differ; learn again
            self._attempt, self._attempt_steps = attempt, 0
            self._step_base = _baseline(self.cfg.pressure_warmup_steps)
            self._recent.clear()
        new: list[float] = []
        for s in snaps:
            if s.attempt != attempt:
                continue
            pid, seen = self._cursor.get(s.path, (s.pid, 0))
            if pid != s.pid:
                seen = 0
            n = min(s.step_count - seen, len(s.step_ring))
            if n > 0:
                new += [step_ns / 1e9 for _step, _c, step_ns in s.step_ring[-n:]]
            self._cursor[s.path] = (s.pid, s.step_count)
        kept = []
        for x in new:
            self._attempt_steps += 1
            if self._attempt_steps > self.cfg.pressure_skip_steps * max(1, len(snaps)):
                kept.append(x)
        return [s.pid for s in snaps if s.attempt == attempt], kept

    def _rate(self, name: str, now: float, total: float) -> float | None:
        prev = self._prev.get(name)
        self._prev[name] = (now, total)
        if prev is None or now <= prev[0] or total < prev[1]:
            return None
        return (total - prev[1]) / (now - prev[0])

    def _signals(self, now: float, metrics: Mapping[str, float], pids: list[int]) -> dict[str, float]:
        out: dict[str, float] = {}
        run = wait = 0.0
        for pid in pids:
            text = self.proc.read(f"/proc/{pid}/schedstat")
            if not text:
                continue
            try:
                f = text.split()
                run, wait = run + int(f[0]) / 1e9, wait + int(f[1]) / 1e9
            except (IndexError, ValueError):
                continue
        key = f"sched:{sorted(pids)}"
        prev = self._prev.get(key)
        self._prev[key] = (run, wait)
        if prev is not None and run - prev[0] > 1e-3 and wait >= prev[1]:
            out["cpu_wait"] = (wait - prev[1]) / (run - prev[0])
        for res in ("cpu", "memory", "io"):
            v = metrics.get(metric_key("host_pressure_stalled_seconds_total", kind="some", resource=res))
            if v is not None:
                r = self._rate(f"psi:{res}", now, v)
                if r is not None:
                    out[f"psi_{res}"] = r
        if "host_procs_running" in metrics:
            out["run_queue"] = metrics["host_procs_running"]
        avail = metrics.get("host_memory_available_bytes")
        if avail is not None:
            self._mem.append((now, avail))
            while self._mem and self._mem[0][0] < now - _MEM_WINDOW_S:
                self._mem.popleft()
            out["memory_drop"] = max(v for _, v in self._mem) - avail
        return out

    def _pressure(self, now: float, metrics: Mapping[str, float]) -> list[Transition]:
        pids, new_steps = self._steps(now)
        self._recent.extend((now, x) for x in new_steps)
        while self._recent and self._recent[0][0] < now - self.cfg.pressure_window_s:
            self._recent.popleft()
        sigs = self._signals(now, metrics, pids)
        base = self._step_base
        cur = statistics.median(x for _, x in self._recent) if self._recent else None
        slow = False
        if cur is not None and base.ready:
            # The window's median of n steps wanders by about σ/√n: judged against that. A
            # squeeze that nearly freezes the job leaves fewer than 3 steps in the window
            # (at load 27 one step took 1.8 s against 0.44 s): 1–2 steps count when each is
            # ``pressure_few_factor`` × slower and beyond k σ on its own.
            n = min(len(self._recent), 16)
            slow = (cur > base.median * (1 + self.cfg.pressure_margin) and n >= 3
                    and cur - base.median > self.cfg.pressure_k * base.scale / n ** 0.5) or \
                (n < 3 and min(x for _, x in self._recent) > base.median * self.cfg.pressure_few_factor
                 and cur - base.median > self.cfg.pressure_k * base.scale)
        high: dict[str, tuple[float, float]] = {}
        for k, x in sigs.items():
            b = self._sig_base[k]
            floor, rel = _FLOORS[k]
            if b.ready and x - b.median > max(floor, rel * abs(b.median), 4 * b.scale):
                high[k] = (b.median, x)
        ep = self._episodes["host_pressure"]
        cond = slow and bool(high)
        ratio_now = cur / base.median if cur is not None and base.ready and base.median > 0 else 0.0
        out: list[Transition] = []
        if cond and ep.active and ratio_now > ESCALATE * ep.ratio:
            # A new squeeze on top of one still active (another job's, say): a new episode, or
            # the second would pass unseen under the first.
            out.append(Transition("host_pressure", f"host_pressure#{ep.fired}", "clear",
                                  f"{self.node}: host pressure escalated", {"node_named": self.node}))
            ep.active = False
        log.debug("pressure: step %s base %.4f±%.4f ready=%s slow=%s sigs=%s base=%s high=%s", cur,
                  base.median, base.scale, base.ready, slow, {k: round(v, 3) for k, v in sigs.items()},
                  {k: round(b.median, 3) for k, b in self._sig_base.items()}, list(high))
        if cond and not ep.active:
            ep.active, ep.quiet = True, 0
            ep.fired += 1
            ep.ratio = ratio_now
            assert cur is not None
            ratio = cur / base.median if base.median > 0 else float("inf")
            evidence = ", ".join(_fmt(k, b, x) for k, (b, x) in sorted(high.items()))
            out.append(Transition("host_pressure", f"host_pressure#{ep.fired}", "fire",
                                  f"{self.node}: steps {ratio:.1f}x slower ({base.median * 1e3:.0f} -> "
                                  f"{cur * 1e3:.0f} ms) under host pressure: {evidence}",
                                  {"node_named": self.node, "step_s": round(cur, 4), "baseline_step_s":
                                   round(base.median, 4), "ratio": round(ratio, 2), "signals": {
                                       k: {"baseline": round(b, 4), "value": round(x, 4)} for k, (b, x) in high.items()},
                                   "evidence": f"steps {ratio:.1f}x slower; {evidence}"}))
        elif ep.active:
            ep.quiet = 0 if cond or slow else ep.quiet + 1
            if ep.quiet >= self.cfg.clear_ticks:
                ep.active = False
                out.append(Transition("host_pressure", f"host_pressure#{ep.fired}", "clear",
                                      f"{self.node}: host pressure over", {"node_named": self.node}))
        # Learn only from calm ticks: a squeeze must not become the normal it is judged by.
        if not slow and not ep.active:
            for x in new_steps:
                base.add(x)
            for k, x in sigs.items():
                if k not in high:
                    self._sig_base[k].add(x)
        self._recent_step_ratio = (cur / base.median) if cur is not None and base.ready and base.median > 0 else None
        # What the detector saw, as metrics (samples file, Prometheus): a miss can be read back.
        seen = {"host_job_step_seconds": cur, "host_job_step_baseline_seconds": base.median if base.ready else None,
                "host_job_run_queue_wait_ratio": sigs.get("cpu_wait"),
                "host_memory_available_drop_bytes": sigs.get("memory_drop")}
        self.seen = {k: v for k, v in seen.items() if v is not None}
        return out

    # -- links --------------------------------------------------------------------------
    def _links(self, now: float, metrics: Mapping[str, float]) -> list[Transition]:
        c = self.cfg
        out: list[Transition] = []
        peers: dict[str, dict[str, float]] = collections.defaultdict(dict)
        for key, v in metrics.items():
            name, labels = parse_key(key)
            if name.startswith("net_probe_") and "peer" in labels:
                peers[labels["peer"]][name] = v
        steps = getattr(self, "_recent_step_ratio", None)  # the collectives' view: this node's steps
        step_txt = f"; steps {steps:.1f}x their baseline" if steps and steps > 1.2 else ""
        for peer, m in sorted(peers.items()):
            link = sorted([self.node, peer])
            # round-trip time
            rtt = m.get("net_probe_rtt_median_seconds")
            if m.get("net_probe_pongs", 0.0) < c.link_min_pongs:
                rtt = None  # too few pongs this tick to tell a slow link from a busy host
            b = self._rtt_base.setdefault(peer, _baseline(10, 300))
            slow = False
            if rtt is not None:
                slow = b.ready and rtt > max(c.link_rtt_factor * b.median, b.median + c.link_rtt_floor_s)
                self._rtt_high[peer] = self._rtt_high[peer] + 1 if slow else 0
                if not slow and not self._episodes[f"slow:{peer}"].active:
                    b.add(rtt)
            out += self._episode("net_link_slow", f"slow:{peer}", link, self._rtt_high[peer] >= c.link_slow_samples,
                                 f"probe rtt {b.median * 1e3:.2f} -> {(rtt or 0) * 1e3:.1f} ms{step_txt}",
                                 {"rtt_s": rtt, "baseline_rtt_s": round(b.median, 6)})
            # loss and down, from the probe's counters
            dq = self._probe.setdefault(peer, collections.deque())
            if "net_probe_sent_total" in m:
                dq.append((now, m["net_probe_sent_total"], m.get("net_probe_lost_total", 0.0)))
            while len(dq) > 2 and dq[1][0] <= now - max(c.link_loss_window_s, c.link_down_s) - 1.0:
                dq.popleft()
            sent, lost = _delta(dq, now - c.link_loss_window_s)
            ratio = lost / sent if sent > 0 else 0.0
            down_sent, down_lost = _delta(dq, now - c.link_down_s)
            down = down_lost >= 3 and down_lost >= c.link_down_ratio * max(down_sent, 1.0)
            # When the loss happened: the newest lost ping's send time (counted lost a probe
            # timeout later, or later still if this agent fell behind).
            ev_t = m.get("net_probe_last_lost_sent_seconds")
            when = {"evidence_t": round(ev_t, 3)} if ev_t is not None else {}
            out += self._episode("net_link_down", f"down:{peer}", link, down,
                                 f"{int(down_lost)} of {int(down_sent)} probes lost in {c.link_down_s:g} s{step_txt}",
                                 {"lost": down_lost, "sent": down_sent, **when})
            out += self._episode("net_link_loss", f"loss:{peer}", link, lost >= 2 and ratio >= c.link_loss_ratio
                                 and not down, f"probe loss {ratio:.0%} ({int(lost)}/{int(sent)}){step_txt}",
                                 {"probe_loss_ratio": round(ratio, 4), **when})
        # TCP retransmits of this namespace: the link(s) to every peer the probe knows.
        rs, os_ = metrics.get("net_tcp_retransmitted_segments_total"), metrics.get("net_tcp_sent_segments_total")
        if rs is not None and os_ is not None and peers:
            self._tcp.append((now, rs, os_))
            while len(self._tcp) > 2 and self._tcp[1][0] <= now - c.link_loss_window_s:
                self._tcp.popleft()
            t0, r0, o0 = self._tcp[0]
            dout = os_ - o0
            ratio = (rs - r0) / dout if dout >= 200 else None
            b = self._retrans_base
            bad = ratio is not None and b.ready and ratio > max(c.link_retrans_ratio, 5 * b.median)
            if ratio is not None and not bad and not self._episodes["retrans"].active:
                b.add(ratio)
            link = sorted([self.node, *peers])
            out += self._episode("net_link_loss", "retrans", link, bad,
                                 f"TCP retransmits {(ratio or 0):.2%} of segments (baseline {b.median:.2%}){step_txt}",
                                 {"retransmit_ratio": ratio, "baseline_ratio": round(b.median, 5)})
        return out

    def _episode(self, rule: str, ident: str, link: list[str], cond: bool, evidence: str,
                 data: dict[str, Any]) -> list[Transition]:
        ep = self._episodes[ident]
        if cond and not ep.active:
            ep.active, ep.quiet = True, 0
            ep.fired += 1
            return [Transition(rule, f"{rule}:{ident}#{ep.fired}", "fire", f"link {'<->'.join(link)}: {evidence}",
                               {"link": link, "evidence": evidence, **data})]
        if ep.active:
            ep.quiet = 0 if cond else ep.quiet + 1
            if ep.quiet >= self.cfg.clear_ticks:
                ep.active = False
                return [Transition(rule, f"{rule}:{ident}#{ep.fired}", "clear", f"link {'<->'.join(link)}: healthy",
                                   {"link": link})]
        return []

    def evaluate(self, now: float, metrics: Mapping[str, float]) -> list[Transition]:
        """Judge one tick's metrics (and the beacons); returns fire/clear transitions."""
        return self._pressure(now, metrics) + self._links(now, metrics)


def _delta(dq: collections.deque[tuple[float, float, float]], since: float) -> tuple[float, float]:
    """(sent, lost) between the newest point and the last one at or before ``since``."""
    if len(dq) < 2:
        return 0.0, 0.0
    base = dq[0]
    for p in dq:
        if p[0] <= since:
            base = p
    return dq[-1][1] - base[1], dq[-1][2] - base[2]


def _fmt(k: str, b: float, x: float) -> str:
    if k == "memory_drop":
        return f"MemAvailable -{x / 2**20:.0f} MiB"
    if k == "run_queue":
        return f"run queue {b:.1f} -> {x:.1f}"
    return f"{k} {b:.0%} -> {x:.0%}"
