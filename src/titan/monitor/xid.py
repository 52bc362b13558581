"""NVIDIA Xid codes → Titan actions, after NVIDIA's published Xid catalog.

NVIDIA's catalog (docs.nvidia.com/deploy/xid-errors, "Resolution Bucket (Immediate
Action)") sorts Xids into RESTART_APP, RESET_GPU, RESTART_BM (reboot the node),
CONTACT_SUPPORT and IGNORE. Titan maps those onto what the launcher can do:

* ``restart_in_place`` – RESTART_APP: the fault belongs to the process (a page fault, an
  engine exception); restarting the workers on the same node is enough.
* ``exclude_node`` – RESET_GPU, RESTART_BM and hardware-class faults (fallen off the bus,
  uncontained ECC, GSP errors): the node must leave the job until it is reset or repaired.
* ``log_only`` – informational Xids (page retired, high single-bit rate) and Xids that
  follow another one (45).

An unknown code is ``log_only`` at level warning, so a new driver's Xid is never silent
but never kills a job on a guess. Override per code with ``agent.xid_actions``.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping

__all__ = ["ACTIONS", "XidInfo", "XID_TABLE", "xid_info", "parse_xid_line"]

ACTIONS = ("restart_in_place", "exclude_node", "log_only")


@dataclasses.dataclass(frozen=True)
class XidInfo:
    code: int
    description: str
    bucket: str  # NVIDIA's immediate-action bucket
    action: str  # restart_in_place | exclude_node | log_only

    @property
    def level(self) -> str:
        return {"exclude_node": "critical", "restart_in_place": "error"}.get(self.action, "warning")


def _t(code: int, description: str, bucket: str) -> XidInfo:
    action = {"RESTART_APP": "restart_in_place", "IGNORE": "log_only"}.get(bucket, "exclude_node")
    return XidInfo(code, description, bucket, action)


XID_TABLE: dict[int, XidInfo] = {x.code: x for x in (
    _t(8, "GPU stopped processing (channel idle timeout)", "RESTART_APP"),
    _t(13, "Graphics engine exception", "RESTART_APP"),
    _t(31, "GPU memory page fault", "RESTART_APP"),
    _t(32, "Invalid or corrupted push buffer stream", "RESTART_APP"),
    _t(38, "Driver firmware error", "RESET_GPU"),
    _t(43, "GPU stopped processing (reset channel)", "RESTART_APP"),
    _t(45, "Preemptive cleanup, due to previous errors", "IGNORE"),
    _t(46, "GPU stopped processing", "RESET_GPU"),
    _t(48, "Double-bit ECC error", "RESET_GPU"),
    _t(61, "Internal micro-controller breakpoint/warning", "RESET_GPU"),
    _t(62, "Internal micro-controller halt", "RESET_GPU"),
    _t(63, "ECC page retirement or row remapping recording event", "IGNORE"),
    _t(64, "ECC page retirement or row remapper recording failure", "RESET_GPU"),
    _t(68, "Video processor exception", "RESTART_APP"),
    _t(69, "Graphics engine class error", "RESTART_APP"),
    _t(74, "NVLink error", "RESET_GPU"),
    _t(79, "GPU has fallen off the bus", "RESTART_BM"),
    _t(92, "High single-bit ECC error rate", "IGNORE"),
    _t(94, "Contained ECC error", "RESTART_APP"),
    _t(95, "Uncontained ECC error", "RESET_GPU"),
    _t(109, "Context switch timeout error", "RESTART_APP"),
    _t(119, "GSP RPC timeout", "RESET_GPU"),
    _t(120, "GSP error", "RESET_GPU"),
    _t(121, "C2C link corrected error", "IGNORE"),
    _t(123, "SPI PMU RPC write failure", "RESET_GPU"),
    _t(136, "Unrecovered ECC error (pending reset)", "RESET_GPU"),
    _t(140, "Unrecovered ECC error", "RESET_GPU"),
    _t(143, "GPU initialization failure", "RESTART_BM"),
    _t(144, "NVLink SAW error", "RESET_GPU"),
    _t(145, "NVLink RLW error", "RESET_GPU"),
    _t(149, "NVLink NETIR error", "RESET_GPU"),
    _t(154, "GPU recovery action changed", "RESET_GPU"),
)}


def xid_info(code: int, overrides: Mapping[str, str] | None = None) -> XidInfo:
    """The table entry for ``code`` (overridden by ``{"79": "log_only"}``-style settings)."""
    base = XID_TABLE.get(code) or XidInfo(code, "unknown Xid (see NVIDIA's Xid catalog)", "UNKNOWN", "log_only")
    action = (overrides or {}).get(str(code))
    if action:
        base = dataclasses.replace(base, action=action)
    return base


# NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, GPU has fallen off the bus.
# Older drivers omit "PCI:" and the pid/name fields.
_XID_RE = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\): (?P<code>\d+)(?:, (?P<rest>.*))?")


def parse_xid_line(line: str) -> tuple[int, str, str] | None:
    """``(code, pci_bus_id, rest_of_message)`` of a kernel Xid line, else None."""
    m = _XID_RE.search(line)
    if not m:
        return None
    return int(m["code"]), m["pci"].lower(), (m["rest"] or "").strip()
