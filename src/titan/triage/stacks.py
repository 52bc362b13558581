"""Stack dumps: who waits for whom.

Formats read: ``py-spy dump`` (``Thread N (active): "MainThread"`` + ``func (file:line)``
frames, native frames ``func (lib.so)``, decimal or hexadecimal thread ids, with or without
thread names; headers listed one after the other with the frames once, as people collapse
identical stacks, share those frames), Python ``faulthandler`` (``Thread 0x… (most recent call
first):`` + ``File "…", line N in func``; Titan's own ``stacks/*.stacks.txt`` are this format),
gdb's ``py-bt`` (``Traceback (most recent call first):`` + ``File "…", line N, in func`` — a
stack, not an exception; ``thread apply all`` headers name the thread) and the c10d
flight-recorder JSON (``structured``).

Whose stack it is: a pdsh/clush ``host: ``, srun ``-l`` or torchrun prefix on each line, a
``==> file <==`` section, a dshbak/clush ``-b`` block header, a ``rank N`` or host label line
between dumps, py-spy's ``Process N:`` and gdb's ``Attaching to process N``. A process's main
thread is the one py-spy names ``MainThread``, else the thread whose id is the process's, else
the one whose outermost frame is the script's ``<module>`` (so a dump whose threads carry other
names — PyTorch names its threads ``pt_main_thread``, ``pt_autograd_N`` for the OS — still has
its main thread).

Every process's main-thread stack is reduced to *what it is doing*: waiting in a
collective (which one), waiting for data (DataLoader, a queue), in file I/O, asleep, or
computing. Stacks are grouped across processes; when most processes wait in a collective
and one process does something else, that process is the one the others wait for (the odd
one out). When every process waits in a collective, the job stalled inside communication
(the same collective everywhere) or the ranks' collective sequences diverged (different
collectives). The verdict is a ``hang`` finding — also when the odd process sits in file I/O:
a stack shows where it is, not that the file system failed (that takes an error line or a
kernel hung-task trace in file-system code, which the text rules read).

Cost: only files whose text scan saw a stack header are parsed (one read, ≤ ``MAX_BYTES``).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from pathlib import Path

from titan.triage.identity import prompt_host
from titan.triage.model import Finding

__all__ = ["Proc", "parse_stacks", "analyse", "MAX_BYTES", "HEADER_RULE"]

MAX_BYTES = 16 << 20
#: the rule id the text scan gives a stack-dump header line (see rules.toml)
HEADER_RULE = "stack_dump_header"

_PYSPY_HDR = re.compile(r'^Thread (?P<tid>\d+|0x[0-9a-fA-F]+) \((?P<state>active|idle|gil)[^)]*\)(?:: "(?P<name>[^"]*)")?')
_PYSPY_FRAME = re.compile(r"^\s{2,}(?P<func>[^\s(][^(]*?) \((?P<file>[^():]+)(?::(?P<line>\d+))?\)\s*$")
_FH_HDR = re.compile(r"^(?P<cur>Current thread|Thread) (?P<tid>0x[0-9a-fA-F]+) \(most recent call first\):")
# faulthandler "  File "f", line N in func"; gdb py-bt (CPython Tools/gdb/libpython.py) "  File "f", line N, in func"
_FH_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+),? in (?P<func>\S+)')
# gdb's py-bt (libpython.py PyBacktrace): a Python stack, innermost first, not an exception
_PYBT_HDR = re.compile(r"^Traceback \(most recent call first\):")
# gdb's thread header ("thread apply all py-bt"): 'Thread 3 (Thread 0x7f… (LWP 4321) "python"):'; gdb attaching
_GDB_THREAD = re.compile(r"^Thread \d+ \(Thread 0x[0-9a-fA-F]+ \(LWP (?P<lwp>\d+)\)(?: \"(?P<name>[^\"]*)\")?\)")
_GDB_ATTACH = re.compile(r"^Attaching to (?:process|program: .*?, process) (?P<pid>\d+)")
_PROCESS = re.compile(r"^(?:Parent )?Process (?P<pid>\d+): ")
# who wrote a dump line, in front of it: pdsh/clush "host: " (the frame's indentation follows it), srun -l "N: " (the
# monitoring step's task: a separate process stream, not a training rank), torchrun "[rankN]:" / "[defaultN]:"
_LINE_PREFIX = re.compile(r"^(?:(?P<host>(?=[\w.-]*\d)(?=[\w.-]*[A-Za-z])[A-Za-z0-9][\w.-]*[A-Za-z0-9]): |"
                          r"(?P<task>\d{1,5}): |\[(?P<tag>rank|default)(?P<rank>\d+)\]:\s?)")
_NOT_HOST = re.compile(r"(?:Error|Exception|Warning|Info|Debug)$|^(?:line|step|iter|epoch|rank|frame)\d*$", re.I)
# labels people and tools put between dumps: dshbak / clush -b blocks ('----' / host / '----'), a rank or host line
_RULE_LINE = re.compile(r"^-{4,}\s*$")
_HOST_WORD = r"(?P<h>(?=[\w.\[\],-]*\d)(?=[\w.\[\],-]*[A-Za-z])[A-Za-z0-9][\w.\[\],-]*)"
_DSHBAK_HOST = re.compile(r"^" + _HOST_WORD + r"(?: \(\d+\))?\s*$")
_RANK_LABEL = re.compile(r"^[\W_]*(?:global\s+)?rank\s*[:=#]?\s*(?P<r>\d{1,6})(?:\s*\([^()]*\))?[\W_]*$", re.I)
_HOST_LABEL = re.compile(r"^[\W_]*(?:(?:host(?:name)?|node)\s*[:=]?\s*)?" + _HOST_WORD + r"\s*:?[\W_]*$", re.I)
_SECTION = re.compile(r"^==> (?P<name>\S(?:.*\S)?) <==\s*$")

_COLLECTIVES = {"all_reduce", "allreduce", "broadcast", "barrier", "all_gather", "allgather", "all_gather_into_tensor",
                "_all_gather_base", "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base", "reduce",
                "all_to_all", "all_to_all_single", "alltoall", "gather", "scatter", "recv", "send", "irecv", "isend",
                "monitored_barrier", "broadcast_object_list", "all_gather_object", "gather_object", "scatter_object_list"}
_NCCL_NATIVE = re.compile(r"^nccl(AllReduce|Broadcast|Bcast|AllGather|ReduceScatter|Reduce|AllToAll|Send|Recv|GroupEnd"
                          r"\w*|CommInitRank\w*)|^ncclEnqueueCheck|^ncclLaunchKernel")
_DATA = re.compile(r"torch/utils/data/|dataloader|_try_get_data|queue\.py$")
_IO = re.compile(r"serialization\.py|^(?:write|read|flush|fsync|save|_save|torch_save|write_record|copyfile|copy2)$")
_SLEEP = re.compile(r"^(?:sleep|time\.sleep)$")
# waiting for the GPU: a kernel that never finishes (often a stuck NCCL kernel) shows as a host-side sync
_GPU_WAIT = re.compile(r"^(?:synchronize|cudaStreamSynchronize|cudaDeviceSynchronize|cudaEventSynchronize|"
                       r"cuStreamSynchronize|cuEventSynchronize|item|_local_scalar_dense)$")


@dataclasses.dataclass
class Proc:
    """One process's main-thread stack (innermost frame first)."""

    ident: str
    file: str
    line: int
    frames: list[tuple[str, str]]
    state: str = ""
    pid: int | None = None
    #: the writer named in front of the dump's lines or by a label between dumps (pdsh "host: ", dshbak, "rank 3")
    host: str | None = None
    rank: int | None = None
    name: str | None = None  # the thread's name (py-spy), None when the format gives none
    kind: str = "pyspy"  # pyspy | faulthandler | pybt

    def activity(self) -> tuple[str, str]:
        """(kind, detail): kind is collective | data | io | gpu_wait | sleep | compute; detail the op or frame."""
        top = self.frames[:12]
        native: str | None = None
        for func, f in top:
            base = func.split(".")[-1]
            if base in _COLLECTIVES and ("distributed" in f or "c10d" in f or "deepspeed" in f):
                return "collective", base
            m = _NCCL_NATIVE.match(func)
            if m and m.group(1) and not m.group(1).startswith(("GroupEnd", "CommInit")):
                return "collective", "nccl" + m.group(1)
            native = native or (func if m else None)
        if native:
            return "collective", native
        for func, f in top[:8]:
            if _DATA.search(f) or _DATA.search(func):
                return "data", f"{func} ({f})"
        for func, f in top[:4]:
            if _IO.search(f) or _IO.match(func.split(".")[-1]):
                return "io", f"{func} ({f})"
        for func, f in top[:6]:
            if _GPU_WAIT.match(func.split(".")[-1]):
                return "gpu_wait", f"{func} ({f})"
        if top and _SLEEP.match(top[0][0]):
            return "sleep", f"{top[0][0]} ({top[0][1]})"
        return "compute", f"{top[0][0]} ({top[0][1]})" if top else "no frames"


@dataclasses.dataclass
class _Seg:
    """Where a dump line stands: the file section, the writer's host/rank and the process it belongs to."""

    section: str | None = None
    host: str | None = None
    rank: int | None = None
    task: str | None = None
    pid: int | None = None

    def key(self) -> tuple[object, ...]:
        return (self.section, self.host, self.rank, self.task, self.pid)


@dataclasses.dataclass
class _State:
    """One writer's reading state: its segment, the thread being read, a collapsed group's headers."""

    seg: _Seg
    cur: Proc | None = None
    pending: list[Proc] = dataclasses.field(default_factory=list)
    gdb_lwp: tuple[int, str | None] | None = None
    skip: int = 0

    def reset(self, seg: _Seg) -> None:
        self.seg, self.cur, self.pending, self.gdb_lwp = seg, None, [], None


def _split_prefix(raw: str) -> tuple[str | None, int | None, str | None, str]:
    """(host, rank, task label, body) of a dump line behind pdsh / srun -l / torchrun prefixes."""
    host = rank = task = None
    for _ in range(3):
        m = _LINE_PREFIX.match(raw)
        if not m:
            break
        if m["host"] is not None:
            if _NOT_HOST.search(m["host"]):
                break
            host = m["host"]
        elif m["task"] is not None:
            task = m["task"]
        elif m["tag"] == "rank":
            rank = int(m["rank"])
        raw = raw[m.end():]
    return host, rank, task, raw


def parse_stacks(path: Path, display: str) -> list[Proc]:
    """The main-thread stacks in one dump file (py-spy, faulthandler, gdb py-bt); [] if none.

    Lines are read as the scan reads them (``rawline``: CR, colours, ``grep -H`` and collector stamps off);
    a pdsh/clush ``host: ``, srun ``-l`` or torchrun prefix, a ``==> file <==`` section, a dshbak/clush block
    header or a ``rank N`` / host label line between dumps says whose the following stacks are. Each such
    writer, and each ``Process N:`` (py-spy) or ``Attaching to process N`` (gdb), is one process: its main
    thread is the one py-spy names ``MainThread``, else the thread whose id is the process id, else the one
    whose outermost frame is the script's ``<module>``.

    Cost: one read of the file (≤ ``MAX_BYTES``; larger files are not parsed).
    """
    from titan.triage.lineparse import name_hints
    from titan.triage.rawline import decode_named

    try:
        if path.stat().st_size > MAX_BYTES:
            return []
        lines = path.read_bytes().split(b"\n")
    except OSError:
        return []
    threads: list[tuple[tuple[object, ...], Proc]] = []
    states: dict[tuple[object, ...], _State] = {}  # per writer: pdsh/srun output of several hosts interleaves
    texts = [decode_named(b) for b in lines]
    for i, (text, gname) in enumerate(texts, start=1):
        host, rank, task, body = _split_prefix(text)
        if gname is not None:  # grep -H: the original file's name hints the writer
            r, h = name_hints(gname)
            host, rank = host or h, rank if rank is not None else r
        st = states.get((host, rank, task, gname))
        if st is None:
            st = states[(host, rank, task, gname)] = _State(_Seg(host=host, rank=rank, task=task))
        seg = st.seg
        stripped = body.strip()
        m = _SECTION.match(body)
        if m:
            r, h = name_hints(m["name"])
            st.reset(_Seg(section=m["name"], host=h or host, rank=r if r is not None else rank, task=task))
            continue
        if _RULE_LINE.match(body) and i + 1 < len(texts) and _RULE_LINE.match(texts[i + 1][0]):
            m = _DSHBAK_HOST.match(texts[i][0].strip())  # dshbak / clush -b: '----' / host / '----'
            if m:
                st.reset(dataclasses.replace(seg, host=m["h"], rank=None, pid=None))
                st.skip = 2
                continue
        if st.skip:
            st.skip -= 1
            continue
        m = _PROCESS.match(stripped) or _GDB_ATTACH.match(stripped)
        if m:
            st.reset(dataclasses.replace(seg, pid=int(m["pid"])))
            continue
        m = _GDB_THREAD.match(stripped)
        if m:
            st.cur, st.pending, st.gdb_lwp = None, [], (int(m["lwp"]), m["name"])
            continue
        m = _FH_HDR.match(stripped)
        if m:
            st.cur = Proc(ident=m["tid"], file=display, line=i, frames=[], pid=seg.pid, host=seg.host, rank=seg.rank,
                          state="current" if m["cur"] != "Thread" else "", kind="faulthandler")
            threads.append((seg.key(), st.cur))
            st.pending = []
            continue
        if _PYBT_HDR.match(stripped):  # gdb py-bt: the thread gdb names, else the process's selected (main) thread
            lwp, name = st.gdb_lwp if st.gdb_lwp else (seg.pid, None)
            st.cur = Proc(ident=str(lwp) if lwp is not None else "py-bt", file=display, line=i, frames=[], pid=seg.pid,
                          host=seg.host, rank=seg.rank, name=name, kind="pybt")
            threads.append((seg.key(), st.cur))
            st.pending, st.gdb_lwp = [], None
            continue
        m = _PYSPY_HDR.match(stripped)
        if m:
            cur = Proc(ident=m["tid"], file=display, line=i, frames=[], state=m["state"], pid=seg.pid, host=seg.host,
                       rank=seg.rank, name=m["name"])
            if not (st.pending and not st.pending[-1].frames and st.pending[-1].name == cur.name):
                st.pending = []
            st.pending.append(cur)
            st.cur = cur
            threads.append((seg.key(), cur))
            continue
        fm = _PYSPY_FRAME.match(body) or _FH_FRAME.match(body)
        if fm and st.cur is not None:
            frame = (fm["func"].strip(), fm["file"])
            for p in (st.pending if st.cur in st.pending else [st.cur]):  # a collapsed group: each listed has it
                p.frames.append(frame)
            continue
        if stripped == "[...]":
            st.pending = [st.cur] if st.cur is not None else []
            continue
        if fm or not stripped or len(stripped) > 80 or (st.cur is not None and not st.cur.frames):
            continue
        h = prompt_host(stripped) if ("$ " in stripped or "# " in stripped) else None
        if h is not None:  # a pasted shell prompt (ssh to a node, then py-spy there): that host's stacks follow
            st.reset(dataclasses.replace(seg, host=h, rank=None, pid=None))
            continue
        m = _RANK_LABEL.match(stripped)
        if m:
            st.reset(dataclasses.replace(seg, rank=int(m["r"]), pid=None))
            continue
        m = _HOST_LABEL.match(stripped)
        if m and not _NOT_HOST.search(m["h"]):
            st.reset(dataclasses.replace(seg, host=m["h"], rank=None, pid=None))
    return _mains(threads)


def _mains(threads: list[tuple[tuple[object, ...], Proc]]) -> list[Proc]:
    """Each process's main thread, in file order."""
    by_seg: dict[tuple[object, ...], list[Proc]] = {}
    for key, t in threads:
        if t.frames:
            by_seg.setdefault(key, []).append(t)
    keep: list[Proc] = []
    for key, ts in by_seg.items():
        pid = key[-1]
        spy = [t for t in ts if t.kind == "pyspy"]
        named = [t for t in spy if t.name in (None, "MainThread")]
        if named:  # py-spy: each MainThread listed is a process (several with no Process header between them)
            keep += named
        elif spy:
            own = [t for t in spy if pid is not None and t.ident == str(pid)]
            mod = [t for t in spy if t.frames[-1][0] == "<module>"]
            keep += (own or mod)[:1]
        other = [t for t in ts if t.kind != "pyspy"]
        if other:  # faulthandler / py-bt: the thread running the script; of repeated dumps the last
            mains = [t for t in other if t.frames[-1][0] == "<module>"] or other[-1:]
            keep.append(mains[-1])
    return sorted(keep, key=lambda p: p.line)


def analyse(procs: list[Proc], order: int, file_rank: dict[str, int | None],
            file_host: dict[str, str | None], pid_rank: dict[int, int]) -> list[Finding]:
    """Findings from the stacks of all dumps: the odd one out, or a stall inside communication."""
    if not procs:
        return []
    acts = [(p, *p.activity()) for p in procs]
    coll = [a for a in acts if a[1] == "collective"]
    if not coll:
        # nobody waits in a collective: a dump taken of a stuck job still shows where it sits
        kinds = Counter(a[1] for a in acts)
        kind, _ = kinds.most_common(1)[0]
        if kind == "compute":
            return []
        p, _, detail = next(a for a in acts if a[1] == kind)
        return [Finding(rule="stack_dump", role="cause", cls="hang", file=p.file,
                        line=p.line, text=f"stack dumps: {kinds[kind]} of {len(acts)} processes sit in {kind}: {detail}",
                        t=None, rank=p.rank if p.rank is not None else file_rank.get(p.file),
                        node=p.host or file_host.get(p.file), priority=30,
                        order=(order, p.line), fields={"kind": kind, "detail": detail, "processes": len(acts)})]
    others = [a for a in acts if a[1] != "collective"]
    ops = Counter(a[2] for a in coll)

    def rank_of(p: Proc) -> int | None:
        if p.rank is not None:
            return p.rank
        pid = p.pid if p.pid is not None else (int(p.ident) if p.ident.isdigit() else None)
        if pid is not None and pid in pid_rank:
            return pid_rank[pid]
        return file_rank.get(p.file)

    def finding(p: Proc, text: str, cls: str, prio: int, fields: dict[str, object]) -> Finding:
        return Finding(rule="stack_dump", role="cause", cls=cls, file=p.file, line=p.line, text=text, t=None,
                       rank=rank_of(p), node=p.host or file_host.get(p.file),
                       pid=p.pid if p.pid is not None else int(p.ident) if p.ident.isdigit() else None,
                       priority=prio, order=(order, p.line), fields=fields)

    n = len(acts)
    waiting = ", ".join(f"{k} ×{v}" for k, v in ops.most_common())
    if others and len(others) <= max(1, n // 4) and len(coll) >= len(others):
        p, kind, detail = others[0]
        cls = "hang"  # only a stack shows it: a stall (file I/O included), no error line names a fault
        return [finding(p, f"stack dumps: {len(coll)} of {n} processes wait in a collective ({waiting}); process "
                           f"{p.ident}{' on ' + p.host if p.host else ''} is in {kind}: {detail} — the others wait for it", cls, 46,
                        {"kind": kind, "detail": detail, "odd": len(others), "processes": n, "waiting": dict(ops)})]
    p = coll[0][0]
    if len(ops) == 1:
        op = next(iter(ops))
        return [finding(p, f"stack dumps: all {len(coll)} processes in a collective wait in {op}"
                           + (f" ({len(others)} more elsewhere)" if others else "")
                           + ": the job stalled inside communication", "hang", 34,
                        {"kind": "collective", "detail": op, "processes": n, "waiting": dict(ops)})]
    return [finding(p, f"stack dumps: processes wait in different collectives ({waiting}): their collective "
                       f"sequences diverged", "hang", 38,
                    {"kind": "mismatch", "detail": waiting, "processes": n, "waiting": dict(ops)})]
