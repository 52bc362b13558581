"""The smallest possible wrapper around torchelastic's agent.

Why a subclass (docs/launch.md): torchelastic records per-worker states only when the
whole job ends, so a failure that is followed by a successful restart never appears in
its event stream with its exit code, signal and pid. The agent *does* see each failure
as it happens: ``_monitor_workers`` returns it. ``TitanAgent`` overrides exactly two
methods, each of which calls the original and adds one thing:

* ``_monitor_workers``: records each new failure as ``worker.failed`` (global and local
  rank, pid, exit code, signal name, ``@record`` error data) the tick it is seen — after
  letting the group exit by itself for up to ``consequence_grace_s`` when every exit seen
  so far is a peer's communication fault (below); turns
  a worker's ``GAVE_UP``/``PREEMPTED`` exit, or an abort file (``titan.events.abort``),
  into "no restarts left" so the agent stops its workers the normal way and returns.
* ``_restart_workers``: asks the restart policy (:mod:`titan.launch.restarts`: backoff or
  give up, decided from the run directory's events), records ``launcher.restart`` (attempt,
  reason) before delegating, and refuses to restart when an abort is pending.

Why the grace: torchelastic stops the rest of the group (SIGTERM) the tick it sees the
first non-zero exit. The rank that left first is not always the first to *exit*: a worker
that ends with ``sys.exit(1)`` without ``destroy_process_group`` spends 1-2 s in torch's
gloo teardown (measured here, rank 0 hosting the store; another rank aborts with SIGABRT)
after its sockets closed, while the peer that lost it exits 10 within milliseconds. Stopped
at once, the rank that caused the failure was recorded as ``worker.stopped`` (SIGTERM) and
the peer's exit 10 became the attempt's root cause (4, then 2, of the 4 ``exit 1`` attempts
in two runs of ``tests/launch/test_restart_reliability.py``'s gloo test). A consequence can
only be recorded as one if its cause gets the time to exit.

``launch_agent`` builds ``LocalElasticAgent`` by its module-global name with no hook to
inject a subclass, so :func:`patched_agent` swaps that one name for the duration of a
launch and restores it. No agent logic is copied.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import time
from typing import Any, Callable, Iterator

from titan.exitcodes import ExitCode
from titan.events.abort import AbortRequest, read_abort, request_abort
from titan.launch.causes import is_comm_fault
from titan.launch.recorder import LauncherRecorder, signal_name
from titan.launch.restarts import POLICY_BY, RestartPolicy

__all__ = ["patched_agent", "STOP_CODES"]

log = logging.getLogger(__name__)

#: Worker exit codes that end the job without a restart.
STOP_CODES = {int(ExitCode.GAVE_UP): ExitCode.GAVE_UP, int(ExitCode.PREEMPTED): ExitCode.PREEMPTED}


def _make_agent_class(base: type, recorder: LauncherRecorder, on_abort: Callable[[AbortRequest], None],
                      policy: RestartPolicy | None = None, consequence_grace_s: float = 0.0,
                      beacons: "os.PathLike[str] | str | None" = None) -> type:
    class TitanAgent(base):  # type: ignore[misc, valid-type]
        """``LocalElasticAgent`` that reports failures as they happen and honours aborts."""

        _titan_seen: set[tuple[int, int, int]]
        _titan_abort: AbortRequest | None = None

        def _titan_attempt(self) -> int:
            spec = self._worker_group.spec
            return int(spec.max_restarts - self._remaining_restarts)

        def _titan_check_abort(self) -> AbortRequest | None:
            if self._titan_abort is None:
                req = read_abort(recorder.run_dir, recorder.node)
                if req is not None:
                    self._titan_abort = req
                    self._remaining_restarts = 0
                    recorder.emit("launcher.abort", f"abort requested: {req.reason}", level="warning",
                                  data={"exit_code": int(req.exit_code), "reason": req.reason,
                                        "by": req.get("by"), "file": req.get("path")})
                    on_abort(req)
            return self._titan_abort

        def _titan_let_group_exit(self) -> None:
            """While every worker that exited non-zero is a communication fault (a consequence)
            and others still run, give those up to ``consequence_grace_s`` to exit by themselves."""
            handlers = getattr(self._pcontext, "subprocess_handlers", None)
            if consequence_grace_s <= 0 or not handlers:
                return
            error_files = getattr(self._pcontext, "error_files", {}) or {}
            deadline: float | None = None
            while True:
                codes = {lr: h.proc.poll() for lr, h in handlers.items()}  # reaps; torchelastic reads it back
                failed = {lr: c for lr, c in codes.items() if c not in (None, 0)}
                running = [lr for lr, c in codes.items() if c is None]
                if not failed or not running or not all(
                        is_comm_fault({"exit_code": c, "signal": signal_name(c),
                                       "error": _error_message(_read_error_file(error_files.get(lr)))})
                        for lr, c in failed.items()):
                    return
                if deadline is None:
                    deadline = time.monotonic() + consequence_grace_s
                elif time.monotonic() >= deadline:
                    recorder.emit("launcher.grace_expired",
                                  f"local rank(s) {running} still running {consequence_grace_s:g} s after their "
                                  f"peers' communication faults; the agent stops them", level="info",
                                  data={"local_ranks": running, "grace_s": consequence_grace_s,
                                        "attempt": self._titan_attempt()})
                    return
                time.sleep(0.02)

        def _monitor_workers(self, worker_group: Any) -> Any:
            self._titan_let_group_exit()
            result = super()._monitor_workers(worker_group)
            attempt = self._titan_attempt()
            if not hasattr(self, "_titan_seen"):
                self._titan_seen = set()
            failures = result.failures or {}
            # torchelastic SIGTERMs the rest of the group on the first failure and lists
            # them too (bookkeeping); those are stops, not failures.
            root_cause = any(int(f.exitcode) != -signal.SIGTERM for f in failures.values())
            for grank, failure in sorted(failures.items()):
                key = (attempt, int(grank), int(failure.pid))
                if key in self._titan_seen:
                    continue
                self._titan_seen.add(key)
                code = int(failure.exitcode)
                sig = signal_name(code)
                err = failure.error_file_data or {}
                data = {"global_rank": int(grank), "local_rank": int(failure.local_rank), "pid": int(failure.pid),
                        "exit_code": code, "signal": sig, "attempt": attempt,
                        "error_file": failure.error_file if failure.error_file not in ("", "<N/A>") else None,
                        "error": _error_message(err), "traceback": _error_traceback(err)}
                if sig in ("SIGABRT", "SIGSEGV") and beacons is not None and _at_shutdown(
                        beacons, recorder.node, int(failure.local_rank), int(failure.pid)):
                    data["at_shutdown"] = True  # its script had ended: a teardown crash, not the node's
                if root_cause and code == -signal.SIGTERM:
                    recorder.emit("worker.stopped", f"rank {grank} (pid {failure.pid}) stopped by the agent "
                                  f"after a failure in its group", level="info", data=data)
                    continue
                with recorder.lock:
                    recorder.failures.append(data)
                recorder.emit("worker.failed",
                              f"rank {grank} (pid {failure.pid}) " +
                              (f"killed by {sig}" if sig else f"exited with {code}") + f" in attempt {attempt}" +
                              (" during interpreter shutdown, after its script ended" if data.get("at_shutdown")
                               else ""),
                              level="error", data=data)
                stop = STOP_CODES.get(code)
                if stop is None:  # decided, recorded, then killed in teardown (gloo's SIGABRT)
                    stop = _recorded_stop(recorder.run_dir.event_file(recorder.node, int(grank), attempt,
                                                                      int(failure.pid)))
                if stop is not None and self._titan_abort is None:
                    # The worker decided the job must stop; torchrun would restart it.
                    how = f"exited {stop.name}" if code == int(stop) else \
                        f"recorded {stop.name} (worker.abort), then " + (f"died of {sig}" if sig else f"exited {code}")
                    request_abort(recorder.run_dir, f"rank {grank} {how}",
                                  exit_code=stop, node=recorder.node, by=f"rank {grank}")
            if self._titan_check_abort() is not None and result.state.name == "HEALTHY":
                from torch.distributed.elastic.agent.server.api import RunResult, WorkerState

                return RunResult(state=WorkerState.FAILED, failures=result.failures)
            return result

        def _titan_backoff(self, seconds: float) -> None:
            """Sleep before the restart, in short slices: an abort ends the wait (and the job)."""
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
                if self._titan_check_abort() is not None:
                    raise _AbortRestart()

        def _restart_workers(self, worker_group: Any) -> None:
            if self._titan_check_abort() is not None:
                raise _AbortRestart()
            prev = worker_group.state.name
            reason = "membership change" if prev == "HEALTHY" else f"worker group {prev.lower()}"
            nxt = self._titan_attempt()
            if policy is not None and prev != "HEALTHY":  # the launcher's restart decision
                dec = policy.before_restart(nxt)
                if dec.give_up:
                    request_abort(recorder.run_dir, f"gave up: {dec.reason}", exit_code=ExitCode.GAVE_UP,
                                  by=POLICY_BY)
                    self._titan_check_abort()
                    raise _AbortRestart()
                self._titan_backoff(dec.backoff_s)
            with recorder.lock:
                recorder.restarts += 1
            recorder.emit("launcher.restart", f"restarting the worker group ({reason}), attempt {nxt}",
                          level="warning", data={"attempt": nxt, "reason": reason,
                                                 "remaining_restarts": int(self._remaining_restarts)})
            recorder.set_attempt(nxt)
            super()._restart_workers(worker_group)

    return TitanAgent


def _at_shutdown(beacons: "os.PathLike[str] | str", node: str, local_rank: int, pid: int) -> bool:
    """Whether the worker ``pid`` had reached its interpreter's shutdown when it died: its
    beacon says done (``titan.beacon.done`` runs at exit). A crash then (SIGABRT/SIGSEGV —
    torch's gloo threads abort a finalizing interpreter, ``titan.worker.shutdown``) is no
    node's fault; a kill (SIGKILL, SIGTERM) is not asked about: it came from outside."""
    from titan.beacon import beacon_path, read_beacon

    snap = read_beacon(beacon_path("", node, local_rank, configured=os.fspath(beacons)))
    return snap is not None and snap.pid == pid and snap.done


def _recorded_stop(path: "os.PathLike[str] | str", tail_bytes: int = 65536) -> ExitCode | None:
    """The stop a worker recorded before it died: the exit code (``GAVE_UP``/``PREEMPTED``)
    of the last ``worker.abort`` in its event file, or ``None``. A worker that decided to stop
    writes ``worker.abort`` and then exits with that code, but its teardown can still kill it
    (SIGABRT, "terminate called without an active exception": ``titan.worker.shutdown``) —
    3 of 100 launches of the all-corrupt-checkpoint run here. The decision, not the teardown, is the job's outcome. Reads the file's last
    ``tail_bytes`` only; a missing or torn file is no decision."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - tail_bytes))
            lines = f.read().splitlines()
    except OSError:
        return None
    for raw in reversed(lines):
        if b'"worker.abort"' not in raw:
            continue
        try:
            ev = json.loads(raw)
            code = int((ev.get("data") or {}).get("exit_code"))
        except (ValueError, TypeError, AttributeError):
            continue
        if ev.get("kind") == "worker.abort":
            return STOP_CODES.get(code)
    return None


class _AbortRestart(Exception):
    """Raised inside the agent when an abort arrives between failure and restart."""


@contextlib.contextmanager
def patched_agent(recorder: LauncherRecorder, on_abort: Callable[[AbortRequest], None],
                  policy: RestartPolicy | None = None, consequence_grace_s: float = 0.0,
                  beacons: "os.PathLike[str] | str | None" = None) -> Iterator[type]:
    """Make ``torch.distributed.launcher.api`` build a ``TitanAgent`` while inside; with
    ``policy`` every restart after a failure is decided by it (backoff or give up);
    ``consequence_grace_s``: ``run.consequence_grace_s`` (module docstring); ``beacons``: the
    beacon folder (a signal death after the worker's script ended is marked ``at_shutdown``)."""
    from torch.distributed.launcher import api

    original = api.LocalElasticAgent
    cls = _make_agent_class(original, recorder, on_abort, policy, consequence_grace_s, beacons)
    api.LocalElasticAgent = cls
    try:
        yield cls
    finally:
        api.LocalElasticAgent = original


def _read_error_file(path: str | None) -> Any:
    """A worker's ``@record`` error file (JSON), or None when there is none (yet)."""
    if not path or path in ("", "<N/A>", os.devnull):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _error_message(err: Any) -> str | None:
    """The ``@record`` error's message, or None when the worker wrote no error file."""
    if not isinstance(err, dict):
        return None
    msg = err.get("message")
    if isinstance(msg, dict):  # {"message": {"message": "...", "extraInfo": {...}}}
        msg = msg.get("message")
    return str(msg) if msg and msg != "<NONE>" else None


def _error_traceback(err: Any) -> str | None:
    """The worker's Python traceback from its ``@record`` error file (last 4000 chars)."""
    if not isinstance(err, dict) or not isinstance(err.get("message"), dict):
        return None
    tb = (err["message"].get("extraInfo") or {}).get("py_callstack")
    return str(tb)[-4000:] if tb else None
