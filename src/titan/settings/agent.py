"""Settings of the node agent (``titan agent``, ``titan.monitor``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from titan.settings.core import register_section, require

__all__ = ["AgentConfig"]

_COLLECTORS = ("gpu", "host", "disk", "net", "kmsg", "ipmi")


@register_section("agent")
@dataclasses.dataclass(frozen=True, kw_only=True)
class AgentConfig:
    """Sampling, outputs, alert rules, baselines and peer comparison of the agent.

    ``rules`` overrides the default alert table per rule (``[agent.rules.<name>]``
    tables in the settings file, see ``docs/agent.md``); ``xid_actions`` overrides the
    action of an Xid code (``{"79" = "log_only"}``).
    """

    interval_s: float = dataclasses.field(default=1.0, metadata={"range": (0.01, 3600)})
    collectors: tuple[str, ...] = _COLLECTORS
    prometheus_port: int = 0
    prometheus_addr: str = "127.0.0.1"
    ckpt_dir: str = ""
    state_dir: str = ""
    sample_event_every_s: float = 60.0
    full_sample_every: int = 60
    probe: bool = True
    probe_host: str = ""
    probe_timeout_s: float = 1.0
    probe_window: int = 300
    #: Seconds between two pings of every peer, from the probe's own thread (0: one per tick).
    probe_interval_s: float = 0.2
    ipmi_every_s: float = 30.0
    net_window_s: float = 60.0
    net_min_packets: int = 1000
    rules: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: The seconds-scale detectors (host_pressure, net_link_*; titan.monitor.transient).
    fast_detectors: bool = True
    xid_actions: dict[str, str] = dataclasses.field(default_factory=dict)
    baseline_metrics: tuple[str, ...] = (
        "net_probe_rtt_seconds", "disk_read_latency_seconds", "disk_write_latency_seconds",
        "host_softirqs_all_per_second", "host_cpu_softirq_ratio",
    )
    baseline_z: float = 3.0
    baseline_window_s: float = 3600.0
    baseline_warmup_s: float = 300.0
    baseline_min_duration_s: float = 30.0
    baseline_fire_fraction: float = 0.8
    peer_metrics: tuple[str, ...] = (
        "gpu_temperature_celsius", "gpu_power_watts", "gpu_sm_clock_hertz", "host_softirqs_all_per_second",
        "disk_read_latency_seconds", "net_probe_rtt_seconds",
    )
    peer_z: float = 3.0
    peer_min_nodes: int = 3
    peer_every_s: float = 30.0
    peer_min_duration_s: float = 120.0

    def __post_init__(self) -> None:
        require(self.interval_s > 0, "interval_s must be > 0", "use e.g. 1.0 (one sample a second)")
        bad = [c for c in self.collectors if c not in _COLLECTORS]
        require(not bad, f"unknown collector(s) {', '.join(bad)}", f"use some of {', '.join(_COLLECTORS)}")
        require(0 <= self.prometheus_port <= 65535, "prometheus_port must be within 0..65535",
                "use 0 (off) or a free port, e.g. 9464")
        require(self.full_sample_every >= 1, "full_sample_every must be >= 1", "use e.g. 60")
        require(self.probe_timeout_s > 0 and self.probe_window >= 10, "probe_timeout_s must be > 0 and probe_window >= 10",
                "e.g. probe_timeout_s = 1.0, probe_window = 300")
        require(self.probe_interval_s == 0 or 0.01 <= self.probe_interval_s <= 60,
                "probe_interval_s must be 0 (one ping per tick) or within 0.01 … 60 s", "e.g. probe_interval_s = 0.2")
        require(self.baseline_z > 0 and self.peer_z > 0, "baseline_z and peer_z must be > 0", "use e.g. 3.0")
        require(self.baseline_window_s >= self.baseline_warmup_s > 0,
                "baseline_window_s must be >= baseline_warmup_s > 0", "e.g. 3600 and 300")
        require(0.5 <= self.baseline_fire_fraction <= 1, "baseline_fire_fraction must be within [0.5, 1]", "e.g. 0.8")
        require(self.peer_min_nodes >= 3, "peer_min_nodes must be >= 3",
                "with two nodes there is no majority to say which one departs")
        require(self.peer_every_s > 0 and self.ipmi_every_s > 0, "peer_every_s and ipmi_every_s must be > 0", "e.g. 30")
        for code, action in self.xid_actions.items():
            require(str(code).isdigit() and action in ("restart_in_place", "exclude_node", "log_only"),
                    f"xid_actions: {code!r} = {action!r} is not <Xid number> = restart_in_place|exclude_node|log_only",
                    'e.g. [agent.xid_actions] "79" = "exclude_node"')
