"""Prometheus endpoint for the agent (``prometheus_client``, optional extra ``titan-resilience[prometheus]``).

Every metric key becomes ``titan_<name>`` with the key's labels plus ``node``; names
ending in ``_total`` are counters, the rest gauges — base units throughout (``_seconds``,
``_bytes``, ``_celsius``, ``_watts``, ``_hertz``, ``_ratio``). The agent adds
``titan_agent_collector_up{collector}``, ``titan_agent_alerts_active{rule}`` and
``titan_agent_alerts_total{rule}``. Values are read from the agent's latest snapshot at
scrape time (no double bookkeeping). Bound to 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Iterator

from titan.errors import UserError
from titan.monitor.base import parse_key

if TYPE_CHECKING:  # pragma: no cover
    from titan.monitor.agent import Agent

__all__ = ["PrometheusExporter", "families"]

log = logging.getLogger(__name__)

PREFIX = "titan_"


def families(agent: "Agent") -> list[Any]:
    """The metric families of the agent's latest snapshot (for a custom registry collector)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    with agent.lock:
        latest = dict(agent.latest)
        status = dict(agent.status)
        active = list(agent.active_alerts)
        counts = dict(agent.alert_counts)
    grouped: dict[str, list[tuple[dict[str, str], float]]] = {}
    for key, value in latest.items():
        try:
            name, labels = parse_key(key)
        except ValueError:
            continue
        grouped.setdefault(name, []).append((labels, value))
    out: list[Any] = []
    for name, series in sorted(grouped.items()):
        label_names = sorted({k for labels, _ in series for k in labels} - {"node"})
        full = PREFIX + name
        if name.endswith("_total"):
            fam: Any = CounterMetricFamily(full, f"titan agent counter {name}", labels=["node", *label_names])
        else:
            fam = GaugeMetricFamily(full, f"titan agent gauge {name}", labels=["node", *label_names])
        for labels, value in series:
            fam.add_metric([agent.node, *(labels.get(k, "") for k in label_names)], value)
        out.append(fam)
    up = GaugeMetricFamily(PREFIX + "agent_collector_up", "1 when the collector works on this node, 0 when unavailable",
                           labels=["node", "collector"])
    for c, s in sorted(status.items()):
        up.add_metric([agent.node, c], 1.0 if s == "ok" else 0.0)
    out.append(up)
    act = GaugeMetricFamily(PREFIX + "agent_alerts_active", "alerts currently firing", labels=["node", "rule"])
    per_rule: dict[str, int] = {}
    for rule, _key in active:
        per_rule[rule] = per_rule.get(rule, 0) + 1
    for rule, n in sorted(per_rule.items()):
        act.add_metric([agent.node, rule], float(n))
    out.append(act)
    tot = CounterMetricFamily(PREFIX + "agent_alerts", "alerts fired since the agent started", labels=["node", "rule"])
    for rule, n in sorted(counts.items()):
        tot.add_metric([agent.node, rule], float(n))
    out.append(tot)
    return out


class _AgentCollector:
    def __init__(self, agent: "Agent") -> None:
        self.agent = agent

    def collect(self) -> Iterator[Any]:
        yield from families(self.agent)


class PrometheusExporter:
    """Serve ``/metrics`` for ``agent`` on ``addr:port`` (port 0 = pick a free one)."""

    def __init__(self, agent: "Agent", *, port: int, addr: str = "127.0.0.1") -> None:
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError:
            raise UserError("the Prometheus endpoint needs prometheus_client",
                            "pip install 'titan-resilience[prometheus]' (or drop --prometheus-port)") from None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_AgentCollector(agent))  # type: ignore[arg-type]
        try:
            self.server, self.thread = start_http_server(port, addr=addr, registry=self.registry)
        except OSError as e:
            raise UserError(f"cannot serve Prometheus metrics on {addr}:{port}: {e.strerror or e}",
                            "choose a free port with --prometheus-port") from None
        self.addr = addr
        self.port = self.server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self.addr}:{self.port}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)
