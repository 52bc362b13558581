"""Host, disk and net collectors replay recorded /proc files (fixtures/proc_a → proc_b)."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor_helpers import FIXTURES
from titan.monitor.base import ProcFS, metric_key, parse_key
from titan.monitor.disk import DiskCollector
from titan.monitor.host import HostCollector
from titan.monitor.net import NetCollector

pytestmark = pytest.mark.timeout(120)

A, B = ProcFS(FIXTURES / "proc_a"), ProcFS(FIXTURES / "proc_b")


def two_ticks(col, dt: float = 1.0):
    col.proc = A
    first = col.collect(100.0)
    col.proc = B
    return first, col.collect(100.0 + dt)


def _softirq_sum(root: ProcFS, name: str) -> int:
    for line in root.read("/proc/softirqs").splitlines():
        if line.split(":")[0].strip() == name:
            return sum(int(x) for x in line.split(":")[1].split())
    raise AssertionError(name)


def test_host_collector_rates_match_the_recorded_counters():
    first, r = two_ticks(HostCollector(self_process=False), dt=2.0)
    assert r.ok and first.ok
    expected = (_softirq_sum(B, "NET_RX") - _softirq_sum(A, "NET_RX")) / 2.0
    seen = r.metrics[metric_key("host_softirqs_per_second", type="NET_RX")]
    assert seen == pytest.approx(expected), f"NET_RX rate: expected {expected}, seen {seen}"
    for f in ("host_cpu_utilization_ratio", "host_cpu_softirq_ratio", "host_cpu_iowait_ratio"):
        assert 0.0 <= r.metrics[f] <= 1.0, (f, r.metrics[f])
    assert r.metrics["host_machine_check_exceptions_total"] == 1.0, "MCE row 0 → 1 in proc_b"
    assert r.metrics["host_memory_total_bytes"] > r.metrics["host_memory_available_bytes"] > 0
    assert metric_key("host_pressure_ratio", resource="cpu", kind="some") in r.metrics
    assert r.info["pressure_missing"] == ["irq"], "this kernel has no /proc/pressure/irq"
    assert metric_key("host_numa_local_ratio", numa_node="0") in r.metrics
    assert "host_cpu_utilization_ratio" not in first.metrics, "no rate on the first tick"


def test_disk_collector_reports_read_latency_of_the_injected_slow_reads(tmp_path: Path):
    _, r = two_ticks(DiskCollector(watch_path=tmp_path / "ckpt"))
    lat = r.metrics[metric_key("disk_read_latency_seconds", device="vda")]
    assert lat == pytest.approx(0.150), f"10 reads taking 1500 ms: expected 0.150 s, seen {lat}"
    assert r.metrics[metric_key("disk_reads_per_second", device="vda")] == pytest.approx(10.0)
    assert r.info["devices"] == ["vda"], "loop/zram devices and partitions are skipped"
    free = r.metrics[metric_key("disk_free_ratio", path=str(tmp_path / "ckpt"))]
    assert 0 < free <= 1, "free space of a not-yet-created folder comes from its parent"


def test_net_collector_loss_ratio_and_tcp_counters():
    col = NetCollector(window_s=60, min_packets=1000)
    _, r = two_ticks(col)
    loss = r.metrics[metric_key("net_packet_loss_ratio", interface="eth0")]
    assert 0.001 < loss < 0.003, f"10 drops in ~5000 packets: expected ~0.2 %, seen {loss:.4%}"
    assert metric_key("net_packet_loss_ratio", interface="ifb0") not in r.metrics, "idle link: too few packets"
    assert r.metrics["net_tcp_retransmitted_segments_total"] >= 0
    assert all(parse_key(k)[1].get("interface") != "lo" for k in r.metrics)


@pytest.mark.parametrize("cls", [HostCollector, DiskCollector, NetCollector])
def test_collectors_report_unavailable_instead_of_failing(cls, tmp_path: Path):
    col = cls(ProcFS(tmp_path))  # an empty root: no /proc at all
    r = col.collect(1.0)
    assert r.status.startswith("unavailable: "), r.status
    assert r.metrics == {} or cls is DiskCollector


def test_host_collector_on_the_live_machine_reads_its_own_rss():
    col = HostCollector()
    col.collect(0.0)
    r = col.collect(1.0)
    assert r.ok
    assert 1e6 < r.metrics["agent_resident_memory_bytes"] < 2e9
