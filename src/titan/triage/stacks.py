"""Stack dumps: who waits for whom.

Formats read: ``py-spy dump`` (``Thread N (active): "MainThread"`` + ``func (file:line)``
frames, native frames ``func (lib.so)``; headers listed one after the other with the frames
once, as people collapse identical stacks, share those frames), Python ``faulthandler``
(``Thread 0x… (most recent call first):`` + ``File "…", line N in func``; Titan's own
``stacks/*.stacks.txt`` are this format) and the c10d flight-recorder JSON (``structured``).

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

from titan.triage.model import Finding

__all__ = ["Proc", "parse_stacks", "analyse", "MAX_BYTES", "HEADER_RULE"]

MAX_BYTES = 16 << 20
#: the rule id the text scan gives a stack-dump header line (see rules.toml)
HEADER_RULE = "stack_dump_header"

_PYSPY_HDR = re.compile(r'Thread (?P<tid>\d+|0x[0-9a-fA-F]+) \((?P<state>active|idle)[^)]*\)(?:: "(?P<name>[^"]*)")?')
_PYSPY_FRAME = re.compile(r"^\s{2,}(?P<func>[^\s(][^(]*?) \((?P<file>[^():]+)(?::(?P<line>\d+))?\)\s*$")
_FH_HDR = re.compile(r"^(?P<cur>Current thread|Thread) (?P<tid>0x[0-9a-fA-F]+) \(most recent call first\):")
_FH_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_PROCESS = re.compile(r"^Process (?P<pid>\d+): ")

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


def parse_stacks(path: Path, display: str) -> list[Proc]:
    """The main-thread stacks in one dump file (py-spy or faulthandler); [] if none.

    Cost: one read of the file (≤ ``MAX_BYTES``; larger files are not parsed).
    """
    try:
        if path.stat().st_size > MAX_BYTES:
            return []
        lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return []
    procs: list[Proc] = []
    pending: list[Proc] = []  # py-spy headers without frames yet (a collapsed group shares the next frames)
    cur: Proc | None = None
    fh_threads: list[Proc] = []
    pid: int | None = None
    for i, raw in enumerate(lines, start=1):
        m = _PROCESS.match(raw)
        if m:
            pid = int(m["pid"])
            continue
        m = _FH_HDR.match(raw)
        if m:
            cur = Proc(ident=m["tid"], file=display, line=i, frames=[], state="current" if m["cur"] != "Thread" else "")
            fh_threads.append(cur)
            continue
        m = _PYSPY_HDR.search(raw)
        if m and raw.lstrip().startswith("Thread"):
            main = m["name"] in (None, "MainThread")
            cur = Proc(ident=m["tid"], file=display, line=i, frames=[], state=m["state"], pid=pid) if main else None
            if cur is not None:
                if pending and pending[-1].frames:
                    pending = []
                pending.append(cur)
                procs.append(cur)
            else:
                pending = []
            continue
        fm = _PYSPY_FRAME.match(raw) or _FH_FRAME.match(raw)
        if fm and cur is not None:
            frame = (fm["func"].strip(), fm["file"])
            for p in (pending if cur in pending else [cur]):  # a collapsed group: every listed process has it
                p.frames.append(frame)
        elif raw.strip() == "[...]":
            pending = [cur] if cur is not None else []
    if fh_threads:  # faulthandler: the thread whose outermost frame is <module> is the main one; last dump wins
        mains = [t for t in fh_threads if t.frames and t.frames[-1][0] == "<module>"] or fh_threads[-1:]
        procs.append(mains[-1])
    return [p for p in procs if p.frames]


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
                        t=None, rank=file_rank.get(p.file), node=file_host.get(p.file), priority=30,
                        order=(order, p.line), fields={"kind": kind, "detail": detail, "processes": len(acts)})]
    others = [a for a in acts if a[1] != "collective"]
    ops = Counter(a[2] for a in coll)

    def rank_of(p: Proc) -> int | None:
        pid = p.pid if p.pid is not None else (int(p.ident) if p.ident.isdigit() else None)
        if pid is not None and pid in pid_rank:
            return pid_rank[pid]
        return file_rank.get(p.file)

    def finding(p: Proc, text: str, cls: str, prio: int, fields: dict[str, object]) -> Finding:
        return Finding(rule="stack_dump", role="cause", cls=cls, file=p.file, line=p.line, text=text, t=None,
                       rank=rank_of(p), node=file_host.get(p.file), pid=int(p.ident) if p.ident.isdigit() else None,
                       priority=prio, order=(order, p.line), fields=fields)

    n = len(acts)
    waiting = ", ".join(f"{k} ×{v}" for k, v in ops.most_common())
    if others and len(others) <= max(1, n // 4) and len(coll) >= len(others):
        p, kind, detail = others[0]
        cls = "hang"  # only a stack shows it: a stall (file I/O included), no error line names a fault
        return [finding(p, f"stack dumps: {len(coll)} of {n} processes wait in a collective ({waiting}); process "
                           f"{p.ident} is in {kind}: {detail} — the others wait for it", cls, 46,
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
