"""GPU collector over NVML (``nvidia-ml-py``); DCGM fields when DCGM is present.

Per GPU: temperature, power, SM/memory clocks and clock-event (throttle) reasons,
utilisation, memory, ECC corrected/uncorrected (volatile and aggregate), retired pages,
row remapping (pending, failure), PCIe replays, NVLink error counters, and Xid events
from an NVML event set. A field a GPU does not support is skipped (listed once in
``info.unsupported``); a missing driver makes the collector report
``unavailable: <reason>`` and retry ``nvmlInit`` every ``retry_s``.

Volatile ECC counters reset when the driver reloads, so the last reading and an offset
are persisted per GPU UUID (``EccLedger``) and the exported volatile counters stay
monotonic across reloads. Cost per tick with 8 GPUs: ~30 NVML calls of ~10-50 µs each.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from titan.events import atomic_write_json
from titan.monitor.base import Finding, Reading, metric_key, unavailable
from titan.monitor.xid import xid_info

__all__ = ["GpuCollector", "EccLedger", "THROTTLE_BITS", "pci_key"]

log = logging.getLogger(__name__)

#: nvmlClocksEventReason* bits worth a series of their own.
THROTTLE_BITS = {
    "sw_power_cap": 0x4, "hw_slowdown": 0x8, "sw_thermal": 0x20, "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
}
_NVLINK_COUNTERS = {"replay": 0, "recovery": 1, "crc_flit": 2, "crc_data": 3}


class EccLedger:
    """Keeps volatile ECC counters monotonic across driver reloads (persisted as JSON)."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = Path(path) if path else None
        self._state: dict[str, dict[str, list[float]]] = {}
        self._dirty = False
        if self.path is not None:
            try:
                self._state = json.loads(self.path.read_text())
            except (OSError, ValueError):
                self._state = {}

    def total(self, uuid: str, kind: str, volatile: float) -> float:
        """``offset + volatile``; a reading below the last one means a reset: carry it over."""
        entry = self._state.setdefault(uuid, {}).get(kind)
        last, offset = (float(entry[0]), float(entry[1])) if entry else (0.0, 0.0)
        if volatile < last:
            offset += last
        if entry is None or [volatile, offset] != [float(x) for x in entry]:
            self._state[uuid][kind] = [volatile, offset]
            self._dirty = True
        return offset + volatile

    def save(self) -> None:
        if self.path is None or not self._dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(self.path, self._state)
            self._dirty = False
        except OSError as e:
            log.warning("cannot persist ECC counters to %s: %s", self.path, e)


class GpuCollector:
    """NVML per-GPU metrics and Xid events; ``nvml`` is the ``pynvml`` module (or a stand-in)."""

    name = "gpu"

    def __init__(self, nvml: Any = None, *, state_file: str | os.PathLike[str] | None = None,
                 retry_s: float = 60.0, dcgm: bool = True, xid_actions: Mapping[str, str] | None = None) -> None:
        self._nvml = nvml
        self.xid_actions = dict(xid_actions or {})
        self.ledger = EccLedger(state_file)
        self.retry_s = retry_s
        self._want_dcgm = dcgm
        self._handles: list[Any] = []
        self._uuids: list[str] = []
        self._pci: dict[str, int] = {}
        self._events: Any = None
        self._status = "not initialised"
        self._next_try = 0.0
        self._unsupported: set[str] = set()
        self._links: dict[int, list[int]] = {}
        self._info: dict[str, Any] = {}

    # -- initialisation -------------------------------------------------------------
    def _init(self) -> None:
        if self._nvml is None:
            try:
                import pynvml  # nvidia-ml-py
            except ImportError:
                self._status = unavailable("nvidia-ml-py is not installed (pip install 'titan-resilience[gpu]')")
                self._next_try = float("inf")
                return
            self._nvml = pynvml
        nv = self._nvml
        try:
            nv.nvmlInit()
        except nv.NVMLError as e:
            self._status = unavailable(self._init_reason(e))
            self._next_try = time.monotonic() + self.retry_s
            return
        try:
            n = nv.nvmlDeviceGetCount()
            self._handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
            self._uuids = [_s(nv.nvmlDeviceGetUUID(h)) for h in self._handles]
            names = [_s(nv.nvmlDeviceGetName(h)) for h in self._handles]
            for i, h in enumerate(self._handles):
                try:
                    self._pci[pci_key(_s(nv.nvmlDeviceGetPciInfo(h).busId))] = i
                except (nv.NVMLError, ValueError):
                    pass
            self._info = {"driver": _s(nv.nvmlSystemGetDriverVersion()), "gpus": names, "uuids": self._uuids}
        except nv.NVMLError as e:
            self._status = unavailable(f"NVML initialised but enumerating GPUs failed: {e}")
            self._next_try = time.monotonic() + self.retry_s
            return
        self._status = "ok" if self._handles else unavailable("NVML found no GPU")
        self._events = self._register_xid_events()
        self._info["dcgm"] = self._dcgm_status()

    def _init_reason(self, e: Exception) -> str:
        nv = self._nvml
        kinds: list[tuple[str, str]] = [
            ("NVMLError_LibraryNotFound", "NVML library (libnvidia-ml.so.1) not found: no NVIDIA driver on this host"),
            ("NVMLError_DriverNotLoaded", "the NVIDIA kernel driver is not loaded"),
            ("NVMLError_NoPermission", "no permission to talk to the NVIDIA driver"),
        ]
        for cls_name, reason in kinds:
            cls = getattr(nv, cls_name, None)
            if cls is not None and isinstance(e, cls):
                return reason
        return f"nvmlInit failed: {e}"

    def _register_xid_events(self) -> Any:
        nv = self._nvml
        try:
            es = nv.nvmlEventSetCreate()
        except nv.NVMLError as e:
            self._info["xid_events"] = unavailable(f"nvmlEventSetCreate failed: {e}")
            return None
        ok = 0
        for i, h in enumerate(self._handles):
            try:
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, es)
                ok += 1
            except nv.NVMLError as e:
                self._info.setdefault("xid_events_errors", []).append(f"gpu {i}: {e}")
        self._info["xid_events"] = f"registered on {ok}/{len(self._handles)} GPUs"
        return es

    def _dcgm_status(self) -> str:
        if not self._want_dcgm:
            return "disabled"
        try:
            import pydcgm  # noqa: F401  (DCGM's Python bindings, shipped with datacenter-gpu-manager)
        except ImportError:
            return unavailable("DCGM Python bindings (pydcgm) not installed; NVML fields only")
        return "present (profiling fields not collected by this version)"

    def gpu_for_pci(self, pci: str) -> int | None:
        """The index of the GPU at a PCI address as the kernel log writes it (``0000:3b:00``)."""
        try:
            return self._pci.get(pci_key(pci))
        except ValueError:
            return None

    # -- per tick --------------------------------------------------------------------
    def collect(self, now: float) -> Reading:
        r = Reading(self.name)
        if not self._handles:
            if time.monotonic() >= self._next_try:
                self._init()
            if not self._handles:
                r.status = self._status
                r.info.update(self._info)
                return r
        for i, h in enumerate(self._handles):
            self._device(i, h, r)
        self._drain_xids(r)
        self.ledger.save()
        r.info.update(self._info)
        if self._unsupported:
            r.info["unsupported"] = sorted(self._unsupported)
        return r

    def _try(self, field: str, fn: Callable[[], Any]) -> Any:
        nv = self._nvml
        if field in self._unsupported:
            return None
        try:
            return fn()
        except nv.NVMLError as e:
            if isinstance(e, getattr(nv, "NVMLError_NotSupported", ())) or isinstance(
                    e, getattr(nv, "NVMLError_FunctionNotFound", ())):
                self._unsupported.add(field)
            else:
                self._info.setdefault("errors", {})[field] = str(e)
            return None

    def _device(self, i: int, h: Any, r: Reading) -> None:
        nv = self._nvml
        m = r.metrics
        g = str(i)

        def put(name: str, value: Any, **labels: Any) -> None:
            if value is not None:
                m[metric_key(name, gpu=g, **labels)] = float(value)

        lost = getattr(nv, "NVMLError_GpuIsLost", None)
        try:
            put("gpu_temperature_celsius", nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        except nv.NVMLError as e:
            if lost is not None and isinstance(e, lost):
                r.findings.append(Finding("gpu_lost", f"GPU {i} is lost (NVML: {e})", "critical",
                                          {"gpu": i, "uuid": self._uuids[i]}))
                return
            self._info.setdefault("errors", {})["temperature"] = str(e)
        p = self._try("power", lambda: nv.nvmlDeviceGetPowerUsage(h))
        put("gpu_power_watts", None if p is None else p / 1000.0)
        put("gpu_sm_clock_hertz", _mul(self._try("clock_sm", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)), 1e6))
        put("gpu_memory_clock_hertz", _mul(self._try("clock_mem", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)), 1e6))
        reasons = self._try("clock_event_reasons", lambda: _reasons(nv, h))
        if reasons is not None:
            for name, bit in THROTTLE_BITS.items():
                put("gpu_clock_throttled", 1.0 if reasons & bit else 0.0, reason=name)
        u = self._try("utilization", lambda: nv.nvmlDeviceGetUtilizationRates(h))
        if u is not None:
            put("gpu_utilization_ratio", u.gpu / 100.0)
            put("gpu_memory_utilization_ratio", u.memory / 100.0)
        mem = self._try("memory", lambda: nv.nvmlDeviceGetMemoryInfo(h))
        if mem is not None:
            put("gpu_memory_used_bytes", mem.used)
            put("gpu_memory_total_bytes", mem.total)
        for tname, etype in (("corrected", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                             ("uncorrected", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
            vol = self._try(f"ecc_volatile_{tname}", lambda e=etype: nv.nvmlDeviceGetTotalEccErrors(h, e, nv.NVML_VOLATILE_ECC))
            if vol is not None:
                put("gpu_ecc_errors_total", self.ledger.total(self._uuids[i], f"volatile_{tname}", float(vol)),
                    type=tname, counter="volatile")
            agg = self._try(f"ecc_aggregate_{tname}", lambda e=etype: nv.nvmlDeviceGetTotalEccErrors(h, e, nv.NVML_AGGREGATE_ECC))
            put("gpu_ecc_errors_total", agg, type=tname, counter="aggregate")
        for cname, cause in (("multiple_sbe", nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
                             ("dbe", nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)):
            pages = self._try(f"retired_pages_{cname}", lambda c=cause: nv.nvmlDeviceGetRetiredPages(h, c))
            put("gpu_retired_pages", None if pages is None else len(pages), cause=cname)
        pend = self._try("retired_pages_pending", lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(h))
        put("gpu_retired_pages_pending", None if pend is None else int(bool(pend)))
        rows = self._try("remapped_rows", lambda: nv.nvmlDeviceGetRemappedRows(h))
        if rows is not None:
            corr, unc, pending, failure = rows
            put("gpu_remapped_rows", corr, type="correctable")
            put("gpu_remapped_rows", unc, type="uncorrectable")
            put("gpu_row_remap_pending", int(bool(pending)))
            put("gpu_row_remap_failure", int(bool(failure)))
        put("gpu_pcie_replays_total", self._try("pcie_replay", lambda: nv.nvmlDeviceGetPcieReplayCounter(h)))
        self._nvlink(i, h, put)

    def _nvlink(self, i: int, h: Any, put: Callable[..., None]) -> None:
        nv = self._nvml
        links = self._links.get(i)
        if links is None:  # discover once which links exist (probing all 18-36 costs a call each)
            links = []
            for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    nv.nvmlDeviceGetNvLinkState(h, link)
                    links.append(link)
                except nv.NVMLError:
                    continue
            self._links[i] = links
            if not links:
                self._unsupported.add(f"nvlink:gpu{i}")
        if not links:
            return
        totals: dict[str, float] = {}
        active = 0
        for link in links:
            try:
                if nv.nvmlDeviceGetNvLinkState(h, link) != getattr(nv, "NVML_FEATURE_ENABLED", 1):
                    continue
            except nv.NVMLError:
                continue
            active += 1
            for name, counter in _NVLINK_COUNTERS.items():
                try:
                    totals[name] = totals.get(name, 0.0) + nv.nvmlDeviceGetNvLinkErrorCounter(h, link, counter)
                except nv.NVMLError:
                    pass  # a counter this GPU does not offer is absent, not zero
        put("gpu_nvlink_active_links", active)
        for name, v in totals.items():
            put("gpu_nvlink_errors_total", v, type=name)

    def _drain_xids(self, r: Reading) -> None:
        nv = self._nvml
        if self._events is None:
            return
        for _ in range(1000):
            try:
                ev = nv.nvmlEventSetWait(self._events, 0)
            except nv.NVMLError:  # NVMLError_Timeout: nothing pending
                return
            code = int(ev.eventData)
            gpu = next((i for i, h in enumerate(self._handles) if _same(h, ev.device)), None)
            info = xid_info(code, self.xid_actions)
            r.findings.append(Finding("xid", f"Xid {code} on GPU {gpu}: {info.description}", info.level,
                                      {"code": code, "gpu": gpu, "source": "nvml", "action": info.action,
                                       "bucket": info.bucket,
                                       "uuid": self._uuids[gpu] if gpu is not None else None}))

    def close(self) -> None:
        nv = self._nvml
        if nv is None or not self._handles:
            return
        try:
            if self._events is not None:
                nv.nvmlEventSetFree(self._events)
            nv.nvmlShutdown()
        except nv.NVMLError:
            pass
        self._handles = []


def pci_key(bus_id: str) -> str:
    """``domain:bus:device`` normalised: NVML's ``00000000:3B:00.0`` = kmsg's ``0000:3b:00``."""
    parts = bus_id.strip().lower().removeprefix("pci:").split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    dom, bus, devfn = parts
    return f"{int(dom, 16):04x}:{int(bus, 16):02x}:{int(devfn.split('.')[0], 16):02x}"


def _reasons(nv: Any, h: Any) -> int:
    fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
    return int(fn(h))


def _same(a: Any, b: Any) -> bool:
    if a is b or a == b:
        return True
    try:  # ctypes pointers: compare addresses
        import ctypes
        return ctypes.cast(a, ctypes.c_void_p).value == ctypes.cast(b, ctypes.c_void_p).value
    except Exception:  # noqa: BLE001 - a stand-in handle is not a pointer
        return False


def _mul(v: Any, k: float) -> float | None:
    return None if v is None else float(v) * k


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
