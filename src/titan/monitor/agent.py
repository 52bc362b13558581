"""The node agent: sample every collector each tick, judge, and write it all down.

Per tick (``agent.interval_s``): collect → static rules → baselines → peer comparison →
outputs. Outputs, all in the run directory when there is one:

* ``metrics/agent.<node>.jsonl`` — compact samples (``titan.monitor.samples``);
* ``agent.<node>.jsonl`` — events: ``agent.start``/``agent.stop``, ``agent.collector``
  (a collector's status changed), ``agent.alert``/``agent.clear`` (rule, baseline or
  peer), ``agent.xid`` and ``agent.kernel`` (kernel-log and NVML findings),
  ``agent.sample`` (a snapshot of the watched series every ``sample_event_every_s``);
* the latest snapshot for the Prometheus exporter (``titan.monitor.prom``).

The agent never imports torch.
"""

from __future__ import annotations

import collections
import dataclasses
import fnmatch
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

from titan.events import EventWriter, RunDir
from titan.monitor.base import Collector, ProcFS, Reading, parse_key, unavailable
from titan.monitor.baseline import BaselineBank
from titan.monitor.peer import PeerComparator, PeerExchange
from titan.monitor.rules import RuleEngine, build_rules
from titan.monitor.samples import SampleWriter, compact
from titan.monitor.transient import TransientDetectors
from titan.settings.agent import AgentConfig

__all__ = ["Agent", "TickResult", "build_collectors", "DEFAULT_FLOORS", "default_state_dir"]

log = logging.getLogger(__name__)

#: Per metric name: (relative floor, absolute floor) of a baseline's or peer group's scale,
#: so that a series that is almost constant (MAD ≈ 0) does not alarm on tiny wiggles.
DEFAULT_FLOORS: dict[str, tuple[float, float]] = {
    "net_probe_rtt_seconds": (0.25, 0.0005),
    "disk_read_latency_seconds": (0.25, 0.002),
    "disk_write_latency_seconds": (0.25, 0.002),
    "host_softirqs_all_per_second": (0.25, 50.0),
    "host_cpu_softirq_ratio": (0.25, 0.02),
    "host_pressure_ratio": (0.25, 0.05),
    "gpu_temperature_celsius": (0.03, 2.0),
    "gpu_power_watts": (0.1, 20.0),
    "gpu_sm_clock_hertz": (0.03, 30e6),
}


def default_state_dir() -> Path:
    """Where the agent keeps state across restarts (ECC ledger): $XDG_STATE_HOME/titan."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "titan"


def build_collectors(cfg: AgentConfig, node: str, run_dir: RunDir | None, *, proc_root: str = "/") -> list[Collector]:
    """The collectors named in ``cfg.collectors``, configured from settings."""
    from titan.monitor.disk import DiskCollector
    from titan.monitor.gpu import GpuCollector
    from titan.monitor.host import HostCollector
    from titan.monitor.ipmi import IpmiCollector
    from titan.monitor.kmsg import KmsgCollector
    from titan.monitor.net import NetCollector
    from titan.monitor.probe import EchoProbe

    proc = ProcFS(proc_root)
    state = Path(cfg.state_dir) if cfg.state_dir else default_state_dir()
    watch = cfg.ckpt_dir or (str(run_dir.checkpoints) if run_dir else os.getcwd())
    out: list[Collector] = []
    for name in cfg.collectors:
        if name == "gpu":
            out.append(GpuCollector(state_file=state / "gpu-ecc.json", xid_actions=cfg.xid_actions))
        elif name == "host":
            out.append(HostCollector(proc))
        elif name == "disk":
            out.append(DiskCollector(proc, watch_path=watch))
        elif name == "net":
            probe = None
            if cfg.probe and run_dir is not None:
                probe = _job_probe(cfg, node, run_dir)
            out.append(NetCollector(proc, probe=probe, window_s=cfg.net_window_s, min_packets=cfg.net_min_packets))
        elif name == "kmsg":
            out.append(KmsgCollector(xid_actions=cfg.xid_actions))
        elif name == "ipmi":
            out.append(IpmiCollector(every_s=cfg.ipmi_every_s))
    return out


def _job_probe(cfg: AgentConfig, node: str, run_dir: RunDir) -> Any:
    """The echo probe keyed by the job secret (``TITAN_RDZV_SECRET`` from ``titan run``), or None.

    Without a secret the probe stays off: it would answer pings nobody can authenticate.
    """
    from titan.errors import UserError
    from titan.monitor.probe import EchoProbe, default_probe_host
    from titan.security.secret import resolve_secret

    try:
        secret = resolve_secret(None, os.environ)
    except UserError as e:
        log.warning("echo probe disabled: %s", e)
        return None
    if secret is None:
        log.warning("echo probe disabled: no job secret (titan run hands its agent one; or set TITAN_RDZV_SECRET)")
        return None
    host = cfg.probe_host or default_probe_host()
    try:
        return EchoProbe(run_dir.metrics, node, host=host, timeout_s=cfg.probe_timeout_s, window=cfg.probe_window,
                         min_probes=min(100, cfg.probe_window), signer=secret.signer(), context=run_dir.run_id,
                         interval_s=cfg.probe_interval_s or None)
    except OSError as e:
        log.warning("echo probe disabled: cannot bind UDP on %r: %s", host, e)
        return None


@dataclasses.dataclass
class TickResult:
    t: float
    readings: list[Reading]
    metrics: dict[str, float]
    alerts: list[dict[str, Any]]


class Agent:
    """One node's agent; ``tick`` is the whole work of one interval (see module docstring)."""

    def __init__(self, cfg: AgentConfig, *, node: str, run_dir: RunDir | None = None,
                 collectors: list[Collector] | None = None, floors: dict[str, tuple[float, float]] | None = None,
                 beacon_dir: Path | None = None) -> None:
        self.cfg = cfg
        self.node = node
        self.run_dir = run_dir
        self.collectors = collectors if collectors is not None else build_collectors(cfg, node, run_dir)
        self.rules = RuleEngine(build_rules(cfg.rules))
        floors = {**DEFAULT_FLOORS, **(floors or {})}
        per = max(cfg.interval_s, 1e-3)
        self.baselines = BaselineBank(z=cfg.baseline_z, window=max(10, int(cfg.baseline_window_s / per)),
                                      warmup=max(1, int(cfg.baseline_warmup_s / per)),
                                      min_duration_s=cfg.baseline_min_duration_s,
                                      fire_fraction=cfg.baseline_fire_fraction, floors=floors)
        self._baseline_names = set(cfg.baseline_metrics)
        # Seconds-scale transients (host pressure, a sick link); beacons give the job's step times.
        if beacon_dir is None and run_dir is not None:
            beacon_dir = run_dir.path / "beacons"
        self.transient = TransientDetectors(node, beacon_dir=beacon_dir) if cfg.fast_detectors else None
        self.peers = PeerComparator(z=cfg.peer_z, min_nodes=cfg.peer_min_nodes,
                                    min_duration_s=cfg.peer_min_duration_s, floors=floors)
        self.exchange = (PeerExchange(run_dir.metrics, node, names=cfg.peer_metrics,
                                      stale_s=max(3 * cfg.peer_every_s, 60.0)) if run_dir else None)
        self.events = (EventWriter(run_dir.path / f"agent.{node}.jsonl", run=run_dir.run_id, node=node)
                       if run_dir else None)
        self.samples = (SampleWriter(run_dir.metrics / f"agent.{node}.jsonl", full_every=cfg.full_sample_every)
                        if run_dir else None)
        self.lock = threading.Lock()
        self.latest: dict[str, float] = {}
        self.status: dict[str, str] = {}
        self.active_alerts: dict[tuple[str, str], dict[str, Any]] = {}
        self.alert_counts: collections.Counter[str] = collections.Counter()
        self.ticks = 0
        self._last_sample_event = -1e18
        self._last_peer = time.monotonic()
        self.on_alert: list[Callable[[dict[str, Any]], None]] = []

    # -- events -------------------------------------------------------------------------
    def _emit(self, kind: str, msg: str, *, level: str = "info", data: dict[str, Any] | None = None) -> None:
        if self.events is not None:
            self.events.emit(kind, msg, level=level, data=data or {})
        if kind in ("agent.alert", "agent.xid", "agent.kernel") and level != "info":
            log.warning("%s: %s", kind, msg)
        else:
            log.info("%s: %s", kind, msg)

    def _alert(self, out: list[dict[str, Any]], transition: str, source: str, rule: str, key: str, msg: str,
               level: str, action: str = "alert", **data: Any) -> None:
        rec = {"transition": transition, "source": source, "rule": rule, "metric": key, "action": action,
               "level": level, **data}
        ident = (rule, key)
        if transition == "fire":
            self.active_alerts[ident] = rec
            self.alert_counts[rule] += 1
            self._emit("agent.alert", msg, level=level, data={k: v for k, v in rec.items() if k != "transition"})
        else:
            self.active_alerts.pop(ident, None)
            self._emit("agent.clear", f"cleared: {msg}", data={k: v for k, v in rec.items() if k not in ("transition", "level")})
        out.append(rec)
        for fn in self.on_alert:
            fn(rec)

    def start(self) -> None:
        """Emit ``agent.start`` with the configuration summary."""
        self._emit("agent.start", f"agent on {self.node} every {self.cfg.interval_s:g}s", data={
            "collectors": [c.name for c in self.collectors], "interval_s": self.cfg.interval_s,
            "rules": [r.name for r in self.rules.rules], "pid": os.getpid()})

    # -- one tick -------------------------------------------------------------------------
    def tick(self, now: float | None = None) -> TickResult:
        """Collect, judge and record one interval. Never raises for a collector's failure."""
        now = time.time() if now is None else now
        readings = []
        for c in self.collectors:
            try:
                readings.append(c.collect(now))
            except Exception as e:  # noqa: BLE001 - a broken collector must not stop the others
                log.exception("collector %s crashed", c.name)
                readings.append(Reading(c.name, status=unavailable(f"collector crashed: {type(e).__name__}: {e}")))
        metrics: dict[str, float] = {}
        alerts: list[dict[str, Any]] = []
        for r in readings:
            metrics.update(r.metrics)
            if self.status.get(r.collector) != r.status:
                if r.collector in self.status or not r.ok:
                    self._emit("agent.collector", f"{r.collector}: {r.status}",
                               level="info" if r.ok else "warning",
                               data={"collector": r.collector, "status": r.status,
                                     "previous": self.status.get(r.collector)})
                self.status[r.collector] = r.status
            for f in r.findings:
                kind = "agent.xid" if f.category == "xid" else "agent.kernel"
                data = {"category": f.category, "collector": r.collector, **f.data}
                if "pci" in data and data.get("gpu") is None:  # kernel-log Xid: name the GPU too
                    for c in self.collectors:
                        gpu = getattr(c, "gpu_for_pci", lambda _p: None)(data["pci"])
                        if gpu is not None:
                            data["gpu"] = gpu
                self._emit(kind, f.message, level=f.level, data=data)
                if f.level in ("error", "critical"):
                    self.alert_counts[f"kernel_{f.category}"] += 1
        for tr in self.rules.evaluate(now, metrics):
            self._alert(alerts, tr.transition, "threshold", tr.rule.name, tr.key,
                        f"{self.node}: {tr.message} ({tr.key} = {tr.observed:.4g})", tr.rule.level, tr.rule.action,
                        value=compact(tr.value), observed=compact(tr.observed), limit=tr.rule.limit,
                        since=tr.since, duration_s=round(now - tr.since, 3))
        for key, x in metrics.items():
            name = key.split("{", 1)[0]
            if name in self._baseline_names:
                v = self.baselines.observe(now, key, name, x)
                if v is not None:
                    self._alert(alerts, v.transition, "baseline", f"baseline:{name}", key,
                                f"{self.node}: {key} = {x:.4g} is {v.z:.1f} robust σ above its baseline "
                                f"(median {v.median:.4g})", "warning",
                                value=compact(x), median=compact(v.median), scale=compact(v.scale), z=round(v.z, 2),
                                since=v.since, duration_s=None if v.since is None else round(now - v.since, 3))
        if self.transient is not None:
            for tr in self.transient.evaluate(now, metrics):
                self._alert(alerts, tr.transition, "transient", tr.rule, tr.key, tr.message, "warning", **tr.data)
            metrics.update(self.transient.seen)
        self._peer_step(now, metrics, alerts)
        self._outputs(now, metrics)
        self.ticks += 1
        return TickResult(now, readings, metrics, alerts)

    def _peer_step(self, now: float, metrics: dict[str, float], alerts: list[dict[str, Any]]) -> None:
        if self.exchange is None:
            return
        self.exchange.add(metrics)
        mono = time.monotonic()
        if mono - self._last_peer < self.cfg.peer_every_s:
            return
        self._last_peer = mono
        try:
            self.exchange.publish(now)
            table = self.exchange.table(now)
        except OSError as e:
            log.warning("peer exchange failed: %s", e)
            return
        for v in self.peers.evaluate(now, table):
            if v.node != self.node:
                continue  # each agent speaks for its own node; the others speak for theirs
            self._alert(alerts, v.transition, "peer", f"peer:{v.metric}", v.metric,
                        f"{self.node}: {v.metric} = {v.value:.4g} departs from its {v.nodes - 1} peers "
                        f"(median {v.peers_median:.4g}, {v.z:+.1f} robust σ)", "warning",
                        node_named=v.node, value=compact(v.value), peers_median=compact(v.peers_median),
                        z=round(v.z, 2), nodes=v.nodes)

    def _outputs(self, now: float, metrics: dict[str, float]) -> None:
        with self.lock:
            self.latest = metrics
        if self.samples is not None:
            self.samples.write(now, metrics)
        if now - self._last_sample_event >= self.cfg.sample_event_every_s:
            self._last_sample_event = now
            watched = {r.metric for r in self.rules.rules} | self._baseline_names | set(self.cfg.peer_metrics)
            snap = {k: compact(v) for k, v in metrics.items()
                    if any(fnmatch.fnmatchcase(parse_key(k)[0], w) for w in watched)}
            self._emit("agent.sample", f"{len(snap)} watched series",
                       data={"m": snap, "status": dict(self.status), "active_alerts": len(self.active_alerts)})

    # -- loop ---------------------------------------------------------------------------
    def run(self, stop: threading.Event, *, max_ticks: int | None = None) -> None:
        """Tick every ``interval_s`` (drift-free schedule) until ``stop`` is set."""
        self.start()
        period = self.cfg.interval_s
        nxt = time.monotonic()
        try:
            while not stop.is_set():
                self.tick()
                if max_ticks is not None and self.ticks >= max_ticks:
                    break
                nxt += period
                delay = nxt - time.monotonic()
                if delay < 0:  # overran: skip missed ticks rather than bursting
                    nxt = time.monotonic()
                    delay = 0.0
                stop.wait(delay)
        finally:
            self._emit("agent.stop", f"agent on {self.node} stopped after {self.ticks} ticks",
                       data={"ticks": self.ticks, "alerts": dict(self.alert_counts)})

    def close(self) -> None:
        for c in self.collectors:
            try:
                c.close()
            except Exception:  # noqa: BLE001
                log.exception("closing collector %s", c.name)
        if self.samples is not None:
            self.samples.close()
        if self.events is not None:
            self.events.close()
