"""Timestamps and rank/host prefixes in the forms real logs use.

Times without a zone are taken as UTC; formats without a year (glog ``W1130 13:25:57``,
syslog ``Nov 30 13:25:57``) take the reference year (the year of other timestamps seen, or
the current year). Boot-relative ``dmesg`` stamps (``[  269.51]``) are not wall-clock time
and are ignored: such lines keep their order within the file.
"""

from __future__ import annotations

import datetime as _dt
import re

__all__ = ["parse_time", "line_rank", "strip_prefixes", "name_hints", "MONTHS"]

MONTHS = {m: i for i, m in enumerate(("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct",
                                       "nov", "dec"), start=1)}
_UTC = _dt.timezone.utc

# Prefixes added by launchers before the program's own text: torchrun's "[default3]:"/"[rank3]:", srun -l's "3: ",
# Open MPI's --tag-output "[jobid,rank]<stderr>:" and horovodrun's "[rank]<stdout>:" (both the world rank)
_PREFIX = re.compile(r"^(?:\[(?:default|rank|trainer|worker)?(?P<r1>\d+)\]:\s?|(?P<r2>\d{1,5}):\s(?=\S)|"
                     r"\[(?:\d+,)?(?P<r3>\d+)\]<std(?:out|err)>:\s?)")
_ISO = re.compile(
    r"(?P<y>20\d\d)-(?P<mo>\d\d)-(?P<d>\d\d)[T _](?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:[.,](?P<f>\d{1,9}))?"
    r"(?P<tz>Z|[+-]\d\d:?\d\d)?")
_ISO_BEHIND = re.compile(r"(?:(?<=[\s\[(<:])|(?<=^))" + _ISO.pattern)
_GLOG = re.compile(r"^\[?[IWEF](?P<mo>\d\d)(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:\.(?P<f>\d{1,9}))?\s")
_SYSLOG = re.compile(r"^(?P<mon>[A-Z][a-z]{2}) +(?P<d>\d{1,2}) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)(?:\.(?P<f>\d+))?\s")
_CTIME = re.compile(r"^\[?(?:[A-Z][a-z]{2} )?(?P<mon>[A-Z][a-z]{2}) +(?P<d>\d{1,2}) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)"
                    r"(?:\.(?P<f>\d+))? (?P<y>20\d\d)\]?")
_EPOCH = re.compile(r"^\[?(?P<e>1[5-9]\d{8}(?:\.\d+)?)\]?\s")

# "[rank3]", "Rank 3", "rank=3", "rank: 3" (Lightning's "[rank: 3]"), "[RANK 3]" (Accelerate), "global rank 3"
_RANK_IN_TEXT = re.compile(r"(?:\[|\b)(?:global )?rank(?:\s*[=:]\s*|[ _\[])?(?P<r>\d{1,6})\b", re.IGNORECASE)


def _frac(f: str | None) -> float:
    return float("0." + f) if f else 0.0


def parse_time(line: str, year: int) -> float | None:
    """Return the UNIX time stamped on ``line`` (at its start, after launcher prefixes), or None."""
    head = strip_prefixes(line)[:96]
    # at the start, or behind other prefixes (grep -H "file:", pdsh "host: ", a bracket): a stamp in
    # the head of the line is the line's time
    m = _ISO.match(head) or _ISO_BEHIND.search(head)
    try:
        if m:
            tz = m.group("tz")
            tzinfo = _UTC
            if tz and tz != "Z":
                sign = 1 if tz[0] == "+" else -1
                hh, mm = int(tz[1:3]), int(tz[-2:])
                tzinfo = _dt.timezone(sign * _dt.timedelta(hours=hh, minutes=mm))
            t = _dt.datetime(int(m["y"]), int(m["mo"]), int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"]),
                             tzinfo=tzinfo)
            return t.timestamp() + _frac(m.group("f"))
        m = _GLOG.match(head)
        if m:
            t = _dt.datetime(year, int(m["mo"]), int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"]), tzinfo=_UTC)
            return t.timestamp() + _frac(m.group("f"))
        m = _CTIME.match(head)
        if m and m["mon"].lower() in MONTHS:
            t = _dt.datetime(int(m["y"]), MONTHS[m["mon"].lower()], int(m["d"]), int(m["h"]), int(m["mi"]),
                             int(m["s"]), tzinfo=_UTC)
            return t.timestamp() + _frac(m.group("f"))
        m = _SYSLOG.match(head)
        if m and m["mon"].lower() in MONTHS:
            t = _dt.datetime(year, MONTHS[m["mon"].lower()], int(m["d"]), int(m["h"]), int(m["mi"]), int(m["s"]),
                             tzinfo=_UTC)
            return t.timestamp() + _frac(m.group("f"))
        m = _EPOCH.match(head)
        if m:
            return float(m["e"])
    except ValueError:  # 2026-02-31 and the like
        return None
    return None


def strip_prefixes(line: str) -> str:
    """Remove launcher prefixes (``[default3]:``, ``[rank3]:``, ``3: ``, ``[1,3]<stderr>:``), repeatedly."""
    for _ in range(3):
        m = _PREFIX.match(line)
        if not m:
            break
        line = line[m.end():]
    return line


def line_rank(line: str) -> int | None:
    """The rank a line speaks for: a launcher prefix first, else ``[rank3]``/``Rank 3`` in the text."""
    m = _PREFIX.match(line)
    rank = None
    while m:
        rank = int(m["r1"] or m["r2"] or m["r3"])
        if m.group(0).startswith("[rank") or m.group(0).startswith("[trainer") or m["r3"] is not None:
            return rank  # the global rank wins over a local-rank ``[default N]`` prefix
        line = line[m.end():]
        m = _PREFIX.match(line)
        if m and m.group(0).startswith("[rank"):
            return int(m["r1"])
    if rank is not None:
        return rank
    m = _RANK_IN_TEXT.search(line[:300])
    return int(m["r"]) if m else None


_NAME_RANK = re.compile(r"(?:^|[._/-])(?:rank|r)[_-]?(?P<r>\d{1,6})(?=$|[._/-])", re.IGNORECASE)
_GENERIC = {"log", "logs", "txt", "out", "err", "stdout", "stderr", "console", "dmesg", "kernel", "journal",
            "journalctl", "syslog", "messages", "nvidia", "smi", "nvidia-smi", "slurm", "error", "json", "jsonl",
            "train", "training", "job", "run", "output", "launcher", "torchrun", "attempt", "nccl", "fr",
            "trace", "dump", "worker", "q", "events", "default"}
_HOSTLIKE = re.compile(r"^(?=.*[a-z])[a-z][a-z0-9-]*\d[a-z0-9-]*$|^(?:node|host|gpu|worker|compute)[a-z0-9-]+$",
                       re.IGNORECASE)


#: generic words that name a file's kind when joined to a host by '-' ("worker-3" stays: a pod's name)
_JOINED = (_GENERIC - {"worker", "default"}) | {"pyspy", "stacks", "gdb", "core"}


def _ungeneric(tok: str) -> str:
    """A name token without the generic words joined to it by '-': Slurm's default ``slurm-%j.out`` (a job id, no
    host), ``trace-%N.out`` (a host), ``dmesg-node3``, ``gpu47-dmesg``."""
    words = tok.split("-")
    while len(words) > 1 and words[0].lower() in _JOINED:
        words = words[1:]
    while len(words) > 1 and words[-1].lower() in _JOINED:
        words = words[:-1]
    return "-".join(words)


def name_hints(relpath: str) -> tuple[int | None, str | None]:
    """Rank and host a file's name suggests: ``rank3.log``, ``attempt_0/3/stderr.log``, ``node07/dmesg.log``."""
    rank = None
    m = _NAME_RANK.search(relpath)
    if m:
        rank = int(m["r"])
    parts = relpath.replace("\\", "/").split("/")
    if rank is None and len(parts) >= 2 and parts[-2].isdigit() and len(parts[-2]) <= 5:
        rank = int(parts[-2])
    host = None
    for part in reversed(parts):
        for tok in re.split(r"[._]", part):
            tok = _ungeneric(tok)
            t = tok.lower()
            if not t or t in _GENERIC or t.isdigit() or _NAME_RANK.fullmatch("." + t) or t.startswith("attempt"):
                continue
            if _HOSTLIKE.match(tok) and not re.fullmatch(r"(?:rank|r)\d+", t):
                host = tok
                break
        if host:
            break
    return rank, host
