"""GPU collector: real pynvml degrades clearly here; the NVML stand-in drives every field."""

from __future__ import annotations

import pytest

import json
from pathlib import Path

import pynvml

from monitor_helpers import FakeNvml
from titan.monitor.base import metric_key
from titan.monitor.gpu import GpuCollector, pci_key

pytestmark = pytest.mark.timeout(120)


def test_real_nvml_without_driver_reports_library_not_found(tmp_path: Path):
    # This machine has nvidia-ml-py but no driver: nvmlInit raises NVMLError_LibraryNotFound.
    col = GpuCollector(state_file=tmp_path / "ecc.json")
    r = col.collect(0.0)
    assert r.status == "unavailable: NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver on this host", r.status
    assert r.metrics == {}
    col.close()


def test_driver_not_loaded_is_named():
    col = GpuCollector(FakeNvml(init_error=pynvml.NVMLError_DriverNotLoaded))
    assert col.collect(0.0).status == "unavailable: the NVIDIA kernel driver is not loaded"


def test_every_field_is_read_per_gpu(tmp_path: Path):
    nv = FakeNvml(2)
    nv.gpus[1].temp = 93
    nv.gpus[1].reasons = 0x40  # HW thermal slowdown
    nv.gpus[0].remap = (2, 1, 1, 0)
    r = GpuCollector(nv, state_file=tmp_path / "ecc.json").collect(0.0)
    assert r.ok, r.status
    m = r.metrics
    assert m[metric_key("gpu_temperature_celsius", gpu="1")] == 93
    assert m[metric_key("gpu_power_watts", gpu="0")] == 350.0
    assert m[metric_key("gpu_sm_clock_hertz", gpu="0")] == 1980e6
    assert m[metric_key("gpu_clock_throttled", gpu="1", reason="hw_thermal")] == 1.0
    assert m[metric_key("gpu_clock_throttled", gpu="0", reason="hw_thermal")] == 0.0
    assert m[metric_key("gpu_utilization_ratio", gpu="0")] == 0.97
    assert m[metric_key("gpu_memory_used_bytes", gpu="0")] == 70 * 2**30
    assert m[metric_key("gpu_ecc_errors_total", gpu="0", type="corrected", counter="aggregate")] == 5
    assert m[metric_key("gpu_remapped_rows", gpu="0", type="uncorrectable")] == 1
    assert m[metric_key("gpu_row_remap_pending", gpu="0")] == 1
    assert m[metric_key("gpu_pcie_replays_total", gpu="0")] == 3
    assert m[metric_key("gpu_nvlink_active_links", gpu="0")] == 4
    assert m[metric_key("gpu_nvlink_errors_total", gpu="0", type="replay")] == 4
    assert "retired_pages_multiple_sbe" in r.info["unsupported"], "NotSupported fields are listed, not fatal"
    assert r.info["driver"] == "550.54.15"
    assert r.info["dcgm"].startswith("unavailable: DCGM Python bindings")


def test_volatile_ecc_stays_monotonic_across_a_driver_reload(tmp_path: Path):
    state = tmp_path / "ecc.json"
    nv = FakeNvml(1)
    key = metric_key("gpu_ecc_errors_total", gpu="0", type="corrected", counter="volatile")
    nv.gpus[0].ecc[("c", 0)] = 7
    assert GpuCollector(nv, state_file=state).collect(0.0).metrics[key] == 7
    # The driver reloads (volatile counters reset to 0) and the agent restarts.
    nv2 = FakeNvml(1)
    nv2.gpus[0].ecc[("c", 0)] = 2
    seen = GpuCollector(nv2, state_file=state).collect(1.0).metrics[key]
    assert seen == 9, f"7 before the reload + 2 after: expected 9, seen {seen}"
    assert json.loads(state.read_text())["GPU-00000000-fake"]["volatile_corrected"] == [2.0, 7.0]


def test_xid_events_from_the_nvml_event_set_become_findings():
    nv = FakeNvml(2)
    col = GpuCollector(nv)
    col.collect(0.0)
    nv.pending_xids += [(1, 79), (0, 13)]
    r = col.collect(1.0)
    got = [(f.category, f.data["code"], f.data["gpu"], f.level) for f in r.findings]
    assert got == [("xid", 79, 1, "critical"), ("xid", 13, 0, "error")], got
    assert [f.data["action"] for f in r.findings] == ["exclude_node", "restart_in_place"]


def test_lost_gpu_is_a_critical_finding_not_a_crash():
    nv = FakeNvml(2)
    col = GpuCollector(nv)
    col.collect(0.0)
    nv.gpus[1].lost = True
    r = col.collect(1.0)
    assert r.ok
    assert [f.category for f in r.findings] == ["gpu_lost"]
    assert metric_key("gpu_temperature_celsius", gpu="0") in r.metrics


def test_init_is_retried_after_retry_s():
    nv = FakeNvml(1, init_error=pynvml.NVMLError_Uninitialized)
    col = GpuCollector(nv, retry_s=0.0)
    assert col.collect(0.0).status.startswith("unavailable: nvmlInit failed")
    nv.init_error = None
    assert col.collect(1.0).ok


def test_pci_addresses_of_nvml_and_the_kernel_log_agree():
    assert pci_key("00000000:3B:00.0") == pci_key("0000:3b:00") == pci_key("PCI:0000:3b:00") == "0000:3b:00"
    assert pci_key("3b:00.0") == "0000:3b:00"
