"""Who wrote a line: rank, host, pid and device from the prefixes of foreign formats.

Logs pasted from real jobs carry identity in many shapes, often stacked: ``grep -H``'s
``file.log:``, pdsh/clush ``host: ``, a bracketed timestamp, Ray's ``(Actor pid=N)``,
torchrun's ``[default3]:`` (local rank) and ``[rank3]:`` (global rank), srun ``-l``'s
``3: ``, NCCL's ``host:pid:tid [cudaDev]``, the kernel's syslog header
``Mon DD HH:MM:SS host kernel:``, Slurm's ``srun: error: host: task N``, ``kubectl logs
--prefix``'s ``[pod/NAME/CONTAINER]``, Ray's ``(… pid=N, ip=A.B.C.D)``, Lightning's
``[rank: 3]`` and Accelerate's ``[RANK 3]``. The NCCL and
syslog forms are searched in the first part of the line, not only at its start, so that
any stack of launcher prefixes in front of them does not hide them.

Cost: a few regex searches over the first ``HEAD`` characters of a line that a rule
already matched (never run on every line of a file).
"""

from __future__ import annotations

import re

__all__ = ["HEAD", "nccl_prefix", "syslog_host", "global_rank", "rank_claim", "pdsh_host", "prefix_host",
           "ray_task_host", "ucx_host", "prompt_host", "PROMPT_KEYWORDS"]

#: how far into a line the prefixes are searched
HEAD = 240

# NCCL's debug prefix: "%s:%d:%d [%d] " = hostname:pid:tid [cudaDev] (src/debug.cc); the
# hostname must contain a letter (so "12:54:22 [x]" clock times are not taken for it)
_NCCL = re.compile(r"(?:^|(?<=[\s\]:>)]))(?P<host>(?=[\w.-]*[A-Za-z])[A-Za-z0-9][\w.-]*):(?P<pid>\d+):(?P<tid>\d+) "
                   r"\[(?P<dev>\d+)\] ")
# syslog / journalctl header: "Nov 30 13:25:57 host kernel:" or an ISO stamp before the host
_SYSLOG = re.compile(r"(?:^|(?<=[\s\]:>]))(?:[A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d(?:\.\d+)?|20\d\d-\d\d-\d\dT\S+) "
                     r"(?P<host>[A-Za-z0-9][\w.-]*) (?:kernel|slurmstepd|slurmd|nvidia-\w+|\w+\[\d+\]):")
# pdsh/clush (DeepSpeed's multi-node launcher) "host: " — a hostname or IP with a digit in it, never a
# bare number (srun -l's "3: " is a rank) nor a Python exception/log-level word
_PDSH = re.compile(r"^(?P<host>(?=[\w.-]*\d)(?=[\w.-]*[A-Za-z.])[A-Za-z0-9][\w.-]*[A-Za-z0-9]): (?=\S)")
_NOT_HOST = re.compile(r"(?:Error|Exception|Warning|Info|Debug)$|^(?:line|step|iter|epoch|rank|frame)\d*$", re.I)
# kubectl logs --prefix: "[pod/NAME/CONTAINER] "; Ray's worker prefix "(RayTrainWorker pid=2211, ip=10.0.0.4) "
_KUBECTL = re.compile(r"^\[pod/(?P<host>[a-z0-9][a-z0-9.-]*)/[\w.-]+\] ")
_RAY = re.compile(r"^\s*\((?:[\w.]+ )?pid=\d+, ip=(?P<host>[\d.]+|[\w.-]+)\) ")
# Ray's remote-error header "RayTaskError(X): ray::Cls.method() (pid=N, ip=A.B.C.D, …)": the worker's node
_RAY_TASK = re.compile(r"ray::[\w.<>]+\(\) \(pid=\d+, ip=(?P<host>\d{1,3}(?:\.\d{1,3}){3})[,)]")
# UCX's log and error-handler prefix "[%s:%-5d:%d:%d] " = hostname:pid:thread index:tid (ucs/debug/log.c; its
# signal handler's "Caught signal" and backtrace lines carry it too, e.g. "[node7:3039 :0:3095]")
_UCX = re.compile(r"\[(?P<host>(?=[\w.-]*[A-Za-z])[A-Za-z0-9][\w.-]*):(?P<pid>\d+) *:\d+:\d+\] ")
# torchrun --tee / --local-ranks-filter global-rank prefix "[rank3]:" (wherever other prefixes put it)
_GLOBAL = re.compile(r"\[rank(?P<r>\d{1,6})\]:")
# a process announcing its rank in the world: Lightning "initializing ddp: GLOBAL_RANK: 1, MEMBER: 2/8",
# NCCL "Init COMPLETE" lines "rank 3 nranks 8"
_CLAIM = re.compile(r"GLOBAL_RANK: (?P<r>\d+), MEMBER: \d+/(?P<w>\d+)|\brank (?P<r2>\d+) nranks (?P<w2>\d+)\b")


def nccl_prefix(text: str) -> tuple[str, int, str] | None:
    """(host, pid, cuda device) of NCCL's ``host:pid:tid [dev]`` prefix, wherever it sits in the line head."""
    m = _NCCL.search(text[:HEAD])
    return (m["host"], int(m["pid"]), m["dev"]) if m else None


def syslog_host(text: str) -> str | None:
    """The host field of a syslog/journalctl header anywhere in the line head (a relayed kernel line too)."""
    m = _SYSLOG.search(text[:HEAD])
    return m["host"] if m else None


def global_rank(text: str) -> int | None:
    """The global rank of torchrun's ``[rankN]:`` prefix; it beats a process-group-local ``Rank N`` in the text."""
    m = _GLOBAL.search(text[:HEAD])
    return int(m["r"]) if m else None


def rank_claim(text: str) -> tuple[int, int] | None:
    """(rank, world size) a process announces at start-up, or None."""
    m = _CLAIM.search(text)
    if not m:
        return None
    return (int(m["r"]), int(m["w"])) if m["r"] is not None else (int(m["r2"]), int(m["w2"]))


def pdsh_host(text: str) -> str | None:
    """The host of a pdsh/clush ``host: `` line prefix (DeepSpeed multi-node output), or None."""
    m = _PDSH.match(text)
    if not m or _NOT_HOST.search(m["host"]):
        return None
    return m["host"]


def ucx_host(text: str) -> str | None:
    """The host of UCX's ``[host:pid:thread:tid]`` prefix anywhere in the line head, or None."""
    m = _UCX.search(text[:HEAD]) if ":" in text[:HEAD] else None
    return m["host"] if m else None


def prefix_host(text: str) -> str | None:
    """The host (pod name, Ray worker IP) of a ``kubectl logs --prefix`` or Ray line prefix, or None."""
    m = _KUBECTL.match(text) or _RAY.match(text)
    return m["host"] if m else ray_task_host(text)


def ray_task_host(text: str) -> str | None:
    """The worker's IP in Ray's remote-error header (``RayTaskError(X): ray::f() (pid=N, ip=A)``), or None."""
    m = _RAY_TASK.search(text[:HEAD]) if "ray::" in text[:HEAD] else None
    return m["host"] if m else None


# a shell prompt pasted with the command's output: bash's default PS1 on Debian/Ubuntu '\u@\h:\w\$ ' ("user@host:~/dir$ cmd",
# root's ends in '#'), on RHEL/Fedora '[\u@\h \W]\$ ' ("[user@host dir]$ cmd"), behind a virtualenv/conda "(env) "
_PROMPT = re.compile(r"^(?:\([\w.-]+\) ?)?(?:[a-z_][\w.-]*@(?P<h1>[A-Za-z0-9][\w.-]*):[^\s$#]*|"
                     r"\[[a-z_][\w.-]*@(?P<h2>[A-Za-z0-9][\w.-]*) [^\]]*\])[$#] ")
#: literal strings every such prompt line contains (for the scanner's keyword prefilter)
PROMPT_KEYWORDS = ("$ ", "root@")


def prompt_host(text: str) -> str | None:
    """The host of a shell prompt at the start of a pasted line (what follows is that host's output), or None."""
    m = _PROMPT.match(text)
    return (m["h1"] or m["h2"]) if m else None
