"""Launcher options of ``titan run`` and the torchrun argv built from them.

Everything here is checked *before* anything is written: a bad option is a
``UserError`` (one line + hint), never a torchrun usage dump.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from titan.errors import UserError
from titan.settings import Settings

__all__ = ["LaunchOptions", "Entrypoint", "parse_entrypoint", "torchrun_argv", "parse_torchrun", "rdzv_conf"]

_NNODES = re.compile(r"^(\d+)(?::(\d+))?$")
_BACKENDS = ("c10d", "static", "etcd", "etcd-v2")
#: Bounds on the job's shape: more is a typo (and torchrun would try to build it: a
#: trillion workers grew the launcher to 6 GB before failing).
MAX_NPROC_PER_NODE = 1024
MAX_NODES = 100_000
#: ``--rdzv-conf`` keys torch's rendezvous handlers read, by value type (others are refused).
_CONF_SECONDS = ("join_timeout", "last_call_timeout", "close_timeout", "heartbeat_timeout", "keep_alive_interval",
                 "read_timeout", "timeout")
_CONF_INTS = ("keep_alive_max_attempt", "rank")
_CONF_BOOLS = ("is_host", "use_libuv")
_CONF_STRS = ("store_type", "protocol", "cacert", "ca_cert", "cert", "key", "ssl_cert", "ssl_cert_key", "etcd_prefix")


@dataclasses.dataclass(frozen=True)
class Entrypoint:
    """What each worker runs: a script path or ``-m module``, plus its arguments."""

    target: str
    args: tuple[str, ...]
    module: bool = False

    def describe(self) -> str:
        return ("-m " if self.module else "") + " ".join((self.target, *self.args))


@dataclasses.dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """``titan run``'s own launcher options (settings-backed ones live in ``settings.run``)."""

    nproc_per_node: str = "1"
    nnodes: str = "1"
    rdzv_backend: str = "c10d"
    rdzv_endpoint: str | None = None
    rdzv_id: str | None = None
    rdzv_conf: str | None = None
    local_addr: str | None = None
    run_id: str | None = None
    #: The job secret's file (``--rdzv-secret-file``); else TITAN_RDZV_SECRET_FILE / TITAN_RDZV_SECRET.
    rdzv_secret_file: str | None = None
    #: ``--insecure-rdzv``: torch's stock, unauthenticated rendezvous (see ``launch.secure``).
    insecure_rdzv: bool = False

    @property
    def min_max_nodes(self) -> tuple[int, int]:
        m = _NNODES.match(self.nnodes.strip())
        if not m:
            raise UserError(f"--nnodes {self.nnodes!r} is not N or MIN:MAX", "e.g. --nnodes 2 or --nnodes 1:4")
        lo = int(m.group(1))
        hi = int(m.group(2) or lo)
        if not 0 < lo <= hi:
            raise UserError(f"--nnodes {self.nnodes!r}: need 0 < MIN <= MAX", "e.g. --nnodes 1:4")
        return lo, hi

    def validate(self) -> None:
        """Raise ``UserError`` for an option torchrun would reject or misread."""
        from titan.inputs import check_host, check_host_port, check_id

        n = self.nproc_per_node.strip()
        if n not in ("auto", "cpu", "gpu") and not (n.isdigit() and 1 <= int(n) <= MAX_NPROC_PER_NODE):
            raise UserError(f"--nproc-per-node {self.nproc_per_node!r} is not a number within 1 … {MAX_NPROC_PER_NODE}",
                            f"give the workers per node within 1 … {MAX_NPROC_PER_NODE}, e.g. --nproc-per-node 2 "
                            "(or auto, cpu, gpu)")
        _, hi = self.min_max_nodes
        if hi > MAX_NODES:
            raise UserError(f"--nnodes {self.nnodes!r}: at most {MAX_NODES:,} nodes", f"give MIN:MAX within 1 … {MAX_NODES:,}")
        if self.rdzv_backend not in _BACKENDS:
            raise UserError(f"unknown --rdzv-backend {self.rdzv_backend!r}", f"use one of {', '.join(_BACKENDS)} (c10d is the default)")
        if hi > 1 and not self.rdzv_endpoint:
            raise UserError(f"--nnodes {self.nnodes} needs --rdzv-endpoint HOST:PORT",
                            "run the same command on every node with the same --rdzv-endpoint and --run-id")
        if self.rdzv_endpoint:
            check_host_port(self.rdzv_endpoint, "--rdzv-endpoint")
        if self.rdzv_id:
            check_id(self.rdzv_id, "rendezvous id (--rdzv-id)")
        if self.local_addr:
            check_host(self.local_addr, "--local-addr")
        if hi > 1 and not (self.run_id or self.rdzv_id):
            raise UserError("a multi-node run needs --run-id (the same on every node)",
                            "e.g. --run-id exp42; it names the run directory and the rendezvous")
        rdzv_conf(self.rdzv_conf)  # validates


def rdzv_conf(extra: str | None, settings: Settings | None = None) -> str:
    """The rendezvous config string: Titan's tuned values, then the user's ``--rdzv-conf``."""
    conf: dict[str, str] = {}
    if settings is not None:
        r = settings.run
        conf.update({
            "last_call_timeout": _num(r.rdzv_last_call_timeout_s),
            "keep_alive_interval": _num(r.rdzv_keep_alive_interval_s),
            "keep_alive_max_attempt": str(r.rdzv_keep_alive_max_attempt),
            "join_timeout": _num(r.rdzv_join_timeout_s),
        })
    for item in (extra or "").split(","):
        if not item.strip():
            continue
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise UserError(f"--rdzv-conf item {item!r} is not KEY=VALUE", "e.g. --rdzv-conf is_host=1,read_timeout=60")
        conf[k.strip()] = _conf_value(k.strip(), v.strip())
    return ",".join(f"{k}={v}" for k, v in conf.items())


def _conf_value(key: str, value: str) -> str:
    """Check one ``--rdzv-conf`` value the way torch will read it (``int()``, bool words)."""
    from titan.settings.core import MAX_SECONDS

    if key in _CONF_SECONDS or key in _CONF_INTS:
        lo, hi = (1, int(MAX_SECONDS)) if key in _CONF_SECONDS else (0 if key == "rank" else 1, 1_000_000)
        if not (value.isdigit() and lo <= int(value) <= hi):
            raise UserError(f"--rdzv-conf {key}={value!r} is not a whole number within {lo:,} … {hi:,}",
                            f"give {key} as whole {'seconds' if key in _CONF_SECONDS else 'number'} within {lo:,} … {hi:,}")
    elif key in _CONF_BOOLS:
        if value.lower() not in ("1", "0", "true", "false", "t", "f", "yes", "no", "y", "n"):
            raise UserError(f"--rdzv-conf {key}={value!r} is not a boolean", f"give {key}=1 or {key}=0")
    elif key not in _CONF_STRS:
        raise UserError(f"unknown --rdzv-conf key {key!r}",
                        f"known keys: {', '.join(sorted(_CONF_SECONDS + _CONF_INTS + _CONF_BOOLS + _CONF_STRS))}")
    return value


def _num(x: float) -> str:
    # torchrun parses these with int(); whole seconds are all it accepts.
    return str(max(1, int(round(x))))


def parse_entrypoint(command: Sequence[str], cwd: Path) -> Entrypoint:
    """``script.py args`` or ``-m module args`` → Entrypoint; ``UserError`` if missing."""
    cmd = list(command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UserError("no training script given", "usage: titan run [options] -- script.py [args] (or -- -m module [args])")
    if cmd[0] in ("-m", "--module"):
        if len(cmd) < 2:
            raise UserError("-m needs a module name", "e.g. titan run -- -m titan.workloads.tinygpt --steps 50")
        module = cmd[1]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found and not (cwd / Path(*module.split("."))).with_suffix(".py").is_file() \
                and not (cwd / Path(*module.split(".")) / "__main__.py").is_file():
            raise UserError(f"module {module!r} not found", "check the name, or that its package is installed / in the current folder")
        return Entrypoint(module, tuple(cmd[2:]), module=True)
    if cmd[0].startswith("-"):
        raise UserError(f"unknown launcher option {cmd[0]!r}", "launcher options go before `--`; see `titan run --help`")
    script = cwd / cmd[0]
    if not script.is_file():
        raise UserError(f"training script {cmd[0]!r} does not exist", f"looked for {script}; give a path relative to the current folder")
    return Entrypoint(str(script.resolve()), tuple(cmd[1:]))


def torchrun_argv(opts: LaunchOptions, settings: Settings, entry: Entrypoint, *, rdzv_id: str,
                  event_handler: str, no_python: bool = False) -> list[str]:
    """The argv for ``torch.distributed.run.parse_args`` (torchrun's own flags).

    ``no_python``: ``entry.target`` is the executable itself (the warm-worker stub)."""
    lo, hi = opts.min_max_nodes
    argv = [
        "--nproc-per-node", opts.nproc_per_node,
        "--nnodes", opts.nnodes,
        "--max-restarts", str(settings.run.max_restarts),
        "--monitor-interval", repr(float(settings.run.monitor_interval_s)),
        "--event-log-handler", event_handler,
        "--rdzv-conf", rdzv_conf(opts.rdzv_conf, settings),
    ]
    if opts.rdzv_endpoint:
        argv += ["--rdzv-backend", opts.rdzv_backend, "--rdzv-endpoint", opts.rdzv_endpoint, "--rdzv-id", rdzv_id]
    elif hi == 1:
        # One node: torchrun's --standalone (c10d store on a free local port).
        argv += ["--standalone"]
    if opts.local_addr:
        argv += ["--local-addr", opts.local_addr]
    if no_python:
        argv += ["--no-python"]
    elif entry.module:
        argv += ["-m"]
    argv += [entry.target, *entry.args]
    return argv


def parse_torchrun(argv: list[str]) -> Any:
    """``torch.distributed.run.parse_args`` that turns its ``SystemExit`` into ``UserError``."""
    from torch.distributed import run as tdr

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return tdr.parse_args(argv)
    except SystemExit:
        lines = [ln for ln in err.getvalue().splitlines() if "error:" in ln]
        msg = lines[-1].split("error:", 1)[1].strip() if lines else "torchrun rejected the launcher options"
        raise UserError(f"invalid launcher options: {msg}", "see `titan run --help`") from None
    finally:
        sys.stderr.flush()
