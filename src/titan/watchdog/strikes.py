"""Turn a run's failures into ledger strikes for *this* node.

Sources: the watchdog's own hang verdicts and straggler flags (added directly), and,
tailed from the run directory about once a second:

* ``worker.failed`` (every node's ``launcher.<node>.jsonl``): failures within 3 s of each
  other are one incident, blamed on the node of the *earliest* one when that failure can
  be the node's fault (killed by a signal such as SIGKILL/SIGSEGV/SIGBUS, or exited with
  a communication/CUDA fault code; a Python exception is the script's, not the node's) — when one node's rank
  dies, the peers on other nodes fail a moment later with "Connection closed by peer" and
  must not be blamed. Incidents right after a hang verdict (the watchdog's own SIGKILL)
  are not crashes.
* ``guard.strike`` in this node's worker event files (guard transients, SDC findings).

**Injected faults never strike** (unless ``watchdog.strike_injected``): every source goes
through :meth:`StrikeTracker.add`, the one place that checks the marker of a deliberate
fault — an ``inject.*`` event of this run (``titan.chaos``: drills, tests) near the
fault's time or, for guard and SDC strikes, at or a little before the fault's step in the
same attempt, or an ``injected: true`` flag on the strike's own event. It records
``node.strike_skipped`` instead. Guard strikes are settled after every file of a scan
has been read, so the injection is seen whichever file holds it.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from titan.watchdog.core import Watchdog

__all__ = ["StrikeTracker"]

log = logging.getLogger(__name__)

_INCIDENT_S = 3.0
#: Signals that stop a worker on purpose (agent, scheduler, Ctrl-C): not the node's fault.
_STOP_SIGNALS = {"SIGTERM", "SIGINT", "SIGHUP"}
#: Exit codes that point at the node (a communication or CUDA fault seen first there);
#: exit 1 (a Python exception) is the script's fault and does not count.
_FAULT_CODES = {10, 11}


def _node_fault(d: dict[str, Any]) -> bool:
    """Could this failure be the node's fault (a signal death, a comm or CUDA fault)? Not a
    death after the worker's script ended (``at_shutdown``: torch's teardown, e.g. gloo's
    threads aborting a finalizing interpreter — three such exits once locked a host out)."""
    if d.get("at_shutdown"):
        return False
    sig = d.get("signal")
    if sig:
        return sig not in _STOP_SIGNALS
    return int(d.get("exit_code") or 0) in _FAULT_CODES
_AFTER_HANG_S = 15.0
#: A guard or SDC strike comes at most this long after the fault that caused it.
_GUARD_WINDOW_S = 30.0


def _int(x: Any) -> int | None:
    try:
        return None if x is None else int(x)
    except (TypeError, ValueError):
        return None


class StrikeTracker:
    """Incremental reader of failure events; adds strikes to the watchdog's ledger."""

    def __init__(self, wd: "Watchdog") -> None:
        self.wd = wd
        self._offsets: dict[Path, int] = {}
        self._failures: list[dict[str, Any]] = []  # pending worker.failed (t, node, pid, ...)
        self._guard: list[dict[str, Any]] = []  # guard.strike events read, settled after the scan
        self.added: list[tuple[str, str]] = []
        self.skipped: list[tuple[str, str]] = []
        self._injected: list[tuple[float, int | None, int | None]] = []  # inject.*: (t, attempt, step)
        self._scanning = False

    def injected_near(self, t: float, before_s: float = 10.0, after_s: float = 1.0) -> bool:
        """Was a fault injected on purpose (an ``inject.*`` event) around time ``t``?"""
        return any(t - before_s <= x <= t + after_s for x, _, _ in self._injected)

    def injected_before_step(self, attempt: int | None, step: int | None, steps_back: int) -> bool:
        """Was a fault injected in ``attempt`` at ``step`` or up to ``steps_back`` steps before?"""
        if attempt is None or step is None:
            return False
        return any(a == attempt and s is not None and step - steps_back <= s <= step for _, a, s in self._injected)

    def add(self, kind: str, detail: str, *, fault_t: float | None = None, window_s: float = 10.0,
            attempt: int | None = None, step: int | None = None, steps_back: int = 0,
            injected: bool = False) -> None:
        """Record one strike for this node (event ``node.strike``) and check exclusion.

        The one place that keeps injected faults out of the ledger (module docstring): a
        fault flagged ``injected``, or with an ``inject.*`` event within ``window_s`` before
        ``fault_t`` (default now), or in ``attempt`` at ``step`` or up to ``steps_back``
        steps before, is skipped unless ``watchdog.strike_injected``.
        """
        wd = self.wd
        fault_t = time.time() if fault_t is None else fault_t
        if not wd.cfg.strike_injected:
            if not self._scanning:
                self.scan()  # pick up inject.* events written since the last scan
            if (injected or self.injected_near(fault_t, before_s=window_s)
                    or self.injected_before_step(attempt, step, steps_back)):
                self.skipped.append((kind, detail))
                wd.events.emit("node.strike_skipped", f"no {kind} strike for node {wd.node}: the fault was injected",
                               data={"node": wd.node, "kind": kind, "detail": detail})
                return
        self.added.append((kind, detail))
        count = None
        if wd.ledger is not None:
            try:
                count = wd.ledger.add(wd.node, kind, run=wd.rd.run_id, detail=detail)
            except Exception as e:  # noqa: BLE001 - a broken ledger must not stop the watchdog
                log.warning("ledger write failed: %s", e)
        wd.events.emit("node.strike", f"strike for node {wd.node}: {kind} ({detail})", level="warning",
                       data={"node": wd.node, "kind": kind, "detail": detail, "strikes": count,
                             "limit": getattr(wd.ledger, "limit", None)})
        if wd.ledger is not None:
            wd.check_exclusion()

    def _new_lines(self, path: Path) -> list[dict[str, Any]]:
        off = self._offsets.get(path, 0)
        try:
            with open(path, "rb") as f:
                f.seek(off)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self._offsets[path] = off + end + 1
        out = []
        for raw in data[:end].split(b"\n"):
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
        return out

    def scan(self, *, final: bool = False) -> None:
        """Read new events; blame settled incidents (all pending ones when ``final``)."""
        rd = self.wd.rd
        self._scanning = True
        try:
            for p in sorted(rd.path.glob("launcher.*.jsonl")):
                for ev in self._new_lines(p):
                    if ev.get("kind") == "worker.failed":
                        self._failures.append(ev)
            if rd.events_dir.is_dir():
                for p in sorted(rd.events_dir.glob("*.jsonl")):
                    if p.name.startswith("watchdog."):
                        continue
                    for ev in self._new_lines(p):
                        kind = str(ev.get("kind", ""))
                        if kind == "guard.strike" and ev.get("node") == self.wd.node:
                            self._guard.append(ev)
                        elif kind.startswith("inject."):
                            self._injected.append((float(ev.get("t", 0)), _int(ev.get("attempt")),
                                                   _int(ev.get("step"))))
            guard, self._guard = self._guard, []
            for ev in guard:  # after every file: the injection may sit in a file read later
                d = ev.get("data") or {}
                self.add("guard", str(ev.get("msg") or "guard strike")[:200], fault_t=float(ev.get("t", 0)),
                         window_s=_GUARD_WINDOW_S, attempt=_int(ev.get("attempt")), step=_int(ev.get("step")),
                         steps_back=self._guard_steps_back(), injected=bool(d.get("injected")))
            self._settle(final)
        finally:
            self._scanning = False

    def _guard_steps_back(self) -> int:
        """How far before a guard/SDC strike its fault may lie: an SDC round's distance."""
        sdc = getattr(getattr(self.wd, "settings", None), "sdc", None)
        return max(1, int(getattr(sdc, "every_steps", 0) or 0), int(getattr(sdc, "canary_every_steps", 0) or 0))

    def _settle(self, final: bool) -> None:
        if not self._failures:
            return
        self._failures.sort(key=lambda e: float(e.get("t", 0)))
        first_t = float(self._failures[0].get("t", 0))
        if not final and time.time() - first_t < _INCIDENT_S:
            return
        incident = [e for e in self._failures if float(e.get("t", 0)) - first_t <= _INCIDENT_S]
        self._failures = [e for e in self._failures if e not in incident]
        first = incident[0]
        if self._after_hang(first_t):
            return  # the watchdog's own kill
        d = first.get("data") or {}
        if first.get("node") == self.wd.node and int(d.get("pid", -1)) not in self.wd._killed and _node_fault(d):
            self.add("crash", f"rank {d.get('global_rank')} " + (f"killed by {d['signal']}" if d.get("signal")
                                                                  else f"exited {d.get('exit_code')}"),
                     fault_t=first_t, injected=bool(d.get("injected")))
        if self._failures:
            self._settle(final)

    def _after_hang(self, t: float) -> bool:
        hang_root = self.wd.rd.path / "hang"
        if not hang_root.is_dir():
            return False
        for v in hang_root.glob("attempt*/verdict.json"):
            try:
                if 0 <= t - v.stat().st_mtime <= _AFTER_HANG_S:
                    return True
            except OSError:
                continue
        return False
