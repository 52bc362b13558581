"""Shared helpers of the monitor tests: fixture paths, a stand-in NVML, settings."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pynvml

from titan.settings import load_settings

FIXTURES = Path(__file__).parent / "fixtures"


def agent_cfg(**overrides: Any):
    """AgentConfig from the real settings layer with ``agent.<field>`` overrides."""
    return load_settings(env={}, cli={f"agent.{k}": v for k, v in overrides.items()}).agent


class FakeGpu:
    def __init__(self, index: int) -> None:
        self.index = index
        self.uuid = f"GPU-{index:08d}-fake"
        self.temp = 60
        self.power_mw = 350_000
        self.ecc = {("c", 0): 0, ("u", 0): 0, ("c", 1): 5, ("u", 1): 0}  # (type, counter) -> count
        self.remap = (0, 0, 0, 0)
        self.reasons = 0
        self.lost = False
        self.nvlinks = 4


class FakeNvml(types.SimpleNamespace):
    """A stand-in for ``pynvml`` with the real module's constants and exception classes.

    Used only because this machine has no GPU; the same collector code runs against the
    real ``pynvml`` on a GPU host (scripts/gpu-check.sh).
    """

    def __init__(self, n: int = 2, *, init_error: type[Exception] | None = None) -> None:
        super().__init__()
        for name in dir(pynvml):
            if name.startswith(("NVML_", "NVMLError", "nvmlEventType", "nvmlClocks")):
                setattr(self, name, getattr(pynvml, name))
        self.gpus = [FakeGpu(i) for i in range(n)]
        self.init_error = init_error
        self.pending_xids: list[tuple[int, int]] = []
        self.calls = 0

    def _h(self, h: FakeGpu) -> FakeGpu:
        self.calls += 1
        if h.lost:
            raise pynvml.NVMLError_GpuIsLost()
        return h

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error()

    def nvmlShutdown(self) -> None:
        pass

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> FakeGpu:
        return self.gpus[i]

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return h.uuid

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetPciInfo(self, h: FakeGpu) -> Any:
        return types.SimpleNamespace(busId=f"00000000:{0x3b + h.index:02X}:00.0".encode())

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        return self._h(h).temp

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        return self._h(h).power_mw

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, kind: int) -> int:
        return 1980 if kind == pynvml.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGpu) -> int:
        return self._h(h).reasons

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu) -> Any:
        return types.SimpleNamespace(gpu=97, memory=41)

    def nvmlDeviceGetMemoryInfo(self, h: FakeGpu) -> Any:
        return types.SimpleNamespace(used=70 * 2**30, total=80 * 2**30, free=10 * 2**30)

    def nvmlDeviceGetTotalEccErrors(self, h: FakeGpu, etype: int, counter: int) -> int:
        t = "c" if etype == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED else "u"
        return self._h(h).ecc[(t, counter)]

    def nvmlDeviceGetRetiredPages(self, h: FakeGpu, cause: int) -> list[int]:
        raise pynvml.NVMLError_NotSupported()  # Hopper replaced page retirement by row remapping

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h: FakeGpu) -> int:
        raise pynvml.NVMLError_NotSupported()

    def nvmlDeviceGetRemappedRows(self, h: FakeGpu) -> tuple[int, int, int, int]:
        return self._h(h).remap

    def nvmlDeviceGetPcieReplayCounter(self, h: FakeGpu) -> int:
        return 3

    def nvmlDeviceGetNvLinkState(self, h: FakeGpu, link: int) -> int:
        if link >= h.nvlinks:
            raise pynvml.NVMLError_InvalidArgument()
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, h: FakeGpu, link: int, counter: int) -> int:
        return 1 if counter == pynvml.NVML_NVLINK_ERROR_DL_REPLAY else 0

    def nvmlEventSetCreate(self) -> str:
        return "eventset"

    def nvmlDeviceRegisterEvents(self, h: FakeGpu, types_: int, es: str) -> None:
        assert types_ == pynvml.nvmlEventTypeXidCriticalError

    def nvmlEventSetWait(self, es: str, timeout_ms: int) -> Any:
        if not self.pending_xids:
            raise pynvml.NVMLError_Timeout()
        gpu, code = self.pending_xids.pop(0)
        return types.SimpleNamespace(device=self.gpus[gpu], eventType=pynvml.nvmlEventTypeXidCriticalError,
                                     eventData=code)

    def nvmlEventSetFree(self, es: str) -> None:
        pass

