"""Streaming scan of one raw log file into findings, progress samples and facts.

Cost: one pass over the file in 4 MiB chunks; a single keyword alternation runs over each
chunk in C, and Python only looks at the lines around a hit, so memory stays bounded by the
chunk size plus the capped finding lists whatever the file size. Progress (step, loss, step
time, throughput) is read from the file's tail only (the failure is at the end of a log).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterable

from titan.triage.grepfilter import GREP as _GREP
from titan.triage.grepfilter import GREP_ENV, grep_hit
from titan.triage.identity import (HEAD, global_rank, nccl_prefix, pdsh_host, prefix_host, prompt_host, rank_claim,
                                   syslog_host, ucx_host)
from titan.triage.lineparse import line_rank, parse_time, strip_prefixes
from titan.triage.model import Finding
from titan.triage.rawline import decode_line, decode_named, last_time, line_time
from titan.triage.rules import RuleSet

__all__ = ["FileScan", "Progress", "scan_text_file", "make_finding", "CHUNK", "TAIL_BYTES"]

CHUNK = 4 << 20
TAIL_BYTES = 32 << 10       # progress is read from this much of each file's end
MAX_FINDINGS = 1000         # per file: the first and the last this many are kept
GREP_MIN_BYTES = 256 << 10  # files this large use the grep -F prefilter
_PRINTABLE = bytes(range(32, 256)) + b"\t\n\r\x0b\x0c\x1b"

_NCCL_INIT = re.compile(r"(?:^|(?<=\s))(?P<host>[A-Za-z0-9][\w.-]*):(?P<pid>\d+):\d+ \[(?P<dev>\d+)\] NCCL INFO .*?\brank (?P<rank>\d+) "
                        r".*?(?:busId (?P<bus>[0-9a-fA-F]+))?")
# coreutils tail/head of several files: "==> rank3.log <==" starts that file's lines
_SECTION = re.compile(r"^==> (?P<name>\S(?:.*\S)?) <==\s*$")
# NCCL's interface list: "Bootstrap : Using eth0:10.0.0.5<0>", "NET/Socket : Using [0]eth0:10.0.0.5<0> [1]…"
_NCCL_IF = re.compile(r"(?:\[\d+\])?[\w.-]+:(?P<ip>\d{1,3}(?:\.\d{1,3}){3})<\d+>")
# a grep -H prefix and/or a collector's stamp in front of each line (as titan.triage.rawline reads them)
_CS = rb"(?:[\w.+/-]+\.(?:log|txt|out|err)[:-](?:\d+[:-])?)?(?:\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:\d\d) )?"
_SUMMARY = re.compile(
    rb"(?m)^" + _CS + rb"\s*time\s*: (?P<time>\S+)\s*\n" + _CS + rb"\s*host\s*: (?P<host>\S+)\s*\n" + _CS
    + rb"\s*rank\s*: (?P<rank>\d+) \(local_rank: (?P<lr>\d+)\)\s*\n" + _CS
    + rb"\s*exitcode\s*: (?P<code>-?\d+) \(pid: (?P<pid>\d+)\)")
_PROGRESS = re.compile(r"\b(?:step|iter(?:ation)?|global_step|batch)\b[\s:=#]*(?P<step>\d+)", re.IGNORECASE)
_LOSS = re.compile(r"(?:\bloss\b|'loss'|\"loss\"|lm loss)[\s:='\"]*(?P<loss>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf|NaN|Inf|NAN))",
                   re.IGNORECASE)
_STEPTIME = re.compile(r"(?:step_time|time per iteration \((?:ms|s)\)|iter_time|step time)"
                       r"[\s:=]*(?P<v>\d+\.?\d*)\s*(?P<u>ms|s)?", re.IGNORECASE)
# possessive, from a number's first digit: the same matches as "\d+\.?\d*\s*(?:…)/s" without its backtracking over every
# digit of a line full of stamps (3x less CPU per progress line)
_TPUT = re.compile(r"(?<!\d)(?P<v>\d++(?:\.\d*+)?+)\s*+(?:samples|tokens|tok|seq|it)/s|\bTFLOPs:\s*(?P<tf>\d+\.?\d*)",
                   re.IGNORECASE)
_GNORM = re.compile(r"grad[_ ]norm[\s:='\"]*(?P<v>[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))", re.IGNORECASE)
_ERRORISH = re.compile(r"\b(?:ERROR|FATAL|Fatal|Traceback|Exception|[A-Z]\w*Error|failed|Failed|Killed|[Aa]bort(?:ed|ing)?)\b")
_EPOCH = re.compile(r"'epoch': (?P<e>\d+(?:\.\d+)?)")
# tqdm's bar: " 45%|████▌     | 450/1000 [00:10<00:12, 45.0it/s]" (the count is the step)
_TQDM = re.compile(r"(?P<pct>\d{1,3})%\|[^|]*\|\s*(?P<step>\d+)/(?P<total>\d+)\s*\[")
_HF_DICT = re.compile(r"^\{.*'loss': ")
_NEW_RECORD = re.compile(rb"^\s*(?:\[|\d{4}-\d\d-\d\d|[A-Z]\d{4} )")


@dataclasses.dataclass(slots=True)
class Progress:
    t: float | None
    rank: int | None
    step: int
    loss: float | None
    step_time: float | None
    tput: float | None
    file: str
    line: int
    gnorm: float | None = None
    epoch: float | None = None
    #: False when ``step`` is only the line number (an HF Trainer dict carries no step)
    counted: bool = True


@dataclasses.dataclass
class FileScan:
    file: str
    findings: list[Finding] = dataclasses.field(default_factory=list)
    progress: list[Progress] = dataclasses.field(default_factory=list)
    ranks: set[int] = dataclasses.field(default_factory=set)
    pid_rank: dict[int, int] = dataclasses.field(default_factory=dict)
    rank_node: dict[int, str] = dataclasses.field(default_factory=dict)
    rank_gpu: dict[int, str] = dataclasses.field(default_factory=dict)
    #: IP address -> host, from NCCL's bootstrap/socket interface lines ("host:pid:tid [d] NCCL INFO Bootstrap : Using eth0:10.0.0.5<0>")
    ip_host: dict[str, str] = dataclasses.field(default_factory=dict)
    lines: int = 0
    size: int = 0
    timed: bool = False
    dropped: int = 0
    problem: str | None = None
    #: main-thread stacks of the dumps in this file (``titan.triage.stacks``)
    stacks: list[Any] = dataclasses.field(default_factory=list)
    #: (line, text) when one of the file's last lines reads like an error (recognised or not)
    ending: tuple[int, str] | None = None


def make_finding(rules: RuleSet, text: str, *, file: str, line: int, t: float | None, inherited: bool,
                 file_rank: int | None, file_host: str | None, order: int,
                 around: Callable[[int, int], tuple[list[str], list[str]]] | None = None) -> Finding | None:
    """Classify one line; None when no rule matches.

    ``around(before, after)`` returns the lines before/after this one (for rules that read
    context: a wrapped message, a traceback's frames, a kernel call trace); without it
    such rules see no context.
    """
    hit = rules.classify(text)
    if hit is None and around is not None and rules.wraps(text):
        _, nxt = around(0, 2)
        for k in (1, 2):  # a message wrapped by a terminal or a paste: join it back (no separator)
            if len(nxt) >= k:
                hit = rules.classify(text.rstrip("\n") + "".join(nxt[:k]), wrapped_only=True)
                if hit is not None:
                    text = text.rstrip("\n") + "".join(nxt[:k])
                    break
    excluded: frozenset[str] = frozenset()
    while True:
        if hit is None:
            return None
        rule, facts = hit
        cls = rule.cls
        context: list[str] = []
        if not (rule.context_before or rule.context_after):
            break
        before, after = around(rule.context_before, rule.context_after) if around is not None else ([], [])
        context = before + after
        joined = "\n".join(context)
        if rule.context_requires is not None and not rule.context_requires.search(joined):
            excluded |= {rule.id}  # the context does not bear the rule out: the next rule's reading
            hit = rules.classify(text, exclude=excluded)
            continue
        for c, rx in rule.context_class:
            if rx.search(joined):
                cls = c
                break
        if rule.pick == "traceback_exception":
            picked = _traceback_exception(after, text[:len(text) - len(strip_prefixes(text))])
            if picked is None or rules.classify(picked[1]) is not None:
                return None  # no exception line, or one another rule reads on its own
            line += picked[0] + 1
            text = picked[1]
            context = after[:picked[0]][-6:]
        break
    rank = line_rank(text)
    if facts.get("rank") is not None:
        rank = int(facts["rank"])
    g = global_rank(text)
    if g is not None and not (rule.names_rank and facts.get("rank") is not None):
        rank = g  # torchrun's [rankN]: prefix is global; a "Rank N" inside may be process-group-local
    if rank is None:
        rank = file_rank
    node = facts.get("host") or None
    pid = facts.get("pid") or facts.get("pid2")
    gpu = facts.get("pci") or facts.get("gpu")
    nc = nccl_prefix(text)
    if nc:
        node = node or nc[0]
        pid = pid or nc[1]
        gpu = gpu or nc[2]
    else:
        node = node or syslog_host(text)
    node = node or pdsh_host(text) or prefix_host(text) or ucx_host(text)
    fields = {k: v for k, v in facts.items() if k not in ("rank", "host", "pid", "pid2", "pci", "gpu")}
    if context:
        fields["context"] = [c[:300] for c in context]
    if rule.phase:
        fields["phase"] = rule.phase
    f = Finding(rule=rule.id, role=rule.role, cls=cls, file=file, line=line, text=text.strip(), t=t,
                t_inherited=inherited, rank=rank, node=node or file_host, gpu=str(gpu) if gpu is not None else None,
                pid=int(pid) if pid else None, action=rule.action, scope=rule.scope, priority=rule.priority,
                fields=fields, order=(order, line))
    if not rule.locates:
        f.fields["_nolocate"] = True
    if rule.superseded_by_life:
        f.fields["_superseded_by_life"] = True
    if rule.peer_failure_prone:
        f.fields["_peer_prone"] = True
    if rule.role == "exit" and (facts.get("signame") or facts.get("signame2")):
        f.fields["signal"] = facts.get("signame") or facts.get("signame2")
    if rule.role == "exit" and facts.get("exitcode2") is not None:
        f.fields["exitcode"] = facts["exitcode2"]
    claim = rank_claim(text) if rule.role == "lifecycle" else None
    if claim:
        f.fields["claim"] = claim
    return f


_FRAME = re.compile(r'^\s+File "|^\s+\S|^\s*$|^\s*\^+\s*$|^\s*\.\.\.')
# an exception's qualified name: a class name (capitalised, as Python's and libraries' exceptions are) or a
# dotted module path to one ("torch.distributed.DistBackendError", "socket.timeout") — not "wandb: …" chatter
_EXC_LINE = re.compile(r"^(?:(?:[\w]+\.)+[A-Za-z_]\w*|[A-Z]\w*)(?::\s|:?$)")


def _traceback_exception(after: list[str], prefix: str = "") -> tuple[int, str] | None:
    """(index, line) of the exception line that ends the traceback whose header precedes ``after``.

    ``prefix`` is the launcher prefix of the header (``[default1]:[rank1]: ``): lines without it
    were written by other processes into the same console and are skipped.
    """
    for i, raw in enumerate(after):
        if prefix and not raw.startswith(prefix):
            continue  # another writer's line, interleaved
        body = strip_prefixes(raw)
        if body.startswith(("Traceback (most recent", "During handling", "The above exception")):
            return None  # a chained traceback: its own header starts a new search
        if _FRAME.match(body):
            continue
        return (i, raw) if _EXC_LINE.match(body) else None
    return None


def around_reader(fd: int, off: int, length: int) -> Callable[[int, int], tuple[list[str], list[str]]]:
    """``around(before, after)`` for the line at byte ``off`` (``length`` bytes) of an open file.

    Reads with ``os.pread`` (the scanning position is untouched): at most 8 KiB before and
    16 KiB after the line, so a rule's context costs two small reads, only for matched lines.
    """
    def around(before: int, after: int) -> tuple[list[str], list[str]]:
        b: list[str] = []
        a: list[str] = []
        if before and off > 0:
            start = max(0, off - 8192)
            chunk = os.pread(fd, off - start, start).split(b"\n")
            if start:
                chunk = chunk[1:]  # a partial line
            b = [decode_line(x) for x in chunk[:-1][-before:]]
        if after:
            chunk = os.pread(fd, 16384, off + length + 1)
            parts = chunk.split(b"\n")
            if len(chunk) == 16384:
                parts = parts[:-1]
            a = [decode_line(x) for x in parts[:after]]
        return b, a

    return around


class _Keeper:
    """First and last MAX_FINDINGS findings of a file (bounded memory)."""

    def __init__(self) -> None:
        self.head: list[Finding] = []
        self.tail: deque[Finding] = deque(maxlen=MAX_FINDINGS)
        self.dropped = 0

    def add(self, f: Finding) -> None:
        if len(self.head) < MAX_FINDINGS:
            self.head.append(f)
            return
        if len(self.tail) == self.tail.maxlen:
            self.dropped += 1
        self.tail.append(f)

    def all(self) -> list[Finding]:
        return self.head + list(self.tail)


def scan_text_file(path: Path, display: str, order: int, rules: RuleSet, year: int, *,
                   file_rank: int | None = None, file_host: str | None = None,
                   hits: Iterable[tuple[int, int, bytes]] | None = None) -> FileScan:
    """Scan a text log; never raises for content (binary/garbage gives ``problem``), only for I/O.

    Files of ``GREP_MIN_BYTES`` or more are prefiltered by ``grep -F`` (Aho-Corasick in C,
    ~200 MB/s here against ~5 MB/s for a Python alternation of the same keywords) when a
    grep binary exists; the result is the same as the pure-Python path (tested). ``hits`` are
    this file's ``(line, offset, text)`` lines from a grep over many files (``grep_many``),
    which saves a process per file; without them the file gets its own grep.
    """
    res = FileScan(file=display)
    if file_rank is not None:
        res.ranks.add(file_rank)
    with open(path, "rb") as fh:
        head = fh.read(8192)
    if head.count(b"\x00") > 8 or (head and len(head.translate(None, _PRINTABLE)) > len(head) // 10):
        res.problem = "binary content, skipped"
        return res
    keep = _Keeper()
    ctx = _Ctx(res, keep, rules, display, order, year, file_rank, file_host)
    size = path.stat().st_size
    if hits is not None or (size >= GREP_MIN_BYTES and _GREP and _scan_grep(path, ctx)):
        if hits is not None:
            _grep_lines(path, ctx, hits)
    else:
        keep.__init__()  # type: ignore[misc]
        res.pid_rank.clear()
        res.rank_node.clear()
        _scan_python(path, ctx)
    res.findings = keep.all()
    res.dropped = keep.dropped
    _tail_progress(path, res, year, file_rank)
    return res


class _Ctx:
    def __init__(self, res: FileScan, keep: _Keeper, rules: RuleSet, display: str, order: int, year: int,
                 file_rank: int | None, file_host: str | None) -> None:
        self.res, self.keep, self.rules, self.display, self.order, self.year = res, keep, rules, display, order, year
        self.file_rank, self.file_host = file_rank, file_host
        self._own = (file_rank, file_host)
        self.fd = -1

    def line(self, text: str, line: int, t: float | None, inherited: bool, off: int = -1, length: int = 0,
             name: str | None = None) -> None:
        if text.startswith("==> "):
            sec = _SECTION.match(text)
            if sec:  # `tail`/`head` of several files: what follows is that file's (its name's rank/host hints)
                from titan.triage.lineparse import name_hints

                r, h = name_hints(sec["name"])
                self.file_rank = r if r is not None else self._own[0]
                self.file_host = h or self._own[1]
                if r is not None:
                    self.res.ranks.add(r)
                return
        if "$ " in text or "# " in text:
            h = prompt_host(text)
            if h is not None:  # a pasted shell prompt: the command's output that follows is that host's
                self.file_host = h
                return
        around = around_reader(self.fd, off, length) if self.fd >= 0 and off >= 0 else None
        file_rank, file_host = self.file_rank, self.file_host
        if name is not None:  # a grep -H prefix: the line's own file's hints
            from titan.triage.lineparse import name_hints

            r, h = name_hints(name)
            if r is not None:
                file_rank = r
                self.res.ranks.add(r)
            file_host = h or file_host
        f = make_finding(self.rules, text, file=self.display, line=line, t=t, inherited=inherited,
                         file_rank=file_rank, file_host=file_host, order=self.order, around=around)
        if f is not None:
            self.keep.add(f)
        if "Bootstrap : Using" in text or "NET/Socket : Using" in text:
            for mb in _NCCL_IF.finditer(text):
                host = nccl_prefix(text)
                if host:
                    self.res.ip_host.setdefault(mb["ip"], host[0])
        if "Init COMPLETE" in text or "Init START" in text:
            mi = _NCCL_INIT.search(strip_prefixes(text)[:HEAD])
            if mi:
                r = int(mi["rank"])
                self.res.pid_rank[int(mi["pid"])] = r
                self.res.rank_node[r] = mi["host"]
                self.res.rank_gpu.setdefault(r, mi["dev"])


def _scan_python(path: Path, ctx: _Ctx) -> None:
    res, year = ctx.res, ctx.year
    trigger = ctx.rules.trigger
    carry = b""
    line_base = 1
    last_t: float | None = None
    res.size = 0
    with open(path, "rb") as fh:
        ctx.fd = fh.fileno()
        while True:
            data = fh.read(CHUNK)
            res.size += len(data)
            if not data and not carry:
                break
            buf = carry + data
            buf_off = res.size - len(buf)  # file offset of buf[0]
            if data:
                cut = buf.rfind(b"\n") + 1
                if cut == 0:
                    if len(buf) < 4 * CHUNK:
                        carry = buf
                        continue
                    cut = len(buf)  # a huge line: cut it (its text is truncated for matching anyway)
                buf, carry = buf[:cut], buf[cut:]
            else:
                carry = b""
            pos_line = 0
            run_t: float | None = None
            cur_line = line_base
            last_line_start = -1
            for m in trigger.finditer(buf):
                s = buf.rfind(b"\n", 0, m.start()) + 1
                if s == last_line_start:
                    continue
                last_line_start = s
                e = buf.find(b"\n", m.end())
                e = len(buf) if e < 0 else e
                cur_line += buf.count(b"\n", pos_line, s)
                pos_line = s
                text, name = decode_named(buf[s:e])
                t = line_time(text, buf[s:s + 40], year)
                inherited = False
                if t is None:
                    t = last_time(buf, s - 1, year) if s > 0 else None
                    if t is None:
                        t = run_t if run_t is not None else last_t
                    inherited = t is not None
                if t is not None:
                    run_t = t
                ctx.line(text, cur_line, t, inherited, buf_off + s, e - s, name)
            if b"local_rank:" in buf:
                for sm in _SUMMARY.finditer(buf):
                    _summary(res, ctx.keep, sm, buf, line_base, ctx.display, ctx.order, year)
            lt = last_time(buf, len(buf) - 1, year, max_lines=8)
            if lt is not None:
                last_t = lt
                res.timed = True
            line_base += buf.count(b"\n")
            if not data:
                break
    res.lines = line_base - 1


def _scan_grep(path: Path, ctx: _Ctx) -> bool:
    """grep -F prefilter of one file; False if grep failed (the caller falls back to Python)."""
    cmd = [_GREP, "-F", "-n", "-b", "-a", "-f", ctx.rules.keywords_file(), "--", str(path)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=GREP_ENV) as proc:
        assert proc.stdout is not None
        _grep_lines(path, ctx, (h for h in map(grep_hit, proc.stdout) if h is not None))
        proc.wait()
        return proc.returncode in (0, 1)


def _grep_lines(path: Path, ctx: _Ctx, hits: Iterable[tuple[int, int, bytes]]) -> None:
    """Feed one file's grep hits to its context, then count its lines (for the tail's line numbers)."""
    res, year = ctx.res, ctx.year
    prev: tuple[int, float | None] = (-10**9, None)
    end = (0, 0)  # (line, offset of its newline) of the last hit: the lines before it need no recount
    with open(path, "rb") as fh:
        ctx.fd = fh.fileno()
        for line_no, off, body in hits:
            end = (line_no, off + len(body))
            text, name = decode_named(body)
            t = line_time(text, body, year)
            inherited = False
            if t is None:
                if line_no - prev[0] <= 2 and prev[1] is not None:
                    t = prev[1]  # consecutive matched lines (a traceback): same time
                else:
                    start = max(0, off - 16384)
                    fh.seek(start)
                    before = fh.read(off - start)
                    t = last_time(before, len(before) - 1, year) if before else None
                    if t is None:
                        t = prev[1]
                inherited = t is not None
            prev = (line_no, t)
            ctx.line(text, line_no, t, inherited, off, len(body), name)
            if b"local_rank:" in body and b"(local_rank:" in body:
                start = max(0, off - 400)
                fh.seek(start)
                window = fh.read(off - start + 400)
                for sm in _SUMMARY.finditer(window):
                    if off - start <= sm.start("rank") <= off - start + len(body):  # this line's entry only
                        base = line_no - window.count(b"\n", 0, off - start)
                        _summary(res, ctx.keep, sm, window, base, ctx.display, ctx.order, year)
        ctx.fd = -1
        # total lines (for the tail's line numbers): the last hit's line number plus the newlines after it
        res.size = os.fstat(fh.fileno()).st_size
        n, pos = (end[0], end[1] + 1) if end[0] else (0, 0)
        if pos > res.size:  # the last hit is the file's unterminated last line
            n, pos = n - 1, res.size
        fh.seek(pos)
        while True:
            b = fh.read(CHUNK)
            if not b:
                break
            n += b.count(b"\n")
    res.lines = n  # newlines, as the Python scan counts them (the tail's line numbers rest on it)
    res.timed = True


def _summary(res: FileScan, keep: _Keeper, sm: re.Match[bytes], buf: bytes, line_base: int, display: str,
             order: int, year: int) -> None:
    """A torchrun ChildFailedError summary entry: rank, host, pid, exit code (and which is the root cause)."""
    rank, pid, code = int(sm["rank"]), int(sm["pid"]), int(sm["code"])
    host = sm["host"].decode(errors="replace")
    res.pid_rank[pid] = rank
    res.rank_node.setdefault(rank, host)
    res.ranks.add(rank)
    line = line_base + buf.count(b"\n", 0, sm.start("code"))
    t = parse_time(sm["time"].decode(errors="replace").replace("_", " "), year)
    before = buf[max(0, sm.start() - 300):sm.start()]
    root = b"Root Cause" in before.split(b"[")[-2] if b"Root Cause" in before else False
    sig = {-9: "SIGKILL", -15: "SIGTERM", -6: "SIGABRT", -11: "SIGSEGV", -7: "SIGBUS", -2: "SIGINT"}.get(code)
    text = f"torchrun summary: rank {rank} on {host} exitcode {code} (pid {pid})" + (f" ({sig})" if sig else "")
    f = Finding(rule="torchrun_summary", role="exit", cls=None, file=display, line=line, text=text, t=t,
                rank=rank, node=host, pid=pid, priority=30, order=(order, line),
                fields={"exitcode": code, "root_cause": root, **({"signal": sig} if sig else {})})
    keep.add(f)


MAX_PROGRESS = 48  # progress samples kept per file (the last ones)


def _tail_progress(path: Path, res: FileScan, year: int, file_rank: int | None) -> None:
    """The last ``MAX_PROGRESS`` progress lines of the file (read backwards from its tail)."""
    with open(path, "rb") as fh:
        size = fh.seek(0, 2)
        start = max(0, size - TAIL_BYTES)
        fh.seek(start)
        tail = fh.read()
    if start:
        tail = tail[tail.find(b"\n") + 1:]
    lines = tail.split(b"\n")
    first_line = res.lines - tail.count(b"\n") + 1
    found: list[Progress] = []
    rank_seen = False
    for i in range(len(lines) - 1, -1, -1):
        raw = lines[i]
        if not raw or not (b"step" in raw or b"iter" in raw or b"Step" in raw or b"Iter" in raw or b"batch" in raw
                           or b"'loss'" in raw or b"%|" in raw):
            if not rank_seen and raw[:1] == b"[" and b"rank" in raw[:24]:
                r0 = line_rank(decode_line(raw[:64]))
                if r0 is not None:
                    res.ranks.add(r0)
                    rank_seen = True
            continue
        text = decode_line(raw)
        body = strip_prefixes(text)
        pm = _PROGRESS.search(body) or _HF_DICT.search(body)
        tq = _TQDM.search(body[-400:]) if pm is None else None  # a carriage-returned bar: its last state
        if pm is None and tq is None:
            continue
        if tq is not None:
            r = line_rank(text) if file_rank is None else file_rank
            found.append(Progress(t=line_time(text, raw, year), rank=r, step=int(tq["step"]), loss=None, step_time=None,
                                  tput=None, file=res.file, line=first_line + i))
            if len(found) >= MAX_PROGRESS:
                break
            continue
        # a record wrapped over the next physical lines (a terminal or a paste): join the continuations
        j, cont = i + 1, raw
        while j < len(lines) and j <= i + 2 and cont.rstrip()[-1:].isalnum():
            nxt = lines[j]
            if not (nxt[:1] in (b" ", b"\t") or nxt[:1].islower()) or _NEW_RECORD.match(nxt) \
                    or _PROGRESS.search(decode_line(nxt[:200])):
                break
            body += " " + decode_line(nxt).strip()
            cont = nxt
            j += 1
        lm = _LOSS.search(body)
        sm = _STEPTIME.search(body)
        tm = _TPUT.search(body)
        if not (lm or sm or tm):
            continue
        r = line_rank(text) if file_rank is None else file_rank
        if r is not None:
            res.ranks.add(r)
        st = None
        if sm:
            st = float(sm["v"]) / (1000.0 if (sm["u"] == "ms" or "(ms)" in sm.group(0)) else 1.0)
        gm = _GNORM.search(body)
        found.append(Progress(t=line_time(text, raw, year), rank=r, step=int(pm["step"]) if pm.re is _PROGRESS else
                              first_line + i,  # an HF Trainer dict has no step: its line orders it
                              loss=_float(lm["loss"]) if lm else None, step_time=st,
                              tput=float(tm["v"] or tm["tf"]) if tm else None, file=res.file, line=first_line + i,
                              gnorm=_float(gm["v"]) if gm else None,
                              epoch=_float(em["e"]) if (em := _EPOCH.search(body)) else None,
                              counted=pm.re is _PROGRESS))
        if len(found) >= MAX_PROGRESS:
            break
    found.reverse()
    last_t = None
    for p in found:  # untimed progress lines take the time of the previous timed one
        if p.t is None:
            p.t = last_t
        last_t = p.t
    res.progress.extend(found)
    if found:
        res.timed = res.timed or any(p.t is not None for p in found)
    last_prog = max((p.line for p in found), default=0)
    last = [(first_line + i, x) for i, x in enumerate(lines) if x.strip() and x.strip() not in (b"[...]", b"...")]
    for ln, raw in last[-3:]:  # how the file ends: an error no rule knows (after the last progress) is not silence
        if ln <= last_prog:
            continue
        text = decode_line(raw)
        if _ERRORISH.search(text):
            res.ending = (ln, text.strip()[:300])


def _float(s: str) -> float | None:
    try:
        return float(s)
    except ValueError:
        return None


def summary_dict(res: FileScan) -> dict[str, Any]:
    return {"file": res.file, "lines": res.lines, "bytes": res.size, "findings": len(res.findings),
            "problem": res.problem}
