"""What ``titan run`` calls: refuse to join when excluded, run the watchdog around the agent.

Kept here so the launcher needs two one-line calls (``titan.launch.runner``).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator

from titan.errors import UserError
from titan.events import EventWriter, RunDir

__all__ = ["refuse_if_excluded", "watching"]

log = logging.getLogger(__name__)


def refuse_if_excluded(rd: RunDir, node: str, settings: Any) -> None:
    """Raise ``UserError`` (one line + hint) when ``node`` is over its strike limit.

    The node then never joins the rendezvous; with ``--nnodes MIN:MAX`` the other nodes
    go on without it. Records ``node.excluded`` in the run directory first.
    """
    if not settings.watchdog.enabled:
        return
    from titan.ledger import ledger_from_settings

    try:
        led = ledger_from_settings(settings)
        if not led.is_excluded(node):
            return
    except Exception as e:  # noqa: BLE001 - an unreadable ledger must not stop a launch
        log.warning("node ledger unavailable (%s); not checking exclusion", e)
        return
    n = led.count(node)
    from titan.watchdog.core import watchdog_events_file

    rd.events_dir.mkdir(parents=True, exist_ok=True)
    w = EventWriter(watchdog_events_file(rd, node), run=rd.run_id, node=node)
    w.emit("node.excluded", f"node {node} declines to join: {n} strikes (limit {led.limit})", level="error",
           data={"node": node, "strikes": n, "limit": led.limit, "ledger": str(led.path), "when": "before join"})
    w.close()
    raise UserError(f"node {node} is excluded by the node ledger ({n} strikes within "
                    f"{led.window_s:g} s, limit {led.limit}); it does not join",
                    f"inspect with `titan nodes`, clear with `titan nodes --clear {node}` once the node is fixed")


@contextlib.contextmanager
def watching(rd: RunDir, node: str, settings: Any) -> Iterator[Any]:
    """Run the node's :class:`~titan.watchdog.Watchdog` for the duration of the block."""
    if not settings.watchdog.enabled:
        yield None
        return
    from titan.ledger import ledger_from_settings
    from titan.watchdog.core import Watchdog

    try:
        led = ledger_from_settings(settings)
    except Exception as e:  # noqa: BLE001 - no ledger: still watch for hangs
        log.warning("node ledger unavailable (%s); strikes are not recorded", e)
        led = None
    restore: list[Any] = []

    def leave(reason: str) -> None:
        restore.append(_leave_without_closing_rendezvous())
        from titan.exitcodes import ExitCode
        from titan.launch.abort import request_abort

        request_abort(rd, reason, exit_code=ExitCode.JOB_FAILED, node=node, by="watchdog (node excluded)")

    wd = Watchdog(rd, node, settings, ledger=led, on_exclude=leave).start()
    try:
        yield wd
    finally:
        wd.stop()
        for undo in restore:
            undo()


def _leave_without_closing_rendezvous() -> Any:
    """Make this process's rendezvous ``shutdown()`` leave instead of *closing* the rendezvous.

    torchelastic closes the rendezvous for every node when an agent ends normally
    (``launch_agent``'s ``finally``), which would end the whole job (measured here:
    ``RendezvousClosedError`` on the other node). An excluded node must only stop its
    heartbeats: the others drop it after ``keep_alive_interval × keep_alive_max_attempt``
    and re-form the group without it (``--nnodes MIN:MAX``). Returns an undo function.
    """
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

    cls = dr.DynamicRendezvousHandler
    original = cls.shutdown

    def shutdown(self: Any) -> bool:
        self._stop_heartbeats()
        return True

    cls.shutdown = shutdown  # type: ignore[method-assign]

    def undo() -> None:
        cls.shutdown = original  # type: ignore[method-assign]

    return undo
