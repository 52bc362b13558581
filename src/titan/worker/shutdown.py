"""Let torch's collective threads finish before the interpreter finalizes.

Why (a core dump, 2026-12-05): a worker that had trained to its last step and returned 0
died with SIGABRT ("terminate called without an active exception") — 1 of 19 launches of
`tests/ledger/test_ledger_in_runs.py`'s command in a loop here, and CI's all-corrupt-checkpoint run;
`titan run` then saw a failed worker and a node strike. The stack: a gloo ``pt_gloo_runloop``
thread destroying a finished all-reduce (``AsyncAllreduceWork::~AsyncAllreduceWork``) drops
the last reference to a tensor whose Python object C++ owns (the script had already let go of
it), so it takes the GIL to decref it; the main thread was already in ``Py_FinalizeEx``, where
a thread that takes the GIL is ended with ``pthread_exit`` — a forced unwind through a
``noexcept`` destructor, hence ``std::terminate``. Any collective on a short-lived tensor can
leave such a decref pending (Titan's own step vector, a user's loss all-reduce), and the
process group outlives ``destroy_process_group()`` while a DDP module still references it.

:func:`drain_collective_threads` (registered at exit by ``WorkerContext.wire``) runs before
finalization begins (``atexit``) and, while torch's collective threads are alive, gives up the
GIL until they are quiet (no context switch for 30 ms), so each can finish what it holds. Cost:
nothing when no such thread exists (a ``/proc`` read); otherwise 0.05–2 s, once, at the end of
the process; nothing on the fault boundary's ``os._exit`` path (:func:`skip_drain`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["collective_threads", "drain_collective_threads", "skip_drain"]

_skip = False


def skip_drain() -> None:
    """The process ends with ``os._exit`` (no finalization, nothing to race): do not wait —
    a failing worker's exit is what the launcher detects, and RTO counts from it."""
    global _skip
    _skip = True


#: Thread names of torch's collective backends (``/proc/self/task/*/comm``): gloo's work
#: loops and NCCL's watchdog/heartbeat threads.
_PREFIXES = ("pt_gloo_runloop", "pt_nccl")


def _threads() -> dict[str, int]:
    """torch's collective threads now: task id → context switches so far (voluntary and not)."""
    out: dict[str, int] = {}
    try:
        tasks = list(Path(f"/proc/{os.getpid()}/task").iterdir())
    except OSError:
        return out
    for t in tasks:
        try:
            if not (t / "comm").read_text().strip().startswith(_PREFIXES):
                continue
            status = (t / "status").read_text()
        except OSError:
            continue
        out[t.name] = sum(int(ln.split()[1]) for ln in status.splitlines() if "ctxt_switches:" in ln)
    return out


def collective_threads() -> int:
    """How many of torch's collective threads this process has now (0 if unknown)."""
    return len(_threads())


def drain_collective_threads(min_s: float = 0.05, max_s: float = 2.0, quiet: int = 3) -> bool:
    """If collective threads are alive, release the GIL until they are quiet — no context
    switch in ``quiet`` 10 ms slices in a row (an idle work loop sleeps on its condition
    variable; one finishing a work wakes, takes the GIL, decrefs) — at least ``min_s``, at
    most ``max_s``; returns whether it waited."""
    if _skip:
        return False
    last = _threads()
    if not last:
        return False
    t0 = time.monotonic()
    still = 0
    while time.monotonic() - t0 < max_s:
        time.sleep(0.01)  # each sleep hands the GIL to a thread waiting for it
        now = _threads()
        still = still + 1 if now == last else 0
        last = now
        if still >= quiet and time.monotonic() - t0 >= min_s:
            break
    return True
