"""Structured inputs: torchrun error files, flight-recorder JSON dumps, Titan event files,
``nvidia-smi -q`` dumps. Each becomes findings like a text line would.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from titan.triage.lineparse import parse_time
from titan.triage.model import Finding
from titan.triage.rules import RuleSet
from titan.triage.scan import FileScan, make_finding

__all__ = ["sniff", "scan_error_file", "scan_fr_dump", "scan_nvsmi", "MAX_JSON_BYTES"]

MAX_JSON_BYTES = 64 << 20


def sniff(path: Path, head: bytes) -> str:
    """What a file is: ``error_file``, ``fr_dump``, ``events``, ``nvsmi`` or ``text``."""
    h = head.lstrip()
    if h.startswith(b"{") and path.suffix == ".json" or h.startswith(b'{"message"'):
        if b'"message"' in head[:200]:
            return "error_file"
        if b'"entries"' in head or b'"pg_config"' in head or b'"version"' in head[:100]:
            return "fr_dump"
    if path.suffix == ".jsonl" and h.startswith(b"{") and b'"kind"' in head and b'"v"' in head:
        return "events"
    if b"NVSMI LOG" in head:
        return "nvsmi"
    return "text"


def _load_json(path: Path) -> Any:
    if path.stat().st_size > MAX_JSON_BYTES:
        raise ValueError(f"larger than {MAX_JSON_BYTES >> 20} MiB")
    with open(path, "rb") as f:
        return json.loads(f.read().decode("utf-8", errors="replace"))


def scan_error_file(path: Path, display: str, order: int, rules: RuleSet, year: int, file_rank: int | None,
                    file_host: str | None) -> FileScan:
    """torchrun's ``@record`` error file: ``{"message": {"message": "Exc: …", "extraInfo": {"timestamp": …}}}``."""
    res = FileScan(file=display)
    try:
        obj = _load_json(path)
    except (ValueError, OSError) as e:
        res.problem = f"unreadable error file ({e})"
        return res
    msg = obj.get("message") if isinstance(obj, dict) else None
    extra: dict[str, Any] = {}
    if isinstance(msg, dict):
        extra = msg.get("extraInfo") or {}
        msg = msg.get("message")
    if not isinstance(msg, str):
        res.problem = "error file without a message"
        return res
    t = None
    try:
        t = float(extra.get("timestamp")) if extra.get("timestamp") is not None else None
    except (TypeError, ValueError):
        t = None
    for i, line in enumerate(msg.splitlines() or [msg], start=1):
        f = make_finding(rules, line, file=display, line=i, t=t, inherited=False, file_rank=file_rank,
                         file_host=file_host, order=order)
        if f is not None:
            res.findings.append(f)
    if file_rank is not None:
        res.ranks.add(file_rank)
    res.lines = msg.count("\n") + 1
    return res


def scan_fr_dump(path: Path, display: str, order: int, file_rank: int | None, file_host: str | None) -> FileScan:
    """A flight-recorder JSON dump: the last collective sequence number this rank entered and completed.

    The rank whose last *started* collective is behind the others' is the one that never
    entered the collective they wait in (see ``method``).
    """
    res = FileScan(file=display)
    try:
        obj = _load_json(path)
    except (ValueError, OSError) as e:
        res.problem = f"unreadable flight-recorder dump ({e})"
        return res
    entries = obj.get("entries") if isinstance(obj, dict) else None
    if not isinstance(entries, list):
        res.problem = "flight-recorder dump without entries"
        return res
    rank = file_rank
    if isinstance(obj.get("rank"), int):
        rank = obj["rank"]
    last_started, last_completed, last_name, last_t = -1, -1, "", None
    for e in entries:
        if not isinstance(e, dict):
            continue
        seq = e.get("collective_seq_id")
        if not isinstance(seq, int) or e.get("is_p2p"):
            continue
        state = str(e.get("state", ""))
        if seq > last_started:
            last_started, last_name = seq, str(e.get("profiling_name", ""))
            tn = e.get("time_created_ns")
            last_t = tn / 1e9 if isinstance(tn, (int, float)) else None
        if state == "completed":
            last_completed = max(last_completed, seq)
    if rank is None or last_started < 0:
        res.problem = "flight-recorder dump without a rank or collectives"
        return res
    res.ranks.add(rank)
    text = (f"flight recorder: rank {rank} last collective seq {last_started} ({last_name}), "
            f"last completed {last_completed}")
    res.findings.append(Finding(rule="flight_recorder", role="precursor", cls=None, file=display, line=1, text=text,
                                t=last_t, rank=rank, node=file_host, priority=0, order=(order, 1),
                                fields={"fr_last_seq": last_started, "fr_last_completed": last_completed,
                                        "op": last_name}))
    return res


_NVSMI_GPU = re.compile(r"^GPU (?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*$")
_NVSMI_TS = re.compile(r"^Timestamp\s*:\s*(?P<ts>.+)$")
_KV = re.compile(r"^(?P<indent>\s*)(?P<k>[^:]+?)\s*:\s*(?P<v>.*?)\s*$")


def scan_nvsmi(path: Path, display: str, order: int, rules: RuleSet, year: int, file_host: str | None) -> FileScan:
    """``nvidia-smi -q``: pending row remaps / page retirement, uncorrectable ECC counts, HW slowdown.

    Field names follow the ``nvidia-smi -q`` output of driver 450+ (sections ``ECC Errors``,
    ``Retired Pages``, ``Remapped Rows``, ``Clocks Event Reasons``/``Clocks Throttle Reasons``).
    Each fault becomes a synthetic line ``nvidia-smi: <what> on GPU <bus>`` matched by a rule.
    """
    res = FileScan(file=display)
    t = None
    bus = None
    section: list[tuple[int, str]] = []
    with open(path, "rb") as fh:
        for i, raw in enumerate(fh, start=1):
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            res.lines = i
            if not line.strip():
                continue
            m = _NVSMI_TS.match(line.strip())
            if m and t is None:
                ts = m["ts"].strip()
                t = parse_time("[" + ts + "]", year) or parse_time(ts, year)
                continue
            m = _NVSMI_GPU.match(line.strip())
            if m and not line.startswith(" "):
                bus, section = m["bus"], []
                continue
            m = _KV.match(line)
            if not m or bus is None:
                continue
            indent = len(m["indent"])
            while section and section[-1][0] >= indent:
                section.pop()
            key, val = m["k"].strip(), m["v"].strip()
            if not val:
                section.append((indent, key))
                continue
            path_s = " > ".join(k for _, k in section) + " > " + key
            what = _nvsmi_fault(path_s, val)
            if what:
                text = f"{what[1]}: {what[0]} on GPU {bus} ({path_s} = {val})"
                f = make_finding(rules, text, file=display, line=i, t=t, inherited=False, file_rank=None,
                                 file_host=file_host, order=order)
                if f is not None:
                    res.findings.append(f)
    res.timed = t is not None
    return res


def _nvsmi_fault(path: str, val: str) -> tuple[str, str] | None:
    v = val.lower()
    p = path.lower()
    num = int(val) if val.isdigit() else 0
    if "remapped rows" in p and p.endswith("> pending") and v == "yes":
        return ("row remapping pending", "nvidia-smi")
    if "remapped rows" in p and "remapping failure occurred" in p and v == "yes":
        return ("row remapping failure", "nvidia-smi")
    if "retired pages" in p and "pending" in p and v == "yes":
        return ("page retirement pending", "nvidia-smi")
    if "ecc errors" in p and "volatile" in p and ("uncorrectable" in p or "double bit" in p) and num > 0:
        return (f"{num} volatile uncorrectable ECC errors", "nvidia-smi")
    if ("clocks event reasons" in p or "clocks throttle reasons" in p) and ("hw slowdown" in p or "thermal" in p) \
            and v == "active":
        return ("hardware slowdown active", "nvidia-smi-warn")
    return None
