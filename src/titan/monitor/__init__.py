"""``titan.monitor``: the node agent — collectors, alert rules, baselines, peers, exporters.

One module per collector (``gpu``, ``host``, ``disk``, ``net`` + ``probe``, ``kmsg``,
``ipmi``), each reporting ``unavailable: <reason>`` instead of failing; ``rules`` (the
spec's alert table), ``xid`` (NVIDIA Xid → action), ``baseline`` (rolling robust
statistics), ``peer`` (comparison across nodes), ``samples`` (compact metric files),
``agent`` (the loop) and ``prom`` (Prometheus endpoint, optional). Never imports torch.
"""

from __future__ import annotations

from titan.monitor.agent import DEFAULT_FLOORS, Agent, TickResult, build_collectors
from titan.monitor.base import Finding, ProcFS, Reading, metric_key, parse_key, unavailable
from titan.monitor.baseline import BaselineBank, RobustBaseline, SustainedDetector
from titan.monitor.peer import PeerComparator, PeerExchange, peer_scores
from titan.monitor.rules import DEFAULT_RULES, Rule, RuleEngine, build_rules
from titan.monitor.samples import SampleWriter, read_samples
from titan.monitor.xid import XID_TABLE, parse_xid_line, xid_info

__all__ = [
    "Agent", "BaselineBank", "DEFAULT_FLOORS", "DEFAULT_RULES", "Finding", "PeerComparator", "PeerExchange",
    "ProcFS", "Reading", "RobustBaseline", "Rule", "RuleEngine", "SampleWriter", "SustainedDetector",
    "TickResult", "XID_TABLE", "build_collectors", "build_rules", "metric_key", "parse_key", "parse_xid_line",
    "peer_scores", "read_samples", "unavailable", "xid_info",
]
