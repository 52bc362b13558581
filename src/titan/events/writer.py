"""The event writer: one ``os.write`` of a whole line per event, no user-space buffer.

Guarantees (``docs/events.md``):

* **direct mode** (default): every ``emit`` returns after the line is in the kernel's
  page cache, written with a single ``write(2)`` on an ``O_APPEND`` descriptor. A
  SIGKILL of the process afterwards loses nothing; concurrent writers never interleave
  within a line.
* **queued mode**: if one write takes longer than ``slow_write_s`` (a stalled disk), the
  writer emits ``events.slow_write`` and, when ``queue_on_slow`` is set, hands lines to a
  background thread through a bounded queue so the training loop never waits on the
  disk again. A full queue drops lines and counts them; the count is written as
  ``events.dropped``. In this mode a SIGKILL loses what is still queued.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from titan.events.schema import LEVELS, Event

__all__ = ["EventWriter"]


class EventWriter:
    """Append events for one process (one rank of one attempt, or one launcher).

    Cost per event in direct mode: one JSON encode and one ``write(2)`` (a few
    microseconds to tens of microseconds on a local disk). Never raises on I/O errors:
    a writer that cannot write counts the loss instead of killing training.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        run: str,
        node: str,
        rank: int | None = None,
        local_rank: int | None = None,
        world: int | None = None,
        attempt: int | None = None,
        step_every: int = 1,
        slow_write_s: float = 0.5,
        queue_on_slow: bool = True,
        queue_size: int = 10_000,
    ) -> None:
        if step_every < 1:
            raise ValueError("step_every must be >= 1")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)  # read: cut a partial line
        self._base = dict(run=run, node=node, rank=rank, local_rank=local_rank, world=world,
                          attempt=attempt, pid=os.getpid())
        self._seq = 0
        self._lock = threading.Lock()
        self.step_every = step_every
        self.slow_write_s = slow_write_s
        self.queue_on_slow = queue_on_slow
        self._queue: collections.deque[bytes] | None = None
        self._queue_size = queue_size
        self._cv = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self.dropped = 0
        self._dropped_reported = 0
        self.write_errors = 0
        self._closed = False

    @property
    def queued(self) -> bool:
        """True once the writer switched to the bounded background queue."""
        return self._queue is not None

    def set_context(self, **fields: Any) -> None:
        """Update base fields (e.g. ``world`` or ``rank`` after re-rendezvous)."""
        with self._lock:
            self._base.update(fields)

    def emit(
        self,
        kind: str,
        msg: str = "",
        *,
        level: str = "info",
        step: int | None = None,
        phase: str | None = None,
        data: Mapping[str, Any] | None = None,
        force: bool = False,
    ) -> bool:
        """Write one event; returns False if it was sampled out or dropped.

        ``step`` events at level info are kept every ``step_every`` steps unless
        ``force`` is set (flags such as a skipped step force them).
        """
        if level not in LEVELS:
            raise ValueError(f"unknown level {level!r}")
        if (kind == "step" and level == "info" and not force and step is not None
                and self.step_every > 1 and step % self.step_every):
            return False
        t = time.time()
        mono = time.monotonic()
        with self._lock:
            if self._closed:
                return False
            self._seq += 1
            ev = Event(kind=kind, t=t, mono=mono, seq=self._seq, step=step, phase=phase,
                       level=level, msg=msg, data=dict(data or {}), **self._base)
            line = (ev.to_json() + "\n").encode()
            if self._queue is not None:
                return self._enqueue_locked(line)
        return self._write_direct(line, kind)

    def _write_direct(self, line: bytes, kind: str) -> bool:
        t0 = time.monotonic()
        ok = self._write_all(line)
        dt = time.monotonic() - t0
        if dt > self.slow_write_s and kind != "events.slow_write":
            switch = self.queue_on_slow
            self.emit("events.slow_write", f"event write took {dt:.3f}s (bound {self.slow_write_s}s)",
                      level="warning", data={"seconds": dt, "bound_s": self.slow_write_s,
                                             "switch_to_queue": switch})
            if switch:
                self._start_queue()
        return ok

    def _write_all(self, line: bytes) -> bool:
        try:
            n = os.write(self._fd, line)
        except OSError:
            self.write_errors += 1
            return False
        if n != len(line):
            # A short write on a regular file means a full disk. Cut the partial line off
            # again, so that the next line (once there is space) does not continue it and
            # no torn line is left in the middle of the file.
            self.write_errors += 1
            self._cut_partial(line[:n])
            return False
        return True

    def _cut_partial(self, written: bytes) -> None:
        """Truncate ``written`` off the end of the file if it is still the last thing there."""
        if not written:
            return
        with self._lock:
            try:
                end = os.fstat(self._fd).st_size
                if end >= len(written) and os.pread(self._fd, len(written), end - len(written)) == written:
                    os.ftruncate(self._fd, end - len(written))
            except OSError:
                pass  # the reader still skips a torn line

    def _start_queue(self) -> None:
        with self._lock:
            if self._queue is not None:
                return
            self._queue = collections.deque()
            self._thread = threading.Thread(target=self._drain, name="titan-events", daemon=True)
            self._thread.start()

    def _enqueue_locked(self, line: bytes) -> bool:
        assert self._queue is not None
        if len(self._queue) >= self._queue_size:
            self.dropped += 1
            return False
        self._queue.append(line)
        self._cv.notify()
        return True

    def _drain(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait(timeout=1.0)
                    if self.dropped != self._dropped_reported:
                        break
                batch = list(self._queue or ())
                if self._queue is not None:
                    self._queue.clear()
                closed = self._closed
                dropped, reported = self.dropped, self._dropped_reported
            for line in batch:
                self._write_all(line)
            if dropped != reported:
                self._dropped_reported = dropped
                t = time.time()
                with self._lock:
                    self._seq += 1
                    ev = Event(kind="events.dropped", t=t, mono=time.monotonic(), seq=self._seq,
                               level="warning", msg=f"{dropped - reported} events dropped (queue full)",
                               data={"dropped": dropped - reported, "dropped_total": dropped}, **self._base)
                self._write_all((ev.to_json() + "\n").encode())
            if closed:
                return

    def close(self, timeout_s: float = 5.0) -> None:
        """Flush the queue (if any) within ``timeout_s`` and close the file."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
        try:
            os.close(self._fd)
        except OSError:
            pass

    def __enter__(self) -> "EventWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
