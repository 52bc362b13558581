"""The last resort: no rule recognises any line, but the logs speak of a failure domain.

When no finding, no progress and no stack came out of the inputs, the error-looking lines
(``error``, ``failed``, ``exception``, ``timeout``, ``killed``…) are read for the vocabulary of
each fault domain — the fabric's (InfiniBand, RDMA, NIC, link, connection refused), the
communication library's (NCCL, gloo, collective), the launcher's (rendezvous, torchrun,
Slurm, MASTER_ADDR), the storage's, the GPU's, memory, numbers, stalls, and Python's own
exceptions. The domain with most such words is a *weak* diagnosis (confidence 0.2) with the
words that decided it in the reason; with no domain word at all the verdict stays "no
diagnosis". It is a reading of words, not of a documented message: the reasoning says so.

Cost: one read of each input file (≤ ``MAX_BYTES``), only when nothing else was found.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from titan.triage.identity import nccl_prefix, pdsh_host, syslog_host, ucx_host
from titan.triage.lineparse import line_rank, name_hints
from titan.triage.model import Finding

__all__ = ["lexical_finding", "LEXICON", "MAX_BYTES"]

MAX_BYTES = 2 << 20
_ERROR_WORD = re.compile(r"(?i)\b(?:error|errors|fail(?:ed|ure|s)?|exception|fatal|cannot|can't|unable)\b")
_LOGLIKE = re.compile(r"\b(?:INFO|WARN(?:ING)?|DEBUG|ERROR)\b|^\s*\[?\d{4}-\d\d-\d\d|^\[?[IWEF]\d{4} |%\||\bit/s\b")
_ERRORISH = re.compile(r"(?i)\b(?:error|errors|fail(?:ed|ure|s)?|exception|fatal|abort(?:ed|ing)?|killed|timed? ?out|"
                       r"timeout|cannot|can't|unable|refused|denied|lost|crash(?:ed)?|panic|traceback|hang(?:s|ing)?|"
                       r"stuck|segfault|corrupt(?:ed)?)\b")
#: class -> the words of its fault domain (most specific first; ties go to the earlier class)
LEXICON: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("gpu_hardware", re.compile(r"(?i)\b(?:Xid|ECC|NVLink|PCIe|NVRM|fallen off|row remap\w*|GPU (?:is )?(?:lost|fault\w*|"
                                r"fell|hung|reset)|nvidia-smi|thermal|throttl\w*)\b")),
    ("oom", re.compile(r"(?i)\b(?:out of memory|OOM\w*|oom-kill\w*|memory (?:exhausted|limit)|Cannot allocate memory|"
                       r"MemoryError|insufficient memory)\b")),
    ("network", re.compile(r"(?i)\b(?:infiniband|RDMA|RoCE|mlx\d\w*|HCA|NIC|ibv_\w+|link (?:down|flap\w*|error)|port "
                           r"(?:error|down|flap\w*)|packet loss|fabric|ethernet|unreachable|no route|connection (?:refused|"
                           r"reset|timed out|lost|closed)|network)\b")),
    ("storage", re.compile(r"(?i)\b(?:disk|filesystem|file system|I/O|read-only|quota|NFS|Lustre|GPFS|mount\w*|no space|"
                           r"write (?:error|failed)|EIO|ENOSPC|ESTALE|corrupt\w* (?:checkpoint|file|archive))\b")),
    ("numerical", re.compile(r"(?i)\b(?:nan|overflow|loss scale|diverg\w+|exploding|underflow|loss spike)\b")),
    ("comm_error", re.compile(r"(?i)\b(?:NCCL|RCCL|gloo|ProcessGroup\w*|communicator|c10d|collective)\b")),
    ("launcher", re.compile(r"(?i)\b(?:rendezvous|rdzv\w*|torchrun|elastic|slurm\w*|srun|sbatch|salloc|MASTER_ADDR|"
                            r"MASTER_PORT|WORLD_SIZE|address already in use|scheduler|preempt\w*|drain\w*)\b")),
    ("hang", re.compile(r"(?i)\b(?:hang(?:s|ing)?|hung|stuck|deadlock\w*|freez\w+|no progress|not responding|timed? ?out|"
                        r"timeout)\b")),
    ("user_code", re.compile(r"\b(?:[A-Z]\w*(?:Error|Exception)|Traceback|AssertionError|assert)\b")),
)
_ORDER = {c: i for i, (c, _) in enumerate(LEXICON)}


def lexical_finding(files: list[tuple[Path, str]], order_base: int = 0) -> Finding | None:
    """A weak finding from the words of the error-looking lines, or None. Never raises."""
    votes: Counter[str] = Counter()
    first: dict[str, tuple[int, str, int, str]] = {}
    words: dict[str, set[str]] = {}
    plain_error: tuple[int, str, int, str] | None = None  # an error line that names no domain
    loglike: tuple[int, str, int, str] | None = None  # the last line of a log with no error line at all
    for i, (path, display) in enumerate(files):
        try:
            if path.stat().st_size > MAX_BYTES:
                continue
            text = path.read_bytes().decode("utf-8", errors="replace")
        except OSError:
            continue
        for ln, line in enumerate(text.splitlines(), start=1):
            if line.strip() and _LOGLIKE.search(line):
                loglike = (i, display, ln, line.strip())
            if not _ERRORISH.search(line):
                continue
            hit = False
            for cls, rx in LEXICON:
                found = rx.findall(line[:2000])
                if found:
                    hit = True
                    votes[cls] += len(found)
                    words.setdefault(cls, set()).update(w.lower() for w in found[:3])
                    first.setdefault(cls, (i, display, ln, line.strip()))
            if not hit and plain_error is None and _ERROR_WORD.search(line):
                plain_error = (i, display, ln, line.strip())
    how = "words"
    if votes:
        cls = max(votes, key=lambda c: (votes[c], -_ORDER[c]))
        i, display, ln, line = first[cls]
    elif plain_error is not None:  # an error that names no infrastructure domain is, by base rate, the program's
        cls, how = "user_code", "plain_error"
        i, display, ln, line = plain_error
    elif loglike is not None:  # a log with no error line at all: its output stops
        cls, how = "hang", "no_error"
        i, display, ln, line = loglike
    else:
        return None
    nc = nccl_prefix(line)
    rank = line_rank(line)
    node = (nc[0] if nc else None) or syslog_host(line) or pdsh_host(line) or ucx_host(line) or name_hints(display)[1]
    return Finding(rule="lexical", role="cause", cls=cls, file=display, line=ln, text=line[:500], t=None,
                   rank=rank if rank is not None else name_hints(display)[0], node=node, priority=1,
                   order=(order_base + i, ln),
                   fields={"votes": dict(votes), "words": sorted(words.get(cls, set()))[:8], "how": how})
