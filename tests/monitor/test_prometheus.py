"""Prometheus export: names and values through prometheus_client, a REAL Prometheus server
scraping the agent on loopback, and the Grafana dashboard's queries against the exporter."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from monitor_helpers import FIXTURES, FakeNvml, agent_cfg
from titan.monitor.agent import Agent
from titan.monitor.base import ProcFS
from titan.monitor.disk import DiskCollector
from titan.monitor.gpu import GpuCollector
from titan.monitor.host import HostCollector
from titan.monitor.ipmi import IpmiCollector
from titan.monitor.kmsg import KmsgCollector
from titan.monitor.net import NetCollector
from titan.monitor.probe import EchoProbe
from titan.monitor.prom import PrometheusExporter

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


def full_agent(tmp_path: Path) -> Agent:
    """An agent with every collector, fed by recorded files (and the NVML stand-in)."""
    nv = FakeNvml(2)
    nv.gpus[1].temp = 93
    ipmi_text = (FIXTURES / "ipmitool_sensor.txt").read_text()
    cols = [GpuCollector(nv, state_file=tmp_path / "ecc.json"), HostCollector(ProcFS(FIXTURES / "proc_a")),
            DiskCollector(ProcFS(FIXTURES / "proc_a"), watch_path=tmp_path),
            NetCollector(ProcFS(FIXTURES / "proc_a"), min_packets=1, probe=EchoProbe(
                tmp_path, "node7", host="127.0.0.1", refresh_s=0.0, min_probes=1)),
            KmsgCollector(path=FIXTURES / "kmsg.txt", from_start=True),
            IpmiCollector(runner=lambda: ipmi_text, start_thread=False)]
    peer = EchoProbe(tmp_path, "node8", host="127.0.0.1")  # answers node7's pings
    agent = Agent(agent_cfg(rules='{"gpu_temperature": {"for_s": 0.0}}'), node="node7", collectors=cols)
    try:
        agent.tick(100.0)
        for c in cols[1:4]:
            c.proc = ProcFS(FIXTURES / "proc_b")
        probe = cols[3].probe
        deadline = time.monotonic() + 10
        while not probe._rtts and time.monotonic() < deadline:  # wait for node8's pong
            time.sleep(0.05)
        agent.tick(101.0)
    finally:
        peer.close()
    return agent


def scrape(url: str) -> dict[str, object]:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_exporter_uses_prometheus_naming_and_labels(tmp_path: Path):
    agent = full_agent(tmp_path)
    exp = PrometheusExporter(agent, port=0)
    try:
        assert exp.addr == "127.0.0.1"
        fams = scrape(exp.url)
    finally:
        exp.close()
        agent.close()
    temp = fams["titan_gpu_temperature_celsius"]
    assert temp.type == "gauge"
    assert {(s.labels["node"], s.labels["gpu"], s.value) for s in temp.samples} == {("node7", "0", 60.0), ("node7", "1", 93.0)}
    ecc = fams["titan_gpu_ecc_errors"]  # the parser strips _total from counter family names
    assert ecc.type == "counter" and all(s.name == "titan_gpu_ecc_errors_total" for s in ecc.samples)
    assert fams["titan_disk_read_latency_seconds"].samples[0].value == pytest.approx(0.15)
    up = {s.labels["collector"]: s.value for s in fams["titan_agent_collector_up"].samples}
    assert up == {"gpu": 1.0, "host": 1.0, "disk": 1.0, "net": 1.0, "kmsg": 1.0, "ipmi": 1.0}
    alerts = {s.labels["rule"] for s in fams["titan_agent_alerts"].samples}
    assert "kernel_xid" in alerts
    for name in fams:
        assert re.fullmatch(r"titan_[a-z0-9_]+", name), name
        assert not name.endswith(("_ms", "_mb", "_kb", "_percent")), f"{name}: use base units"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _query(base: str, q: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": q})
    obj = json.loads(urllib.request.urlopen(url, timeout=5).read())
    assert obj["status"] == "success", obj
    return obj["data"]["result"]


@pytest.mark.timeout(120)
@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="prometheus binary absent (Debian package `prometheus`, installed by .ci/run)")
def test_real_prometheus_scrapes_the_agent(tmp_path: Path):
    agent = full_agent(tmp_path)
    exp = PrometheusExporter(agent, port=0)
    port = _free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        "global:\n  scrape_interval: 1s\n"
        "scrape_configs:\n  - job_name: titan-agent\n    scrape_interval: 1s\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{exp.port}']\n")
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        result: list[dict] = []
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            try:
                result = _query(base, "titan_gpu_temperature_celsius")
            except OSError:
                result = []
            if len(result) == 2:
                break
            time.sleep(0.5)
        got = {(r["metric"]["node"], r["metric"]["gpu"], float(r["value"][1])) for r in result}
        assert got == {("node7", "0", 60.0), ("node7", "1", 93.0)}, f"Prometheus returned {result}"
        up = _query(base, 'up{job="titan-agent"}')
        assert float(up[0]["value"][1]) == 1.0
        ecc = _query(base, 'titan_gpu_ecc_errors_total{counter="aggregate",type="corrected",gpu="0"}')
        assert float(ecc[0]["value"][1]) == 5.0, ecc
        lat = _query(base, 'titan_disk_read_latency_seconds{device="vda"}')
        assert float(lat[0]["value"][1]) == pytest.approx(0.15), lat
        names = {r["metric"]["__name__"] for r in _query(base, '{__name__=~"titan_.+"}')}
        assert {"titan_host_softirqs_per_second", "titan_ipmi_node_power_watts", "titan_agent_collector_up",
                "titan_kmsg_lines_total", "titan_net_packet_loss_ratio"} <= names, sorted(names)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
        exp.close()
        agent.close()


def test_grafana_dashboard_queries_only_exported_metrics(tmp_path: Path):
    dash = json.loads((ROOT / "deploy/grafana/titan-dashboard.json").read_text())
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    agent = full_agent(tmp_path)
    exp = PrometheusExporter(agent, port=0)
    try:
        text = urllib.request.urlopen(exp.url, timeout=10).read().decode()
    finally:
        exp.close()
        agent.close()
    exported = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    queried = set()
    for p in dash["panels"]:
        assert {"type", "title", "gridPos", "targets"} <= set(p), p.get("title")
        for t in p["targets"]:
            queried |= set(re.findall(r"\btitan_[a-z0-9_]+", t["expr"]))
    for v in dash["templating"]["list"]:
        queried |= set(re.findall(r"\btitan_[a-z0-9_]+", json.dumps(v.get("query", ""))))
    missing = queried - exported
    assert not missing, f"dashboard queries metrics the agent does not export: {sorted(missing)}"
    assert len(queried) >= 15


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool absent (Debian package prometheus)")
def test_prometheus_scrape_config_example_is_valid():
    p = subprocess.run(["promtool", "check", "config", str(ROOT / "deploy/prometheus/prometheus.yml")],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stdout + p.stderr
