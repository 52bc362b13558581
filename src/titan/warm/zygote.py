"""The zygote: a process with the imports loaded that forks a worker per request.

``python -m titan.warm.zygote --dir DIR [--preload a,b] [--script PATH | --module NAME]``
imports torch, Titan's in-process library, the script's top-level imports and the modules
asked for, refuses to serve if any of that initialised CUDA (a forked child could not use
it), then listens on ``DIR/zygote.sock`` (a private 0700 folder; the peer's uid is checked
with ``SO_PEERCRED``; requests are JSON — nothing is unpickled). For each request from a
worker stub (``titan.warm.stub``) it forks; the child becomes the worker:

own session (like torchrun's ``start_new_session``), the stub's standard streams, the
worker's environment and working directory, ``sys.argv`` and ``sys.path[0]`` as ``python -u``
would set them, fresh entropy for Python's and NumPy's global generators, torch's intra-op
threads from ``OMP_NUM_THREADS``, default signal handlers, a lifeline thread that kills the
process group when the stub is gone — then ``runpy`` runs the script as ``__main__`` and the
child exits as the interpreter would (exit code, uncaught exception → excepthook and 1,
``atexit`` handlers, non-daemon threads joined).

The zygote itself stays single-threaded (a fork with other threads running could inherit a
held lock): one ``select`` loop over the listening socket and one pidfd per child; a child's
exit status goes back to its stub. It stops on SIGTERM, or when its parent (``titan run``)
is gone. State for the stubs in ``DIR/state.json`` (``starting`` → ``ready`` | ``failed``).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import json
import logging
import os
import select
import signal
import socket
import struct
import sys
import time
from pathlib import Path
from typing import Any

from titan.warm.stub import SOCKET_NAME, SPAWN_VAR, STATE_NAME

__all__ = ["main", "DEFAULT_PRELOAD", "script_imports"]

log = logging.getLogger("titan.warm.zygote")

#: What every Titan worker imports (the expensive part of a cold start).
DEFAULT_PRELOAD = (
    "numpy", "torch", "torch.nn", "torch.optim", "torch.distributed", "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.state_dict", "torch.nn.parallel", "torch.utils.data",
    "titan.worker", "titan.beacon", "titan.guard", "titan.checkpoint.checkpointer", "titan.checkpoint.restore",
    "titan.checkpoint.state", "titan.checkpoint.storage", "titan.checkpoint.stepsnap", "titan.sdc.monitor",
    "titan.chaos.worker", "titan.tracing.tracer", "torch._dynamo",  # DDP imports dynamo when built: 3 s
    # imported on a restarted worker's way to its first step (DDP's comm hooks, the guard's DDP
    # part, the snapshot tiers' hash and serialisation): ~20 ms of CPU each restart (bench/rto.py)
    "torch.distributed.algorithms.ddp_comm_hooks", "torch.utils.serialization", "xxhash", "titan.guard.ddp",
    "titan.checkpoint.collectives", "titan.checkpoint.snapshot",
)
_MAX_REQUEST = 16 << 20


def _write_state(d: Path, **st: Any) -> None:
    tmp = d / (STATE_NAME + ".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), "t": time.time(), **st}))
    os.replace(tmp, d / STATE_NAME)


def script_imports(path: Path) -> list[str]:
    """Absolute modules a script imports at its top level (``ast``; nothing is executed)."""
    try:
        tree = ast.parse(path.read_text(), str(path))
    except (OSError, SyntaxError, ValueError):
        return []
    out: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append(node.module)
    return list(dict.fromkeys(out))


def _module_source(name: str) -> tuple[list[str], Path | None]:
    """For ``-m name``: the packages to import (never ``name`` itself: it runs as ``__main__``)
    and the source file whose imports to read."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return [], None
    if spec is None or spec.origin in (None, "built-in", "frozen"):
        return [], None
    pkgs = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]
    if spec.submodule_search_locations:  # a package: runpy runs its __main__
        main = Path(next(iter(spec.submodule_search_locations))) / "__main__.py"
        return [*pkgs, name], main if main.is_file() else None
    return pkgs, Path(spec.origin)


def preload(names: list[str]) -> dict[str, Any]:
    """Import ``names`` in order; returns seconds per module and the failures (never raises)."""
    times: dict[str, float] = {}
    failed: dict[str, str] = {}
    for n in names:
        t0 = time.perf_counter()
        try:
            importlib.import_module(n)
        except BaseException as e:  # noqa: BLE001 - a module that fails here fails in the worker too
            failed[n] = f"{type(e).__name__}: {e}"[:300]
            continue
        times[n] = round(time.perf_counter() - t0, 4)
    return {"seconds": times, "failed": failed}


# --- the child: becoming the worker -------------------------------------------------------
def _lifeline(fd: int) -> None:
    import threading

    def watch() -> None:
        while True:
            try:
                if not os.read(fd, 1):
                    break
            except InterruptedError:
                continue
            except OSError:
                break
        try:  # the stub is gone: torchrun can no longer reach this worker; end its group
            os.killpg(0, signal.SIGKILL)
        finally:
            os._exit(137)

    threading.Thread(target=watch, name="titan-warm-lifeline", daemon=True).start()


def _exit_code(e: SystemExit) -> int:
    c = e.code
    if c is None:
        return 0
    if isinstance(c, int):
        return c & 0xFF
    try:
        sys.stderr.write(f"{c}\n")
    except Exception:  # noqa: BLE001
        pass
    return 1


def _run_child(req: dict[str, Any], fds: list[int], keep_closed: list[int]) -> None:
    """In the forked child: become the worker, run it, exit (never returns)."""
    code = 1
    try:
        os.setsid()
        for h in list(log.handlers):  # the zygote's log stays the zygote's
            log.removeHandler(h)
        for fd in keep_closed:
            try:
                os.close(fd)
            except OSError:
                pass
        for i, fd in enumerate(fds[:3]):
            os.dup2(fd, i)
        for fd in fds[:3]:
            if fd > 2:
                os.close(fd)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _lifeline(fds[3])
        env = {str(k): str(v) for k, v in req["env"].items()}
        env[SPAWN_VAR] = "warm"
        os.environ.clear()
        os.environ.update(env)
        os.chdir(req["cwd"])
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.reconfigure(write_through=True)  # python -u
            except (AttributeError, ValueError):
                pass
        _fresh_process_state(env)
        target, args = req["target"], [str(a) for a in req["args"]]
        import runpy

        if req["mode"] == "module":
            sys.argv = [target, *args]
            sys.path[0] = os.getcwd()
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            script = os.path.abspath(target)
            sys.argv = [target, *args]
            sys.path[0] = os.path.dirname(script)
            runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as e:
        code = _exit_code(e)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        _finish()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 130
    except BaseException:  # noqa: BLE001 - as the interpreter does: print, exit 1
        try:
            sys.excepthook(*sys.exc_info())
        except Exception:  # noqa: BLE001
            pass
        code = 1
    _finish()
    os._exit(code)


def _finish() -> None:
    """What the interpreter does at exit: join non-daemon threads, run atexit, flush."""
    import atexit
    import threading

    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001
        pass
    try:
        atexit._run_exitfuncs()
    except Exception:  # noqa: BLE001
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass


def _fresh_process_state(env: dict[str, str]) -> None:
    """What differs between a fork and a new interpreter, made as a new one would have it."""
    import random

    random.seed()  # Python's module reseeds at fork too; NumPy's legacy global does not
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()
    torch = sys.modules.get("torch")
    omp = env.get("OMP_NUM_THREADS", "")
    if torch is not None and omp.isdigit() and int(omp) > 0 and torch.get_num_threads() != int(omp):
        torch.set_num_threads(int(omp))


# --- the server ---------------------------------------------------------------------------
def _recv_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    msg, fds, _flags, _addr = socket.recv_fds(conn, 65536 + 8, 8)
    if len(msg) < 8:
        raise ValueError("short request")
    (n,) = struct.unpack("!Q", msg[:8])
    if n > _MAX_REQUEST:
        raise ValueError(f"request of {n} bytes")
    body = bytearray(msg[8:])
    while len(body) < n:
        chunk = conn.recv(min(65536, n - len(body)))
        if not chunk:
            raise ValueError("request cut short")
        body += chunk
    req = json.loads(bytes(body))
    ok = (isinstance(req, dict) and req.get("mode") in ("script", "module") and isinstance(req.get("target"), str)
          and isinstance(req.get("args"), list) and isinstance(req.get("env"), dict) and isinstance(req.get("cwd"), str))
    if not ok or len(fds) != 4:
        for fd in fds:
            os.close(fd)
        raise ValueError("malformed request")
    return req, list(fds)


def _peer_uid(conn: socket.socket) -> int:
    cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", cred)[1]


def _send(conn: socket.socket, obj: dict[str, Any]) -> None:
    try:
        conn.sendall((json.dumps(obj) + "\n").encode())
    except OSError:
        pass


def serve(d: Path, parent: int) -> int:
    """Accept requests until SIGTERM or the parent is gone; returns the exit code."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append("SIGTERM"))
    old = os.umask(0o077)
    try:
        lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        path = d / SOCKET_NAME
        path.unlink(missing_ok=True)
        lsock.bind(str(path))
    finally:
        os.umask(old)
    lsock.listen(64)
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, stub connection)
    forked = 0
    _write_state(d, state="ready", ready_timeout_s=_READY_TIMEOUT[0], **_PRELOAD_INFO)
    log.info("zygote ready (pid %d)", os.getpid())
    while not stop and os.getppid() == parent:
        try:
            ready, _, _ = select.select([lsock, *children], [], [], 0.5)
        except InterruptedError:
            continue
        for fd in ready:
            if fd is lsock:
                _accept(lsock, children, d)
                forked += 1
            else:
                pid, conn = children.pop(fd)
                try:
                    _, status = os.waitpid(pid, 0)
                except ChildProcessError:
                    status = None
                os.close(fd)
                if status is None:
                    _send(conn, {"code": 1})
                elif os.WIFSIGNALED(status):
                    _send(conn, {"signal": os.WTERMSIG(status)})
                else:
                    _send(conn, {"code": os.waitstatus_to_exitcode(status)})
                conn.close()
    _write_state(d, state="stopped", reason=stop[0] if stop else "parent gone", forked=forked)
    lsock.close()
    (d / SOCKET_NAME).unlink(missing_ok=True)
    return 0


def _accept(lsock: socket.socket, children: dict[int, tuple[int, socket.socket]], d: Path) -> None:
    conn, _ = lsock.accept()
    try:
        if _peer_uid(conn) != os.getuid():
            raise ValueError("peer runs as another user")
        conn.settimeout(10.0)
        req, fds = _recv_request(conn)
        conn.settimeout(None)
    except (OSError, ValueError) as e:
        log.warning("zygote: request refused: %s", e)
        _send(conn, {"error": f"request refused: {e}"})
        conn.close()
        return
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        others = [c.fileno() for _, c in children.values()]
        _run_child(req, fds, [lsock.fileno(), conn.fileno(), *children, *others])
    for fd in fds:
        os.close(fd)
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as e:  # pragma: no cover - Linux >= 5.3 has pidfds
        log.warning("zygote: no pidfd for %d: %s", pid, e)
        _send(conn, {"pid": pid})
        conn.close()
        return
    children[pidfd] = (pid, conn)
    _send(conn, {"pid": pid})


_READY_TIMEOUT = [300.0]
_PRELOAD_INFO: dict[str, Any] = {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m titan.warm.zygote")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--preload", default="")
    ap.add_argument("--script")
    ap.add_argument("--module")
    ap.add_argument("--ready-timeout", type=float, default=300.0)
    ap.add_argument("--parent", type=int, default=os.getppid())
    a = ap.parse_args(argv)
    handler = logging.StreamHandler(sys.stderr)  # not the root logger's: the workers configure their own
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    d = Path(a.dir)
    _READY_TIMEOUT[0] = a.ready_timeout
    _write_state(d, state="starting", ready_timeout_s=a.ready_timeout)
    t0 = time.perf_counter()
    names = list(DEFAULT_PRELOAD)
    src: Path | None = None
    if a.module:
        pkgs, src = _module_source(a.module)
        names += pkgs
    elif a.script:
        src = Path(a.script)
    if src is not None:
        names += script_imports(src)
    names += [m.strip() for m in a.preload.split(",") if m.strip()]
    info = preload(list(dict.fromkeys(names)))
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        _write_state(d, state="failed", reason="CUDA was initialised while importing the preloaded modules "
                     "(a forked worker could not use it); workers start cold")
        return 3
    _PRELOAD_INFO.update({"preload_s": round(time.perf_counter() - t0, 3), "preloaded": len(info["seconds"]),
                          "preload_failed": info["failed"]})
    try:
        return serve(d, a.parent)
    except BaseException as e:  # noqa: BLE001 - the stubs must learn it and go cold
        _write_state(d, state="failed", reason=f"{type(e).__name__}: {e}")
        raise


if __name__ == "__main__":
    sys.exit(main())
