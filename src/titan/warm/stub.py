"""The worker process torchrun starts under ``titan run``: it asks the zygote for a warm worker.

Run by path with ``python -S -I -u stub.py script|module TARGET ARGS...`` (standard library
only, no ``site``: it starts in milliseconds). It connects to this node's zygote
(``$TITAN_WARM_DIR/zygote.sock``), hands it its environment, arguments, working directory
and standard streams (SCM_RIGHTS) plus the read end of a *lifeline* pipe, and gets back the
pid of the forked worker. From then on it stands in for the worker toward torchrun's agent:

* signals torchrun sends it (SIGTERM, SIGINT, SIGHUP, SIGQUIT to its process group; SIGUSR1/2)
  go to the worker's process group;
* when the worker exits, the stub exits the same way (same code, or killed by the same
  signal), after ending what is left of the worker's process group;
* when the stub dies (SIGKILL after torchrun's grace period), the lifeline closes and the
  worker kills its own process group.

Anything that keeps the warm path from working — no zygote, a zygote that failed or is not
ready within its budget, a refused request — makes the stub ``exec`` the worker the way
torchrun would have (``python -u TARGET ARGS``), with ``TITAN_SPAWN=cold: <why>`` so that the
worker's ``worker.started`` event says why.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import sys
import time

DIR_VAR = "TITAN_WARM_DIR"
SPAWN_VAR = "TITAN_SPAWN"
SOCKET_NAME = "zygote.sock"
STATE_NAME = "state.json"
_FORWARD_GROUP = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
_FORWARD_ONE = (signal.SIGUSR1, signal.SIGUSR2)


def _cold(mode: str, target: str, args: list[str], why: str) -> None:
    """Become the worker the way torchrun would have started it (never returns)."""
    env = dict(os.environ)
    env[SPAWN_VAR] = f"cold: {why}"
    argv = [sys.executable, "-u", *(["-m"] if mode == "module" else []), target, *args]
    os.execve(sys.executable, argv, env)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _state(d: str) -> dict:
    try:
        with open(os.path.join(d, STATE_NAME)) as f:
            st = json.load(f)
        return st if isinstance(st, dict) else {}
    except (OSError, ValueError):
        return {}


def _connect(d: str) -> tuple[socket.socket | None, str]:
    """Wait for the zygote to be ready (bounded by its own ``ready_timeout_s``) and connect."""
    t0 = time.monotonic()
    budget = None
    while True:
        st = _state(d)
        state, pid = st.get("state"), st.get("pid")
        if budget is None and isinstance(st.get("ready_timeout_s"), (int, float)):
            budget = float(st["ready_timeout_s"])
        if state == "failed":
            return None, f"zygote failed: {st.get('reason', 'unknown')}"
        if state == "stopped":
            return None, "zygote stopped"
        if state == "ready":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(os.path.join(d, SOCKET_NAME))
                return s, ""
            except OSError as e:
                s.close()
                if not (isinstance(pid, int) and _alive(pid)):
                    return None, f"zygote (pid {pid}) is gone"
                return None, f"zygote unreachable: {e.strerror or e}"
        if isinstance(pid, int) and not _alive(pid):
            return None, f"zygote (pid {pid}) died while starting"
        if not st and time.monotonic() - t0 > 5.0:
            return None, f"no zygote state in {d}"
        if budget is not None and time.monotonic() - t0 > budget:
            return None, f"zygote not ready after {budget:g} s"
        time.sleep(0.02)


def _std_fds() -> list[int]:
    out = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            out.append(fd)
        except OSError:
            out.append(os.open(os.devnull, os.O_RDWR))
    return out


def _request(sock: socket.socket, mode: str, target: str, args: list[str], lifeline_r: int) -> dict:
    body = json.dumps({"v": 1, "mode": mode, "target": target, "args": args, "cwd": os.getcwd(),
                       "env": dict(os.environ), "stub_pid": os.getpid()}).encode()
    head = struct.pack("!Q", len(body))
    socket.send_fds(sock, [head + body[:65536]], [*_std_fds(), lifeline_r])
    if len(body) > 65536:
        sock.sendall(body[65536:])
    return _read_msg(sock)


def _read_msg(sock: socket.socket) -> dict:
    """One JSON line from the zygote; ``{}`` when it closed the connection."""
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            return {}
        buf += chunk
    msg = json.loads(buf)
    return msg if isinstance(msg, dict) else {}


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _mirror(status: dict) -> None:
    """Exit the way the worker did (never returns)."""
    sig = status.get("signal")
    if isinstance(sig, int) and sig > 0:
        try:
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        except (OSError, ValueError):
            pass
        os.kill(os.getpid(), sig)
        time.sleep(0.1)  # a signal whose default is to ignore it: fall through
        os._exit(128 + sig)
    code = status.get("code")
    os._exit(int(code) if isinstance(code, int) and 0 <= code <= 255 else 1)


def _wait_orphan(pid: int) -> None:
    """The zygote died before the worker: wait for the worker by pidfd (its status is lost)."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] not in ("script", "module"):
        sys.stderr.write("titan warm stub: usage: stub.py script|module TARGET [ARGS...]\n")
        os._exit(2)
    mode, target, args = argv[0], argv[1], argv[2:]
    d = os.environ.get(DIR_VAR)
    if not d:
        _cold(mode, target, args, "no zygote on this node (warm.enabled is off)")
    sock, why = _connect(d)
    if sock is None:
        _cold(mode, target, args, why)
    lifeline_r, lifeline_w = os.pipe()
    try:
        reply = _request(sock, mode, target, args, lifeline_r)
    except OSError as e:
        reply = {"error": f"request failed: {e.strerror or e}"}
    os.close(lifeline_r)
    pid = reply.get("pid")
    if not isinstance(pid, int):
        os.close(lifeline_w)
        sock.close()
        _cold(mode, target, args, str(reply.get("error") or "zygote gave no worker"))
    for sig in _FORWARD_GROUP:
        signal.signal(sig, lambda s, _f: _signal_group(pid, s))
    for sig in _FORWARD_ONE:
        signal.signal(sig, lambda s, _f: os.kill(pid, s) if _alive(pid) else None)
    while True:
        try:
            status = _read_msg(sock)
            break
        except InterruptedError:
            continue
    if not status:  # the zygote is gone; the worker may still run
        _wait_orphan(pid)
        status = {"code": 1, "lost": True}
        sys.stderr.write(f"titan warm stub: the zygote died; worker {pid}'s exit status is lost\n")
    _signal_group(pid, signal.SIGKILL)  # what torchrun's killpg would have ended: the worker's helpers
    _mirror(status)


if __name__ == "__main__":
    main(sys.argv[1:])
