"""Kernel-log watcher (recorded /dev/kmsg records), Xid table, and ipmitool parsing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from monitor_helpers import FIXTURES
from titan.monitor.base import metric_key
from titan.monitor.ipmi import IpmiCollector, parse_sensor_output
from titan.monitor.kmsg import KmsgCollector, classify_line
from titan.monitor.xid import XID_TABLE, parse_xid_line, xid_info

pytestmark = pytest.mark.timeout(120)


def test_kmsg_records_are_classified():
    col = KmsgCollector(path=FIXTURES / "kmsg.txt", from_start=True)
    r = col.collect(0.0)
    col.close()
    assert r.ok and r.info["source"].endswith("kmsg.txt")
    got = [(f.category, f.level, f.data.get("code") or f.data.get("kind") or f.data.get("state") or f.data.get("pid"))
           for f in r.findings]
    assert got == [
        ("xid", "critical", 79), ("xid", "error", 13), ("xid", "warning", 63), ("mce", "error", None),
        ("edac", "warning", "CE"), ("edac", "critical", "UE"), ("pcie_aer", "warning", None),
        ("link", "warning", "down"), ("link", "info", "up"), ("oom", "error", 31337), ("xid", "warning", 999),
    ], got
    assert r.findings[0].data["action"] == "exclude_node" and r.findings[0].data["pci"] == "0000:3b:00"
    assert r.findings[-1].data["bucket"] == "UNKNOWN", "unknown Xid: logged, never silent"
    assert r.metrics[metric_key("kmsg_lines_total", category="xid")] == 4


def test_kmsg_starts_at_the_end_so_old_lines_are_not_reported(tmp_path: Path):
    log = tmp_path / "kmsg"
    log.write_text((FIXTURES / "kmsg.txt").read_text())
    col = KmsgCollector(path=log)
    assert col.collect(0.0).findings == []
    with log.open("a") as f:
        f.write("4,2000,6000000000,-;NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error\n")
    r = col.collect(1.0)
    col.close()
    assert [(f.category, f.data["code"], f.data["action"]) for f in r.findings] == [("xid", 48, "exclude_node")]


def test_xid_action_override_from_settings():
    f = classify_line("NVRM: Xid (PCI:0000:3b:00): 13, Graphics Exception", {"13": "exclude_node"})
    assert f is not None and f.data["action"] == "exclude_node" and f.level == "critical"


def test_xid_table_follows_nvidia_buckets():
    assert xid_info(79).action == "exclude_node"
    assert xid_info(31).action == "restart_in_place"
    assert xid_info(45).action == "log_only"
    assert xid_info(94).action == "restart_in_place" and xid_info(95).action == "exclude_node"
    assert {x.action for x in XID_TABLE.values()} == {"restart_in_place", "exclude_node", "log_only"}
    assert parse_xid_line("NVRM: Xid (0000:01:00): 3, C 00000005") == (3, "0000:01:00", "C 00000005")
    assert classify_line("systemd[1]: Started foo.") is None


def test_kmsg_unavailable_without_source(tmp_path: Path):
    col = KmsgCollector(path=tmp_path / "missing", use_journalctl=False)
    r = col.collect(0.0)
    assert r.status.startswith("unavailable: ") and "journalctl not found" in r.status, r.status


@pytest.mark.skipif(shutil.which("journalctl") is None, reason="journalctl not installed")
def test_kmsg_falls_back_to_journalctl(tmp_path: Path):
    col = KmsgCollector(path=tmp_path / "missing")
    try:
        r = col.collect(0.0)
        assert r.info.get("source") == "journalctl -k" or r.status.startswith("unavailable: journalctl exited"), r
    finally:
        col.close()
    assert col._proc is None


def test_ipmitool_sensor_output_is_parsed():
    m = parse_sensor_output((FIXTURES / "ipmitool_sensor.txt").read_text())
    assert m["ipmi_node_power_watts"] == 3000.0, "sum of the PSU input sensors"
    assert m[metric_key("ipmi_fan_rpm", sensor="FAN1")] == 5880.0
    assert m[metric_key("ipmi_temperature_celsius", sensor="CPU2_Temp")] == 57.0
    assert not any("Inlet" in k for k in m), "'na' readings are skipped"


def test_ipmi_collector_states():
    text = (FIXTURES / "ipmitool_sensor.txt").read_text()
    ok = IpmiCollector(runner=lambda: text, start_thread=False).collect(0.0)
    assert ok.ok and ok.metrics["ipmi_node_power_watts"] == 3000.0

    def broken() -> str:
        raise RuntimeError("Could not open device at /dev/ipmi0 or /dev/ipmi/0 or /dev/ipmidev/0")

    bad = IpmiCollector(runner=broken, start_thread=False).collect(0.0)
    assert bad.status.startswith("unavailable: ipmitool sensor failed: Could not open device"), bad.status
    if shutil.which("ipmitool") is None:
        absent = IpmiCollector(start_thread=False).collect(0.0)
        assert absent.status == "unavailable: ipmitool not installed (apt-get install ipmitool)"
