"""The node agent dies with its launcher: a SIGKILLed ``titan run`` must not leave it orphaned.

``titan run`` starts the agent in its own session (so a Ctrl-C to the terminal reaches the
launcher, which stops the agent in order) and hands it its pid in
``TITAN_AGENT_PARENT_PID``. The agent then

* asks the kernel for SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``, Linux) —
  only when the launcher says it started the agent from its main thread
  (``TITAN_AGENT_PDEATHSIG=1``): the signal fires when the *thread* that forked exits;
* and, everywhere, checks once per ``poll_s`` that its parent is still that pid (a dead
  parent re-parents the agent to init or a subreaper), and stops when it is not.

Either way the agent stops through its normal path (``agent.stop`` is written). Cost: one
``getppid()`` per poll in a daemon thread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import threading
from typing import Callable, Mapping

from titan.settings.env import TITAN_AGENT_PARENT_PID

__all__ = ["PDEATHSIG_VAR", "parent_env", "watch_parent"]

log = logging.getLogger(__name__)

#: Set to ``1`` by the launcher when the kernel's parent-death signal is safe to use.
PDEATHSIG_VAR = "TITAN_AGENT_PDEATHSIG"
_PR_SET_PDEATHSIG = 1


def parent_env() -> dict[str, str]:
    """What the launcher adds to the agent's environment (call it in the launcher)."""
    env = {TITAN_AGENT_PARENT_PID: str(os.getpid())}
    if threading.current_thread() is threading.main_thread():
        env[PDEATHSIG_VAR] = "1"
    return env


def _set_pdeathsig(sig: int) -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux / no prctl: the poll below still works
        return False


def watch_parent(on_gone: Callable[[str], None], environ: Mapping[str, str], *, poll_s: float = 0.5) -> int | None:
    """Call ``on_gone(reason)`` (once) when the launcher named in ``environ`` is gone.

    Returns the watched pid, or None when no launcher is named (an agent started by hand).
    """
    raw = environ.get(TITAN_AGENT_PARENT_PID, "")
    if not raw.isdigit():
        return None
    ppid = int(raw)
    if environ.get(PDEATHSIG_VAR) == "1":
        _set_pdeathsig(signal.SIGTERM)
    fired = threading.Event()

    def gone(reason: str) -> None:
        if not fired.is_set():
            fired.set()
            log.warning("%s", reason)
            on_gone(reason)

    if os.getppid() != ppid:  # the launcher died before the watch was armed
        gone(f"the launcher (pid {ppid}) is gone; stopping")
        return ppid

    def loop() -> None:
        while not fired.wait(poll_s):
            if os.getppid() != ppid:
                gone(f"the launcher (pid {ppid}) is gone; stopping")

    threading.Thread(target=loop, name="titan-agent-parent", daemon=True).start()
    return ppid
