"""How one raw log line is read: bytes to the text its program wrote, and the line's time.

A line arrives with whatever was put in front of it on its way to us: a CR of a CR LF file,
terminal colour sequences, a ``grep -H`` prefix (the original file's name, whose rank/host hints
still count), a log collector's RFC 3339 stamp. These are taken off here, once, for the Python
scan, the grep prefilter and the progress tail alike. Pure functions; no I/O.
"""

from __future__ import annotations

import re

from titan.triage.lineparse import parse_time

__all__ = ["MAX_LINE", "decode_line", "decode_named", "line_time", "last_time"]

MAX_LINE = 8 << 10  # a matched line longer than this is cut before matching (huge lines)


# terminal colour/style sequences (CSI … final byte): logs captured from a terminal or CI keep them in
# front of prefixes that identity and the rules read (Ray's coloured "(Worker pid=N, ip=A)")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


# a log collector's own stamp in front of every line (kubectl logs --timestamps, docker logs -t, CI log
# exports): RFC 3339 with "T" and a zone, then one space
_COLLECTOR = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d)) (?=\S)")


# grep -H / grep -r output pasted as a log: "path/rank3.log:" (a match) or "path/rank3.log-" (context), with
# -n the line number between the same separators; the name is the original file's (its rank/host hints)
_GREP_H = re.compile(r"^(?P<name>[\w.+-]+(?:/[\w.+-]+)*\.(?:log|txt|out|err))(?:(?P<s>[:-])\d+(?P=s)|[:-])")


def decode_line(b: bytes) -> str:
    return decode_named(b)[0]


def decode_named(b: bytes) -> tuple[str, str | None]:
    """The line as its program wrote it, and the file name a ``grep -H`` prefix gave it (or None).

    Cut to ``MAX_LINE``; a CR of a CR LF file, terminal colour sequences, a ``grep -H`` prefix and a
    log collector's stamp in front (``_COLLECTOR``) are removed.
    """
    if len(b) > MAX_LINE:
        b = b[:MAX_LINE]
    s = b.decode("utf-8", errors="replace")
    if s.endswith("\r"):  # a CRLF file (pasted or saved on Windows): the line without its CR
        s = s.rstrip("\r")
    if "\x1b" in s:
        s = _ANSI.sub("", s)
    name = None
    if "." in s[:160] and s[:1].isalnum():
        m = _GREP_H.match(s)
        if m is not None:
            name, s = m["name"], s[m.end():]
    return (_uncollect(s) if s[:1].isdigit() else s), name


def _uncollect(s: str) -> str:
    """A line behind a collector's stamp, read as the program wrote it (prefixes and rules anchored at its start
    read again); the stamp's time is kept by ``_time`` when the line has none of its own."""
    m = _COLLECTOR.match(s)
    return s[m.end():] if m is not None else s


def line_time(text: str, raw: bytes, year: int) -> float | None:
    """The line's own time, else the collector's stamp in front of its raw bytes (``_COLLECTOR``)."""
    t = parse_time(text, year)
    if t is None and raw[:1].isdigit():
        m = _COLLECTOR.match(raw[:40].decode("ascii", errors="replace"))
        if m is not None:
            t = parse_time(m.group(1), year)
    return t


def last_time(buf: bytes, end: int, year: int, max_lines: int = 40) -> float | None:
    """Time of the nearest timestamped line at or before ``end`` in ``buf``."""
    pos = end
    for _ in range(max_lines):
        start = buf.rfind(b"\n", 0, pos) + 1
        raw = buf[start:min(pos, start + 200)]
        t = line_time(decode_line(raw), raw, year)
        if t is not None:
            return t
        if start == 0:
            return None
        pos = start - 1
    return None
