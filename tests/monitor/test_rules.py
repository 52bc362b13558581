"""Each default rule of the spec's table fires (once, after its duration) and clears."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor_helpers import FIXTURES, FakeNvml, agent_cfg
from titan.errors import UserError
from titan.monitor.base import ProcFS, metric_key
from titan.monitor.disk import DiskCollector
from titan.monitor.gpu import GpuCollector
from titan.monitor.ipmi import parse_sensor_output
from titan.monitor.net import NetCollector
from titan.monitor.rules import DEFAULT_RULES, RuleEngine, build_rules
from titan.settings import load_settings

pytestmark = pytest.mark.timeout(120)


def run(engine: RuleEngine, series: list[tuple[float, dict[str, float]]]):
    out = []
    for t, m in series:
        out += [(t, tr.rule.name, tr.transition, tr.key) for tr in engine.evaluate(t, m)]
    return out


def default_engine() -> RuleEngine:
    return RuleEngine(build_rules(None))


@pytest.mark.parametrize("rule,key,ok,bad,for_s", [
    ("gpu_temperature", metric_key("gpu_temperature_celsius", gpu="3"), 85.0, 91.0, 10.0),
    ("host_softirq_high", "host_cpu_softirq_ratio", 0.05, 0.35, 60.0),
    ("net_tcp_retransmit", "net_tcp_retransmit_ratio", 0.002, 0.04, 60.0),
    ("net_probe_loss", metric_key("net_probe_loss_ratio", peer="n2"), 0.0, 0.01, 0.0),
    ("gpu_row_remap_failure", metric_key("gpu_row_remap_failure", gpu="0"), 0.0, 1.0, 0.0),
    ("gpu_row_remap_pending", metric_key("gpu_row_remap_pending", gpu="0"), 0.0, 1.0, 0.0),
    ("disk_free_low", metric_key("disk_free_ratio", path="/ckpt"), 0.4, 0.01, 0.0),
])
def test_threshold_rule_fires_once_after_for_s_and_clears(rule, key, ok, bad, for_s):
    series = [(float(t), {key: ok}) for t in range(5)]
    series += [(float(t), {key: bad}) for t in range(5, 5 + int(for_s) + 20)]
    series += [(float(t), {key: ok}) for t in range(100, 103)]
    got = [g for g in run(default_engine(), series) if g[1] == rule]
    assert got == [(5.0 + for_s, rule, "fire", key), (100.0, rule, "clear", key)], got


def test_short_excursion_below_for_s_does_not_fire():
    key = metric_key("gpu_temperature_celsius", gpu="0")
    series = [(float(t), {key: 95.0 if 10 <= t < 15 else 80.0}) for t in range(40)]
    assert run(default_engine(), series) == []


def test_disk_read_latency_rule_from_recorded_diskstats(tmp_path: Path):
    col = DiskCollector(ProcFS(FIXTURES / "proc_a"), watch_path=tmp_path)
    eng = default_engine()
    col.collect(0.0)
    col.proc = ProcFS(FIXTURES / "proc_b")
    m = col.collect(1.0).metrics  # 150 ms reads
    got = run(eng, [(1.0 + t, m) for t in range(12)])
    assert got == [(11.0, "disk_read_latency", "fire", metric_key("disk_read_latency_seconds", device="vda"))], got


def test_net_packet_loss_rule_from_recorded_net_dev():
    col = NetCollector(ProcFS(FIXTURES / "proc_a"))
    col.collect(0.0)
    col.proc = ProcFS(FIXTURES / "proc_b")
    m = col.collect(1.0).metrics
    got = [g for g in run(default_engine(), [(1.0 + t, m) for t in range(35)]) if g[1] == "net_packet_loss"]
    assert got == [(31.0, "net_packet_loss", "fire", metric_key("net_packet_loss_ratio", interface="eth0"))], got


def test_ecc_per_day_counts_new_errors_within_24h_from_nvml(tmp_path: Path):
    nv = FakeNvml(1)
    col = GpuCollector(nv, state_file=tmp_path / "ecc.json")
    eng = default_engine()
    fired = []
    t = 0.0
    for corrected in [0, 3, 6, 10, 10, 11, 11]:  # 11 new corrected errors: > 10 within a day
        nv.gpus[0].ecc[("c", 0)] = corrected
        fired += [(tr.rule.name, tr.transition) for tr in eng.evaluate(t, col.collect(t).metrics)]
        t += 3600.0
    assert fired == [("gpu_ecc_per_day", "fire")], fired
    # A day later without new errors the window holds none: the alert clears.
    fired = [(tr.rule.name, tr.transition) for tr in eng.evaluate(t + 86400.0, col.collect(t).metrics)]
    assert fired == [("gpu_ecc_per_day", "clear")], fired


def test_ten_ecc_errors_a_day_do_not_fire_but_one_uncorrected_does():
    eng = default_engine()
    c = metric_key("gpu_ecc_errors_total", gpu="0", type="corrected", counter="volatile")
    u = metric_key("gpu_ecc_errors_total", gpu="0", type="uncorrected", counter="volatile")
    assert run(eng, [(float(h) * 3600, {c: float(h), u: 0.0}) for h in range(11)]) == []
    got = run(eng, [(40000.0, {c: 10.0, u: 1.0})])
    assert got == [(40000.0, "gpu_ecc_uncorrected", "fire", u)], got
    assert next(r for r in eng.rules if r.name == "gpu_ecc_uncorrected").action == "exclude_node"


def test_ipmi_power_swing_uses_node_input_power_only():
    base = parse_sensor_output((FIXTURES / "ipmitool_sensor.txt").read_text())["ipmi_node_power_watts"]
    eng = default_engine()
    steady = [(float(t), {"ipmi_node_power_watts": base + (t % 3) * 10, metric_key("gpu_power_watts", gpu="0"):
                          700.0 if t % 20 < 10 else 250.0}) for t in range(0, 600, 5)]
    assert run(eng, steady) == [], "±1 % node power and a 3x GPU board power swing must not alarm"
    surge = [(float(t), {"ipmi_node_power_watts": base * 1.08}) for t in range(600, 700, 5)]
    got = run(eng, surge)
    assert got == [(630.0, "ipmi_power_swing", "fire", "ipmi_node_power_watts")], got


def test_rules_are_overridden_from_one_settings_file(tmp_path: Path):
    cfg_file = tmp_path / "titan.toml"
    cfg_file.write_text(
        "[agent.rules.gpu_temperature]\nlimit = 80.0\nfor_s = 0.0\n"
        "[agent.rules.disk_read_latency]\nenabled = false\n"
        "[agent.rules.gpu_hot_memory]\nmetric = \"gpu_memory_used_bytes\"\nlimit = 1e9\nlevel = \"info\"\n"
        "[agent.xid_actions]\n\"13\" = \"exclude_node\"\n")
    cfg = load_settings(config_file=cfg_file, env={}).agent
    rules = {r.name: r for r in build_rules(cfg.rules)}
    assert rules["gpu_temperature"].limit == 80.0 and "disk_read_latency" not in rules
    assert rules["gpu_hot_memory"].metric == "gpu_memory_used_bytes"
    assert cfg.xid_actions == {"13": "exclude_node"}
    assert len(rules) == len(DEFAULT_RULES) + 1 - 1


def test_bad_rule_override_is_a_one_line_user_error():
    with pytest.raises(UserError, match="agent.rules.gpu_temperature: unknown field"):
        build_rules({"gpu_temperature": {"limt": 3}})
    with pytest.raises(UserError, match="unknown kind"):
        build_rules({"x": {"metric": "a", "limit": 1, "kind": "sideways"}})
    with pytest.raises(UserError, match="xid_actions"):
        agent_cfg(xid_actions='{"79": "reboot"}')
