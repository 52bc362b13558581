"""Step 1 of the method: what the lines alone do not say, derived before anything is decided.

The scans of every file are merged; identity is filled in where a line lacks it (the traceback
printed inside a torchrun summary entry is that entry's rank's, a pid or a GPU index names its
rank); ranks announced twice are a finding of their own; benign warnings that life followed are
dropped; stack dumps across processes are grouped (``titan.triage.stacks``). Pure functions over
findings; no I/O.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable

from titan.triage.identity import ray_task_host
from titan.triage.model import Finding
from titan.triage.scan import FileScan, Progress
from titan.triage.stacks import analyse

__all__ = ["merge", "fill_identity", "rank_claims", "drop_superseded", "stack_findings", "time_order",
           "SUMMARY_BLOCK_LINES"]


def merge(scans: Iterable[FileScan]) -> tuple[list[Finding], list[Progress], set[int], dict[int, int],
                                               dict[int, str], dict[int, str]]:
    """Every file's findings, progress and identity maps as one: (findings, progress, ranks,
    pid → rank, rank → node, rank → GPU); the first file that names a rank's node or GPU wins."""
    findings: list[Finding] = []
    progress: list[Progress] = []
    ranks: set[int] = set()
    pid_rank: dict[int, int] = {}
    rank_node: dict[int, str] = {}
    rank_gpu: dict[int, str] = {}
    for s in scans:
        findings.extend(s.findings)
        progress.extend(s.progress)
        ranks |= s.ranks
        pid_rank.update(s.pid_rank)
        for r, n in s.rank_node.items():
            rank_node.setdefault(r, n)
        for r, g in s.rank_gpu.items():
            rank_gpu.setdefault(r, g)
    return findings, progress, ranks, pid_rank, rank_node, rank_gpu


#: lines of a torchrun failure-summary entry (its error file's traceback) follow the entry's header this closely
SUMMARY_BLOCK_LINES = 60
#: exit records whose following lines are the failed process's own traceback (torchrun's summary entry, mp.spawn's
#: "-- Process N terminated with the following error:", Ray's "RayTaskError(…): ray::f() (pid=N, ip=A)")
_ENTRY_RULES = ("torchrun_summary", "mp_spawn_failed", "ray_task_error")


def fill_identity(findings: list[Finding], pid_rank: dict[int, int], rank_node: dict[int, str],
          rank_gpu: dict[int, str]) -> None:
    """Give rank, node and GPU (in place) to findings whose own line does not name them."""
    single_node = len(set(rank_node.values())) <= 1
    entries = sorted((f for f in findings if (f.rule in _ENTRY_RULES and (f.rank is not None or f.node))
                      or (f.node and ray_task_host(f.text) == f.node)), key=lambda f: (f.file, f.line))
    for i, e in enumerate(entries):  # the traceback printed inside a summary entry is that entry's rank's
        nxt = entries[i + 1].line if i + 1 < len(entries) and entries[i + 1].file == e.file else e.line + \
            SUMMARY_BLOCK_LINES
        for f in findings:
            if f.file != e.file or not e.line < f.line < min(nxt, e.line + SUMMARY_BLOCK_LINES):
                continue
            if e.rank is not None and f.rank is None:
                f.rank = e.rank
                f.node = f.node or e.node
            elif e.rank is None and f.rank is None and f.node is None:  # a Ray worker's traceback: its node
                f.node = e.node
    failed = {f.rank for f in findings if f.rule == "torchrun_summary"}
    if len(failed) == 1:  # one process failed: the rank-less error its console printed before the summary is its
        e = min((f for f in findings if f.rule == "torchrun_summary"), key=lambda f: (f.file, f.line))
        for f in findings:
            if f.role == "cause" and f.rank is None and f.file == e.file and f.line < e.line and \
                    f.node in (None, e.node):
                f.rank, f.node = e.rank, e.node
                f.fields["rank_from_summary"] = True
    for f in findings:  # torchrun's own exit lines name local rank and pid
        if f.rule == "torchrun_failed" and single_node and f.pid is not None and "local_rank" in f.fields:
            pid_rank.setdefault(f.pid, int(f.fields["local_rank"]))
    for f in findings:
        if f.rank is None and f.pid is not None and f.pid in pid_rank:
            f.rank = pid_rank[f.pid]
        if f.rank is None and f.rule == "torchrun_failed" and single_node and "local_rank" in f.fields:
            f.rank = int(f.fields["local_rank"])
        if f.node is None and f.rank is not None:
            f.node = rank_node.get(f.rank)
        if f.gpu is None and f.rank is not None and f.cls in ("gpu_hardware", "oom"):
            f.gpu = rank_gpu.get(f.rank)
    nodes = {f.node for f in findings if f.node} | set(rank_node.values())
    for f in findings:  # one node, launched the usual way (cuda:LOCAL_RANK): the GPU index is the rank
        if f.rank is None and f.cls in ("oom", "gpu_hardware") and f.gpu and f.gpu.isdigit() and len(nodes) <= 1 \
                and f.role == "cause":
            f.rank = int(f.gpu)
            f.fields["rank_from_gpu"] = True


def time_order(f: Finding) -> tuple[float, int, int]:
    """Sort key: time (untimed last), then file order and line."""
    return (f.t if f.t is not None else float("inf"), f.order[0], f.order[1])


def rank_claims(findings: list[Finding]) -> list[Finding]:
    """Ranks announced twice while others never appear: the scheduler started the wrong processes."""
    claims = [f for f in findings if "claim" in f.fields]
    if not claims:
        return []
    count = Counter(int(f.fields["claim"][0]) for f in claims)
    world = max(int(f.fields["claim"][1]) for f in claims)
    missing = [r for r in range(world) if r not in count]
    if not missing or max(count.values()) < 2 or len(missing) > world:
        return []
    seen: set[int] = set()
    first_dup = None
    for f in sorted(claims, key=time_order):
        r = int(f.fields["claim"][0])
        if r in seen:
            first_dup = f
            break
        seen.add(r)
    if first_dup is None:
        return []
    dup = sorted(r for r, c in count.items() if c >= 2)
    return [Finding(rule="rank_claims", role="cause", cls="launcher", file=first_dup.file, line=first_dup.line,
                    text=f"ranks {dup} announced more than once and ranks {missing[:8]}"
                         f"{'…' if len(missing) > 8 else ''} of a world of {world} never: the processes started do "
                         f"not match the world size the job was told", t=first_dup.t, priority=45,
                    action="fix_code_or_config", order=first_dup.order, fields={"world": world, "missing": missing})]


def drop_superseded(findings: list[Finding], progress: list[Progress]) -> list[Finding]:
    """A warning that is benign when the job runs on: dropped when life follows it.

    Life is progress, a lifecycle line (init complete, a rank announcing itself) or a stack dump
    later in the same file, or — when both are timed — later anywhere. For a launcher warning
    (a c10d connect retry while the store comes up) a collective timeout is life too: the process
    group was formed, so the store was reached.
    """
    marked = [f for f in findings if f.fields.get("_superseded_by_life")]
    if not marked:
        return findings
    life: dict[str, int] = {}
    life_t: list[float] = []
    comm_t: list[float] = []
    comm_line: dict[str, int] = {}
    for f in findings:
        if f.role == "lifecycle" or f.rule == "stack_dump":
            life[f.file] = max(life.get(f.file, 0), f.line)
            if f.t is not None and not f.t_inherited:
                life_t.append(f.t)
        elif f.role == "timeout":
            comm_line[f.file] = max(comm_line.get(f.file, 0), f.line)
            if f.t is not None:
                comm_t.append(f.t)
    for p in progress:
        life[p.file] = max(life.get(p.file, 0), p.line)
        if p.t is not None:
            life_t.append(p.t)

    def superseded(f: Finding) -> bool:
        if life.get(f.file, 0) > f.line:
            return True
        if f.t is not None and any(t > f.t for t in life_t):
            return True
        if f.cls == "launcher" and (comm_line.get(f.file, 0) > f.line or
                                    (f.t is not None and any(t > f.t for t in comm_t))):
            return True
        return False

    drop = {id(f) for f in marked if superseded(f)}
    return [f for f in findings if id(f) not in drop]


def stack_findings(scans: list[FileScan], pid_rank: dict[int, int]) -> list[Finding]:
    """Findings from the stack dumps of every file, grouped across processes (the odd one out)."""
    procs = [p for s in scans for p in s.stacks]
    if not procs:
        return []
    from titan.triage.lineparse import name_hints

    file_rank = {p.file: name_hints(p.file)[0] for p in procs}
    file_host = {p.file: name_hints(p.file)[1] for p in procs}
    return analyse(procs, 10**6 + 1, file_rank, file_host, pid_rank)
