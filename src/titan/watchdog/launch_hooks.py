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


def refuse_if_excluded(rd: RunDir, node: str, settings: Any, *, only_node: bool = False) -> None:
    """Refuse to start when ``node`` is over its strike limit; records ``node.excluded`` first.

    ``only_node`` (the job has one node): the job cannot run at all, a give-up —
    ``TitanAbort`` with ``ExitCode.GAVE_UP``, naming the strikes, their runs and how to
    clear them. Otherwise the node does not join (``UserError``); with ``--nnodes MIN:MAX``
    the other nodes go on without it.
    """
    if not settings.watchdog.enabled:
        return
    from titan.ledger import ledger_from_settings
    from titan.ledger.explain import explain_exclusion

    try:
        led = ledger_from_settings(settings)
        if not led.is_excluded(node):
            return
        why = explain_exclusion(led, node)
    except Exception as e:  # noqa: BLE001 - an unreadable ledger must not stop a launch
        log.warning("node ledger unavailable (%s); not checking exclusion", e)
        return
    from titan.watchdog.core import watchdog_events_file

    rd.events_dir.mkdir(parents=True, exist_ok=True)
    msg = why.message(only_node=only_node)
    w = EventWriter(watchdog_events_file(rd, node), run=rd.run_id, node=node)
    w.emit("node.excluded", msg, level="error", data={**why.to_dict(), "when": "before join", "only_node": only_node})
    w.close()
    if only_node:
        from titan.errors import TitanAbort
        from titan.exitcodes import ExitCode

        raise TitanAbort(msg, int(ExitCode.GAVE_UP), hint=why.hint())
    raise UserError(f"{msg}; it does not join", why.hint())


@contextlib.contextmanager
def watching(rd: RunDir, node: str, settings: Any, *, only_node: bool = False) -> Iterator[Any]:
    """Run the node's :class:`~titan.watchdog.Watchdog` for the duration of the block.

    A node that goes over its strike limit leaves the job; when it is the ``only_node``,
    that ends the job: a give-up (``ExitCode.GAVE_UP``) whose reason names the strikes,
    their runs and how to clear them — never a silent JOB_FAILED.
    """
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
        from titan.exitcodes import ExitCode
        from titan.events.abort import request_abort

        if only_node:
            from titan.ledger.explain import explain_exclusion

            try:
                why = explain_exclusion(led, node)
                reason = f"{why.message(only_node=True)}; {why.hint()}"
            except Exception as e:  # noqa: BLE001 - the give-up must happen even if the ledger is odd
                log.warning("cannot list the strikes of %s: %s", node, e)
            request_abort(rd, reason, exit_code=ExitCode.GAVE_UP, node=node, by="watchdog (only node excluded)")
            return
        restore.append(_leave_without_closing_rendezvous())
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
