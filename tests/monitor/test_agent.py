"""The agent end to end: events and samples in the run dir, probes and peers between
agents of one job, the CLI, and the no-torch rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from monitor_helpers import FIXTURES, FakeNvml, agent_cfg
from titan.cli.environment import Environment
from titan.cli.main import run as cli_run
from titan.events import RunDir, read_run
from titan.exitcodes import ExitCode
from titan.monitor.agent import Agent
from titan.monitor.base import ProcFS, metric_key
from titan.monitor.disk import DiskCollector
from titan.monitor.gpu import GpuCollector
from titan.monitor.kmsg import KmsgCollector
from titan.monitor.net import NetCollector
from titan.monitor.probe import EchoProbe
from titan.monitor.samples import read_samples

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
PY = str(ROOT / ".venv/bin/python") if (ROOT / ".venv/bin/python").exists() else sys.executable


def test_alerts_findings_and_samples_land_in_the_run_dir(tmp_path: Path):
    rd = RunDir.create(tmp_path, "run1")
    nv = FakeNvml(2)
    nv.gpus[1].temp = 95
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    gpu = GpuCollector(nv, state_file=tmp_path / "ecc.json")
    disk = DiskCollector(ProcFS(FIXTURES / "proc_a"), watch_path=rd.checkpoints)
    cfg = agent_cfg(interval_s=1.0, rules='{"gpu_temperature": {"for_s": 2.0}}', full_sample_every=3)
    agent = Agent(cfg, node="n1", run_dir=rd, collectors=[gpu, disk, KmsgCollector(path=kmsg)])
    agent.start()
    for t in range(6):
        if t == 1:
            disk.proc = ProcFS(FIXTURES / "proc_b")
        if t == 3:
            nv.pending_xids.append((1, 79))
            with kmsg.open("a") as f:
                f.write("Out of memory: Killed process 77 (python) total-vm:1kB\n")
                f.write("NVRM: Xid (PCI:0000:3c:00): 31, pid=9, name=python, MMU Fault\n")
        agent.tick(1000.0 + t)
    agent.close()
    res = read_run(rd.path)
    kinds = [(e.kind, e.data.get("rule") or e.data.get("category")) for e in res.events if e.node == "n1"]
    assert ("agent.start", None) in kinds
    assert ("agent.alert", "gpu_temperature") in kinds
    assert ("agent.xid", "xid") in kinds and ("agent.kernel", "oom") in kinds
    alert = next(e for e in res.events if e.kind == "agent.alert")
    assert alert.data["metric"] == metric_key("gpu_temperature_celsius", gpu="1") and alert.level == "error"
    assert (alert.data["since"], alert.data["duration_s"]) == (1000.0, 2.0), "fired at the tick that met for_s"
    xid = next(e for e in res.events if e.kind == "agent.xid" and e.data["source"] == "nvml")
    assert xid.level == "critical" and xid.data["code"] == 79 and xid.data["gpu"] == 1
    kx = next(e for e in res.events if e.kind == "agent.xid" and e.data["source"] == "kmsg")
    assert (kx.data["code"], kx.data["action"], kx.data["gpu"]) == (31, "restart_in_place", 1), \
        "a kernel-log Xid is tied to the GPU at its PCI address (NVML bus id 00000000:3C:00.0)"
    samples = list(read_samples(rd.metrics / "agent.n1.jsonl"))
    assert [t for t, _ in samples] == [1000.0 + t for t in range(6)]
    last = samples[-1][1]
    assert last[metric_key("gpu_temperature_celsius", gpu="1")] == 95
    lat = metric_key("disk_read_latency_seconds", device="vda")
    assert samples[1][1][lat] == pytest.approx(0.15) and lat not in samples[2][1], "a vanished series is dropped"
    lines = (rd.metrics / "agent.n1.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["full"] and json.loads(lines[3])["full"]
    assert len(lines[1]) < len(lines[0]) / 2, "delta lines carry only changed values"


def test_three_agents_probe_each_other_over_loopback(tmp_path: Path):
    rd = RunDir.create(tmp_path, "run2")
    probes = [EchoProbe(rd.metrics, f"n{i}", host="127.0.0.1", refresh_s=0.0, min_probes=5, timeout_s=5.0) for i in range(3)]
    cols = [NetCollector(probe=p) for p in probes]
    try:
        for t in range(8):
            res = [c.collect(float(t)) for c in cols]
            time.sleep(0.05)
        m = res[0].metrics
        rtt = m[metric_key("net_probe_rtt_seconds", peer="n1")]
        assert 0 < rtt < 0.5, f"loopback RTT: {rtt}"
        assert m[metric_key("net_probe_loss_ratio", peer="n2")] == 0.0
        assert res[0].info["probe"]["peers"] == ["n1", "n2"]
        # One peer dies without withdrawing its announcement (SIGKILL): pings go unanswered.
        probes[2]._closed = True
        probes[2].sock.close()
        probes[0].timeout_s = 0.3
        dead = time.time()
        for t in range(8, 14):
            res = [c.collect(float(t)) for c in cols[:2]]
            time.sleep(0.25)
        lost = res[0].metrics[metric_key("net_probe_lost_total", peer="n2")]
        assert lost >= 3, f"pings to a dead peer: expected >= 3 lost, seen {lost}"
        # When the newest lost ping was sent (a drill tells a late alert's fault by it): after
        # the peer died, at least one timeout before it was counted; none lost to a live peer.
        sent = res[0].metrics[metric_key("net_probe_last_lost_sent_seconds", peer="n2")]
        assert dead <= sent <= time.time() - 0.3, (dead, sent, time.time())
        assert metric_key("net_probe_last_lost_sent_seconds", peer="n1") not in res[0].metrics
    finally:
        for c in cols:
            c.close()


def test_drifting_node_is_named_by_its_own_agent_through_the_run_dir(tmp_path: Path):
    rd = RunDir.create(tmp_path, "run3")
    cfg = agent_cfg(peer_every_s=1e-6, peer_min_duration_s=5.0, peer_metrics="gpu_temperature_celsius")
    nvs = [FakeNvml(1) for _ in range(4)]
    agents = [Agent(cfg, node=f"n{i}", run_dir=rd, collectors=[GpuCollector(nv)]) for i, nv in enumerate(nvs)]
    alerts = []
    for t in range(12):
        for i, (a, nv) in enumerate(zip(agents, nvs)):
            nv.gpus[0].temp = 62 + (i % 2) + (2 * t if i == 2 else 0)  # n2 warms up by 2 °C per tick
            alerts += [(a.node, x["rule"], x["transition"]) for x in a.tick(1000.0 + t).alerts]
    for a in agents:
        a.close()
    assert alerts == [("n2", "peer:gpu_temperature_celsius", "fire")], alerts


def test_agent_never_imports_torch(tmp_path: Path):
    # Import everything, then run the CLI path (`titan agent --once`) in the same process.
    code = ("import sys, io, importlib, titan.monitor, titan.monitor.prom, titan.monitor.spawn; "
            "from titan.cli.environment import Environment; "
            "cli = importlib.import_module('titan.cli.main'); "
            "env = Environment(stdout=io.StringIO(), stderr=io.StringIO()); "
            "rc = cli.run(['agent', '--once', '--json', '--interval-s', '0.1'], env); assert rc == 0, rc; "
            "print(sorted(k for k in sys.modules if k == 'torch' or k.startswith('torch.')))")
    p = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "XDG_STATE_HOME": str(tmp_path)})
    assert p.returncode == 0, p.stderr
    out = p.stdout.strip()
    assert out == "[]", f"torch modules imported by the agent path: {out}"


def test_cli_once_json_prints_every_collector_with_its_status(tmp_path: Path):
    env = Environment.captured(tmp_path, env={"XDG_STATE_HOME": str(tmp_path / "state")})
    code = cli_run(["agent", "--once", "--json", "--interval-s", "0.2"], env)
    assert code == ExitCode.SUCCEEDED, env.stderr.getvalue()
    out = json.loads(env.stdout.getvalue())
    assert set(out["collectors"]) == {"gpu", "host", "disk", "net", "kmsg", "ipmi"}
    assert out["collectors"]["gpu"]["status"].startswith("unavailable: NVML library")
    assert out["collectors"]["host"]["status"] == "ok"
    assert "host_cpu_utilization_ratio" in out["collectors"]["host"]["metrics"]


def test_cli_user_mistakes_are_one_line_errors(tmp_path: Path):
    env = Environment.captured(tmp_path)
    assert cli_run(["agent", "--once", "--run-dir", str(tmp_path / "nope")], env) == ExitCode.USER_ERROR
    assert env.stderr.getvalue().startswith("titan: error: run directory") and "hint:" in env.stderr.getvalue()
    env = Environment.captured(tmp_path)
    assert cli_run(["agent", "--once", "--set", "agent.collectors=gpu,sonar"], env) == ExitCode.USER_ERROR
    assert "unknown collector(s) sonar" in env.stderr.getvalue()


@pytest.mark.timeout(90)
def test_cli_subprocess_runs_for_a_duration_and_writes_the_run_dir(tmp_path: Path):
    rd = RunDir.create(tmp_path, "run4")
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "TITAN_RUN_DIR": str(rd.path),
           "TITAN_NODE_ID": "nodeA"}
    p = subprocess.run([str(Path(PY).parent / "titan"), "agent", "--interval-s", "0.2", "--duration-s", "1.5",
                        "--json", "--set", "agent.collectors=host,disk,net"],
                       capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert summary["node"] == "nodeA" and summary["ticks"] >= 3, summary
    evs = read_run(rd.path).events
    assert [e.kind for e in evs if e.node == "nodeA"][0] == "agent.start"
    assert evs[-1].kind == "agent.stop"
    assert len(list(read_samples(rd.metrics / "agent.nodeA.jsonl"))) == summary["ticks"]
    assert not (rd.metrics / "probe.nodeA.json").exists(), "the probe withdraws its announcement on exit"
