"""The launcher's side of warm workers: start this node's zygote, point torchrun at the stub.

``titan run`` builds torchrun's argv with :func:`stub_entrypoint` (``--no-python``: torchrun
starts ``python -S -I -u stub.py MODE TARGET ARGS`` where it would have started ``python -u
TARGET ARGS``) and runs :class:`WarmPool` around its agent. The pool starts the zygote in a
private folder (0700, under ``$TMPDIR`` — a Unix socket path must stay under 108 bytes),
starts it again when it dies (at most ``warm.max_respawns`` times; meanwhile workers start
cold), and stops it and removes the folder at the end. torchrun's agent, its rendezvous and
its restart loop are unchanged: the agent still starts, watches and stops one process per
worker — the stub — and the stub mirrors its worker.

Cost: one extra Python process per node holding the imports (shared copy-on-write with the
workers it forks); nothing on the training path.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Mapping

from titan.settings.env import TITAN_WARM_DIR
from titan.warm.stub import STATE_NAME

__all__ = ["WarmPool", "stub_entrypoint", "STUB_PATH"]

#: The stub, run by path (standard library only).
STUB_PATH = str(Path(__file__).with_name("stub.py"))
_MAX_SOCK_DIR = 90  # + "/zygote.sock" stays within AF_UNIX's 107 bytes


@dataclasses.dataclass(frozen=True)
class StubEntry:
    """What torchrun runs instead of the script (with ``--no-python``)."""

    target: str
    args: tuple[str, ...]


def stub_entrypoint(target: str, args: tuple[str, ...] | list[str], module: bool) -> StubEntry:
    """The executable and arguments torchrun starts for each worker under warm spawn."""
    return StubEntry(sys.executable, ("-S", "-I", "-u", STUB_PATH, "module" if module else "script", target, *args))


def _private_dir() -> Path:
    for base in (tempfile.gettempdir(), "/tmp"):
        if len(base) <= _MAX_SOCK_DIR - 20 and os.path.isdir(base):
            return Path(tempfile.mkdtemp(prefix="titan-warm-", dir=base))
    raise OSError("no temporary folder with a path short enough for a Unix socket")


class WarmPool:
    """This node's zygote for one ``titan run``. ``emit(kind, msg, level=, data=)`` records
    ``launcher.warm`` events; ``log_path`` receives the zygote's output."""

    def __init__(self, cfg: Any, *, target: str, module: bool, env: Mapping[str, str], log_path: Path,
                 emit: Callable[..., None]) -> None:
        self.cfg, self.target, self.module = cfg, target, module
        self._env = dict(env)
        self.log_path = log_path
        self._emit = emit
        self.dir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.respawns = 0
        self._stop = threading.Event()
        self._watch: threading.Thread | None = None
        self._reported_ready = False

    def env(self) -> dict[str, str]:
        """What the workers' environment needs (the stubs find the zygote with it)."""
        return {TITAN_WARM_DIR: str(self.dir)} if self.dir is not None else {}

    def _command(self) -> list[str]:
        cmd = [sys.executable, "-m", "titan.warm.zygote", "--dir", str(self.dir), "--ready-timeout",
               repr(float(self.cfg.ready_timeout_s)), "--parent", str(os.getpid())]
        if self.cfg.preload:
            cmd += ["--preload", self.cfg.preload]
        if self.cfg.preload_script_imports:
            cmd += ["--module" if self.module else "--script", self.target]
        return cmd

    def _spawn(self) -> None:
        assert self.dir is not None
        (self.dir / STATE_NAME).unlink(missing_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self._command(), env=self._env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log, start_new_session=True, cwd=os.getcwd())

    def start(self) -> "WarmPool":
        """Create the private folder and start the zygote (returns at once; it imports in the
        background while torchrun rendezvouses). Raises ``OSError`` when it cannot start."""
        self.dir = _private_dir()
        os.chmod(self.dir, 0o700)
        self._spawn()
        self._emit("launcher.warm", f"zygote started (pid {self.proc.pid}); workers are forked from it "
                   "once it has imported torch and the script's imports", data={
                       "event": "started", "pid": self.proc.pid, "dir": str(self.dir), "log": str(self.log_path)})
        self._watch = threading.Thread(target=self._watch_loop, name="titan-warm-watch", daemon=True)
        self._watch.start()
        return self

    def state(self) -> dict[str, Any]:
        try:
            return json.loads((self.dir / STATE_NAME).read_text()) if self.dir else {}
        except (OSError, ValueError):
            return {}

    def _watch_loop(self) -> None:
        while not self._stop.wait(0.2):
            st = self.state()
            if not self._reported_ready and st.get("state") in ("ready", "failed"):
                self._reported_ready = True
                ok = st["state"] == "ready"
                self._emit("launcher.warm", (f"zygote ready: {st.get('preloaded')} modules imported in "
                                             f"{st.get('preload_s')} s") if ok else f"zygote failed: {st.get('reason')}; "
                           "workers start cold", level="info" if ok else "warning",
                           data={"event": st["state"], **{k: v for k, v in st.items() if k != "state"}})
            proc = self.proc
            if proc is None or proc.poll() is None or self._stop.is_set():
                continue
            if st.get("state") == "failed" or self.respawns >= self.cfg.max_respawns:
                self._emit("launcher.warm", f"zygote exited ({proc.returncode}); workers start cold from now on",
                           level="warning", data={"event": "gone", "exit_code": proc.returncode,
                                                  "respawns": self.respawns, "reason": st.get("reason")})
                self.proc = None
                continue
            self.respawns += 1
            self._reported_ready = False
            self._emit("launcher.warm", f"zygote died ({proc.returncode}); starting it again "
                       f"({self.respawns}/{self.cfg.max_respawns}); meanwhile workers start cold", level="warning",
                       data={"event": "respawn", "exit_code": proc.returncode, "respawns": self.respawns})
            self._spawn()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the zygote (SIGTERM, then SIGKILL) and remove its folder."""
        self._stop.set()
        if self._watch is not None:
            self._watch.join(2.0)
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout_s)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "WarmPool":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
