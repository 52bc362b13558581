"""``titan run``'s engine: run directory, ``run.json``, environment, torchrun, outcome.

Cost: one in-process call of ``torch.distributed.run.run`` (torchelastic's agent runs in
this process and spawns the workers); a few small file writes around it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import platform
import signal
import socket
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from titan import __version__
from titan.errors import TitanAbort, UserError
from titan.events import RunDir, default_node_id
from titan.exitcodes import ExitCode
from titan.events.abort import AbortRequest, abort_file
from titan.launch.conclude import Conclusion, conclude
from titan.launch.diskspace import DiskWatch, Reserve, disk_state, is_disk_full
from titan.launch.cluster import ClusterRefused, ClusterServices
from titan.launch.agent import STOP_CODES, _AbortRestart, _error_message, patched_agent
from titan.launch.options import Entrypoint, LaunchOptions, parse_torchrun, rdzv_conf, torchrun_argv
from titan.launch.recorder import HANDLER_NAME, LauncherRecorder, install_elastic_handler, signal_name
from titan.launch.restarts import RestartPolicy, clear_stale_giveup
from titan.launch.secure import DISABLE_SHARED_STORE_VAR, SecurityPlan, plan_security
from titan.settings import Settings
from titan.settings.env import TITAN_NODE_ID, TITAN_RUN_DIR, TITAN_RUN_ID, TITAN_SETTINGS_JSON
from titan.watchdog.launch_hooks import refuse_if_excluded, watching  # issue 5
from titan.beacon import beacon_dir

__all__ = ["LaunchResult", "prepare", "launch", "DISABLE_SHARED_STORE_VAR"]

log = logging.getLogger(__name__)
_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


@dataclasses.dataclass
class LaunchResult:
    """How one ``titan run`` ended."""

    exit_code: ExitCode
    run_dir: RunDir
    node: str
    restarts: int
    failures: list[dict[str, Any]]
    torchrun: dict[str, Any]
    abort: dict[str, Any] | None = None
    restart_policy: dict[str, Any] = dataclasses.field(default_factory=dict)
    conclusion: Conclusion | None = None  # root causes vs consequences, workers' facts, final line


@dataclasses.dataclass
class Prepared:
    opts: LaunchOptions
    settings: Settings
    entry: Entrypoint
    node: str
    run_id: str
    rdzv_id: str
    argv: list[str]
    targs: Any
    security: SecurityPlan


def prepare(opts: LaunchOptions, settings: Settings, entry: Entrypoint,
            environ: Mapping[str, str] | None = None) -> Prepared:
    """Validate everything; writes nothing. Raises ``UserError``."""
    from titan.events.rundir import check_id, new_run_id

    opts.validate()
    node = check_id(settings.run.node_id or default_node_id(), "node id")
    run_id = check_id(opts.run_id or new_run_id(), "run id")
    rdzv_id = opts.rdzv_id or run_id
    # titan.launch.secure (issue 16): signed rendezvous, stores bound to the address asked for.
    sec = plan_security(backend=opts.rdzv_backend, endpoint=opts.rdzv_endpoint, multi_node=opts.min_max_nodes[1] > 1,
                        local_addr=opts.local_addr, secret_file=opts.rdzv_secret_file, insecure=opts.insecure_rdzv,
                        disable_shared_store=settings.run.disable_shared_rdzv_store,
                        environ=os.environ if environ is None else environ)
    if sec.wrapped:
        from titan.launch.rdzv_auth import check_private_api

        check_private_api()
    topts = dataclasses.replace(opts, rdzv_backend=sec.torch_backend, rdzv_endpoint=sec.endpoint,
                                local_addr=sec.listen.addr)
    if settings.warm.enabled:  # titan.warm (issue 23): torchrun starts a stub the zygote forks a worker for
        from titan.warm import stub_entrypoint

        stub = stub_entrypoint(entry.target, entry.args, entry.module)
        argv = torchrun_argv(topts, settings, Entrypoint(stub.target, stub.args), rdzv_id=rdzv_id,
                             event_handler=HANDLER_NAME, no_python=True)
    else:
        argv = torchrun_argv(topts, settings, entry, rdzv_id=rdzv_id, event_handler=HANDLER_NAME)
    targs = parse_torchrun(argv)
    return Prepared(opts, settings, entry, node, run_id, rdzv_id, argv, targs, sec)


@contextlib.contextmanager
def _scoped_process_state(environ: Mapping[str, str]) -> Iterator[None]:
    """Give this process (and so the workers) ``environ``; restore env and signal handlers after."""
    saved_env = dict(os.environ)
    saved_sigs = {}
    for name in _SIGNALS:
        with contextlib.suppress(ValueError, AttributeError):
            saved_sigs[name] = signal.getsignal(getattr(signal, name))
    os.environ.clear()
    os.environ.update(environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        for name, h in saved_sigs.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(getattr(signal, name), h)


@contextlib.contextmanager
def _run_json_lock(rd: RunDir) -> Iterator[None]:
    """Serialise read-modify-write of run.json between nodes sharing one run directory."""
    import fcntl

    fd = os.open(rd.path / ".run.json.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _merge_run_json(rd: RunDir, node: str, node_info: Mapping[str, Any], updates: Mapping[str, Any]) -> None:
    with _run_json_lock(rd):
        nodes = dict(rd.read_run_json().get("nodes") or {})
        nodes[node] = dict(node_info)
        rd.update_run_json({**updates, "nodes": nodes})


def _final_run_json(rd: RunDir, node: str, node_info: Mapping[str, Any], updates: Mapping[str, Any]) -> None:
    """The last run.json write; a full disk is said in one line instead of a traceback."""
    try:
        _merge_run_json(rd, node, node_info, updates)
    except OSError as e:
        if not is_disk_full(e):
            raise
        log.error("run.json not finalised: %s is full (%s); it still says 'running'", rd.path, e.strerror)


def _versions() -> dict[str, str]:
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "titan": __version__}


def launch(p: Prepared, *, runs_root: Path, command: Sequence[str], base_env: Mapping[str, str],
           cwd: Path, on_run_dir: Callable[[RunDir], None] | None = None,
           on_capabilities: Callable[[list[Any]], None] | None = None,
           say: Callable[[str], None] | None = None) -> LaunchResult:
    """Create the run directory, run torchrun's agent in-process, record and map the outcome.

    ``on_capabilities`` gets, after the workers' first steps, which capabilities are live
    (``titan.launch.capabilities``; also a ``launcher.capabilities`` event). ``say`` prints a
    start line that is known only once the rendezvous formed (the storage). Raises
    ``UserError`` (after run.json is final) when the cluster refuses the job's storage.
    """
    import torch
    from torch.distributed import run as tdr
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    rd = RunDir.create(runs_root, p.run_id)
    if on_run_dir is not None:
        on_run_dir(rd)
    only_node = p.opts.min_max_nodes[1] == 1  # excluding it ends the job: a give-up, not a silent stop
    try:
        refuse_if_excluded(rd, p.node, p.settings, only_node=only_node)  # an excluded node does not join
    except TitanAbort as e:
        _merge_run_json(rd, p.node, {"exit_code": e.exit_code}, {
            "run_id": rd.run_id, "status": "finished", "exit_code": e.exit_code, "exit_name": ExitCode(e.exit_code).name,
            "abort": {"reason": e.message, "hint": e.hint, "by": "node ledger"}})
        raise
    with contextlib.suppress(FileNotFoundError):
        abort_file(rd, p.node).unlink()  # a stale request from an earlier launch of this node
    clear_stale_giveup(rd)  # an earlier launch's give-up; a resubmission gets a fresh decision
    settings = p.settings
    env = dict(base_env)
    env.update({TITAN_RUN_DIR: str(rd.path.resolve()), TITAN_RUN_ID: rd.run_id, TITAN_NODE_ID: p.node,
                TITAN_SETTINGS_JSON: settings.to_json()})
    p.security.apply_env(env, disable_shared_store=settings.run.disable_shared_rdzv_store)
    if p.entry.module:
        env["PYTHONPATH"] = os.pathsep.join(x for x in (str(cwd), env.get("PYTHONPATH", "")) if x)
    nproc = p.targs.nproc_per_node
    omp = env.get("OMP_NUM_THREADS") or ("1" if str(nproc).isdigit() and int(nproc) > 1 else None)
    started = time.time()
    node_info = {
        "hostname": socket.gethostname(), "pid": os.getpid(), "started_at": started,
        "threads": {"omp_num_threads_workers": omp, "launcher_intra_op": torch.get_num_threads(),
                    "cpu_count": os.cpu_count()},
        "torchrun_argv": p.argv,
    }
    _merge_run_json(rd, p.node, node_info, {
        "run_id": rd.run_id, "command": list(command), "entrypoint": p.entry.describe(),
        "settings": settings.to_dict(), "settings_sources": settings.sources, "versions": _versions(),
        "hostname": node_info["hostname"], "node_id": p.node, "threads": node_info["threads"],
        "launcher": {"nproc_per_node": nproc, "nnodes": p.opts.nnodes, "rdzv_backend": p.targs.rdzv_backend,
                     "rdzv_endpoint": p.targs.rdzv_endpoint, "rdzv_id": p.rdzv_id,
                     "rdzv_conf": rdzv_conf(p.opts.rdzv_conf, settings),
                     "max_restarts": settings.run.max_restarts, "local_addr": p.opts.local_addr,
                     DISABLE_SHARED_STORE_VAR: env.get(DISABLE_SHARED_STORE_VAR)},
        "security": p.security.to_dict(),
        "started_at": started, "status": "running",
    })
    reserve = Reserve(rd.path)  # room for the final run.json and launcher.finished on a full disk
    diskwatch = DiskWatch(rd.path)  # a disk that went full and was freed again is still said
    rec = LauncherRecorder(rd, p.node)
    rec.emit("launcher.started", f"titan run: {p.entry.describe()}", data={
        "nproc_per_node": nproc, "nnodes": p.opts.nnodes, "max_restarts": settings.run.max_restarts,
        "pid": os.getpid(), "torchrun_argv": p.argv})
    rec.emit("launcher.security", "; ".join(p.security.describe()),
             level="warning" if p.security.insecure or (p.security.secret and p.security.secret.warnings) else "info",
             data=p.security.to_dict())
    # titan.launch.cluster (issue 20): the storage probe each round, the replica server.
    cluster = ClusterServices(run_id=rd.run_id, node=p.node, settings=settings, security=p.security,
                              root=cwd / (settings.checkpoint.dir or rd.checkpoints), multi_node=not only_node,
                              nnodes=p.opts.min_max_nodes, record=lambda upd: _merge_run_json(rd, p.node, node_info, upd), emit=rec.emit, say=say)
    refused: UserError | None = None
    aborts: list[AbortRequest] = []
    policy = RestartPolicy(rd, settings.watchdog, rec.emit)  # backoff / give-up before each restart
    caps = _capability_watch(rd, p, settings, rec, on_capabilities)
    raw: dict[str, Any] = {}
    install_elastic_handler(rec)
    try:
        # titan.watchdog (issue 5): the hang/straggler watchdog runs beside the agent
        with diskwatch, cluster.serving(env), _warm_pool(p, rd, env, omp, rec), _scoped_process_state(env), \
                patched_agent(rec, aborts.append, policy, settings.run.consequence_grace_s,
                              beacon_dir(rd.path, settings.watchdog.beacon_dir)), \
                watching(rd, p.node, settings, only_node=only_node), \
                _node_agent(rd, p.node, settings, p.security.agent_env(env), rec), \
                p.security.rendezvous(lambda kind, msg, data: rec.emit(kind, msg, level="error", data=data),
                                      before_join=[cluster.before_join], after_join=[cluster.after_join]):
            try:
                tdr.run(p.targs)
                raw = {"outcome": "succeeded", "exit_code": 0}
            except ChildFailedError as e:
                raw = {"outcome": "child_failed", "exit_code": 1, "failures": {
                    str(r): {"exit_code": f.exitcode, "signal": signal_name(f.exitcode), "pid": f.pid,
                             "local_rank": f.local_rank, "message": _error_message({"message": f.message}),
                             "error_file": f.error_file}
                    for r, f in e.failures.items()}}
            except SignalException as e:
                raw = {"outcome": "signal", "exit_code": 128 + int(e.sigval), "signal": signal.Signals(e.sigval).name}
            except _AbortRestart:
                raw = {"outcome": "aborted", "exit_code": 1}
            except ClusterRefused as e:  # storage (every node alike) or this node excluded, before workers start
                refused = e
                raw = {"outcome": "refused", "exit_code": int(ExitCode.USER_ERROR), "error": e.message}
            except Exception as e:  # rendezvous timeouts, store errors: the job failed
                log.debug("torchrun failed", exc_info=True)
                raw = {"outcome": "error", "exit_code": 1, "error": f"{type(e).__name__}: {e}"}
    finally:
        install_elastic_handler(None)
        caps.stop()
    code = _map_outcome(raw, aborts, rec)
    finished = time.time()
    # The job is over (no restart follows): its /dev/shm snapshots are RAM, free them.
    from titan.checkpoint.snapshot import discard_run_snapshots

    if discard_run_snapshots(Path(settings.checkpoint.snapshot_dir), rd.path, rd.run_id, started):
        rec.emit("launcher.snapshots_freed", "in-memory snapshots of this run removed from "
                 f"{settings.checkpoint.snapshot_dir}")
    abort = dict(aborts[0]) if aborts else None
    disk = diskwatch.merge(disk_state(rd.path))
    reserve.release()  # the final writes below fit even when the workers filled the disk
    end = conclude(code, rd, p.node, started, rec.failures, abort, disk)  # exit 9 only with the save on disk; causes
    code = end.exit_code
    rec.emit("launcher.finished", f"titan run finished: {code.name}", level="info" if code in (
        ExitCode.SUCCEEDED, ExitCode.PREEMPTED) else "error", data={
        "exit_code": int(code), "exit_name": code.name, "restarts": rec.restarts, "failures": len(rec.failures),
        "torchrun": raw, "duration_s": round(finished - started, 3), "abort": abort,
        "restart_policy": policy.summary(), **end.data()})
    rec.close()
    node_info.update({"finished_at": finished, "exit_code": int(code), "restarts": rec.restarts})
    _final_run_json(rd, p.node, node_info, {
        "torchrun": raw, "exit_code": int(code), "exit_name": code.name, "finished_at": finished,
        "duration_s": round(finished - started, 3), "restarts": rec.restarts, "failures": end.failures,
        "abort": abort, "status": "finished", **end.data(),
        "worker_pids": {str(a): {str(r): pid for r, pid in m.items()} for a, m in rec.worker_pids.items()},
    })
    if refused is not None:
        raise refused
    return LaunchResult(code, rd, p.node, rec.restarts, end.failures, raw, abort, policy.summary(), end)


def _capability_watch(rd: RunDir, p: Prepared, settings: Settings, rec: LauncherRecorder,
                      on_report: Callable[[list[Any]], None] | None) -> Any:
    """Start the report of which capabilities are live (one node: its ranks are 0..nproc-1)."""
    from titan.beacon import beacon_dir
    from titan.launch.capabilities import CapabilityWatch

    nproc = str(p.targs.nproc_per_node)
    ranks = range(int(nproc)) if nproc.isdigit() and str(p.opts.nnodes) == "1" else None
    return CapabilityWatch(rd, p.node, ranks=ranks, watchdog_on=settings.watchdog.enabled,
                           beacon_dir=beacon_dir(rd.path, settings.watchdog.beacon_dir), emit=rec.emit,
                           on_report=on_report).start()


@contextlib.contextmanager
def _warm_pool(p: Prepared, rd: RunDir, env: dict[str, str], omp: str | None, rec: LauncherRecorder) -> Iterator[None]:
    """This node's zygote (``titan.warm``) for the whole launch; adds its folder to ``env``.

    A zygote that cannot start is reported; the stubs then start every worker cold."""
    if not p.settings.warm.enabled:
        yield
        return
    from titan.warm import WarmPool

    zenv = dict(env)
    if omp is not None:
        zenv["OMP_NUM_THREADS"] = omp  # what torchrun gives the workers: the zygote imports torch with it
    pool = WarmPool(p.settings.warm, target=p.entry.target, module=p.entry.module, env=zenv,
                    log_path=rd.path / f"warm.{p.node}.log", emit=rec.emit)
    try:
        pool.start()
        env.update(pool.env())
    except OSError as e:
        rec.emit("launcher.warm", f"zygote did not start: {e}; workers start cold", level="warning",
                 data={"event": "failed", "reason": str(e)})
    try:
        yield
    finally:
        pool.stop()


@contextlib.contextmanager
def _node_agent(rd: RunDir, node: str, settings: Settings, env: Mapping[str, str],
                rec: LauncherRecorder) -> Iterator[None]:
    """Run ``titan agent`` beside the workers (``run.start_agent``; ``titan run --no-agent``).

    The agent never imports torch; a failure to start it is reported, never fatal.
    """
    if not settings.run.start_agent:
        yield
        return
    from titan.monitor.spawn import start_agent, stop_agent

    proc = None
    try:
        proc = start_agent(rd, node, settings_json=settings.to_json(), env=env)
        rec.emit("launcher.agent", f"node agent started (pid {proc.pid})", data={"pid": proc.pid})
    except OSError as e:
        rec.emit("launcher.agent", f"node agent did not start: {e}", level="warning", data={"error": str(e)})
    try:
        yield
    finally:
        if proc is not None:
            stop_agent(proc)


def _map_outcome(raw: Mapping[str, Any], aborts: list[AbortRequest], rec: LauncherRecorder) -> ExitCode:
    outcome = raw.get("outcome")
    if outcome == "succeeded":  # every worker finished; an abort that came too late is moot
        return ExitCode.SUCCEEDED
    if outcome == "refused":
        return ExitCode.USER_ERROR
    if aborts:
        return aborts[0].exit_code
    if outcome == "signal":
        # SIGTERM to the launcher is how schedulers preempt; the agent forwarded it.
        return ExitCode.PREEMPTED if raw.get("signal") == "SIGTERM" else ExitCode.INTERRUPTED
    codes = {int(f.get("exit_code", 0)) for f in (raw.get("failures") or {}).values()}
    for c, ec in STOP_CODES.items():
        if c in codes:
            return ec
    return ExitCode.JOB_FAILED
