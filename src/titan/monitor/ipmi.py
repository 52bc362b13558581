"""Power and cooling via ``ipmitool sensor`` (node input power, fans, temperatures).

``ipmitool`` talks to the BMC and can take seconds, so a helper thread runs it every
``every_s`` (with a timeout) and ``collect`` returns the latest parse. The node's input
power (``ipmi_node_power_watts``) is the BMC's total-power sensor where one exists,
otherwise the sum of the power supplies' input sensors. Absent binary, no BMC device or
no permission → ``unavailable: <reason>``.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import threading
from typing import Callable

from titan.monitor.base import Reading, metric_key, unavailable

__all__ = ["IpmiCollector", "parse_sensor_output"]

log = logging.getLogger(__name__)

_TOTAL = re.compile(r"(?i)(sys(tem)?|total|node).*(power|pwr)|pwr consumption|power meter")
_PSU_IN = re.compile(r"(?i)(ps|psu|power supply)\s*\d*.*(in|input)")


def parse_sensor_output(text: str) -> dict[str, float]:
    """Metrics from ``ipmitool sensor`` lines ``name | value | unit | status | …``."""
    out: dict[str, float] = {}
    total = None
    psu = 0.0
    watts = 0.0
    any_psu = False
    for line in text.splitlines():
        cols = [c.strip() for c in line.split("|")]
        if len(cols) < 3:
            continue
        name, value, unit = cols[0], cols[1], cols[2].lower()
        try:
            v = float(value)
        except ValueError:
            continue  # "na", discrete sensors
        sensor = re.sub(r"\s+", "_", name.strip())
        if unit == "watts":
            out[metric_key("ipmi_power_watts", sensor=sensor)] = v
            watts += v
            if _TOTAL.search(name) and total is None:
                total = v
            elif _PSU_IN.search(name):
                psu += v
                any_psu = True
        elif unit == "rpm":
            out[metric_key("ipmi_fan_rpm", sensor=sensor)] = v
        elif unit == "degrees c":
            out[metric_key("ipmi_temperature_celsius", sensor=sensor)] = v
    node = total if total is not None else (psu if any_psu else (watts if watts else None))
    if node is not None:
        out["ipmi_node_power_watts"] = node
    return out


class IpmiCollector:
    """Latest ``ipmitool sensor`` reading; ``runner`` returns its text (a recording in tests)."""

    name = "ipmi"

    def __init__(self, *, every_s: float = 30.0, timeout_s: float = 20.0,
                 runner: Callable[[], str] | None = None, start_thread: bool = True) -> None:
        self.every_s = every_s
        self.timeout_s = timeout_s
        self._runner = runner
        self._status = "ok"
        self._metrics: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if runner is None:
            exe = shutil.which("ipmitool")
            if exe is None:
                self._status = unavailable("ipmitool not installed (apt-get install ipmitool)")
                return
            self._runner = lambda: self._run(exe)
        if start_thread:
            self._thread = threading.Thread(target=self._loop, name="titan-ipmi", daemon=True)
            self._thread.start()
        else:
            self.poll()

    def _run(self, exe: str) -> str:
        p = subprocess.run([exe, "sensor"], capture_output=True, text=True, timeout=self.timeout_s)
        if p.returncode != 0:
            raise RuntimeError((p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1])
        return p.stdout

    def poll(self) -> None:
        """Run ipmitool once and keep the result (or the reason it failed)."""
        assert self._runner is not None
        try:
            metrics = parse_sensor_output(self._runner())
            status = "ok" if metrics else unavailable("ipmitool returned no numeric sensors")
        except subprocess.TimeoutExpired:
            metrics, status = {}, unavailable(f"ipmitool sensor timed out after {self.timeout_s:g}s")
        except (OSError, RuntimeError) as e:
            metrics, status = {}, unavailable(f"ipmitool sensor failed: {e}")
        with self._lock:
            self._metrics, self._status = metrics, status

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(self.every_s)

    def collect(self, now: float) -> Reading:
        with self._lock:
            return Reading(self.name, status=self._status, metrics=dict(self._metrics))

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout_s + 1)
