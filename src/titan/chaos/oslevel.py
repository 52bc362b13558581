"""OS-level fault injectors, applied from outside the job: signals, disk, CPU/memory stress.

Each injector does the real thing (a signal by PID, a full tmpfs, a FUSE mount whose fsync
sleeps, bytes overwritten in a checkpoint file, stress-ng) and writes one ``inject.<kind>``
event — the ground truth a drill judges against — into ``events/chaos.<node>.jsonl`` of the
run directory. Every injector returns an ``undo`` callable (or ``None``) that heals the
fault; drills call every undo in ``finally``. Mounting needs root; each function raises
``TitanError`` with the reason when the machine cannot do it.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from titan.chaos.netns import run_checked
from titan.errors import TitanError
from titan.events import EventWriter, RunDir

__all__ = ["Injection", "emit_inject", "send_signal", "mount_tmpfs", "fill_disk", "mount_slow_fs",
           "set_fsync_delay", "damage_newest_checkpoint", "start_stress", "unmount"]

log = logging.getLogger(__name__)

Undo = Callable[[], None]


class Injection(dict):  # type: ignore[type-arg]
    """What an injector did (the data of its ``inject.*`` event)."""


def emit_inject(rd: RunDir, node: str, kind: str, msg: str, *, step: int | None = None,
                rank: int | None = None, level: str = "warning", **data: Any) -> Injection:
    """Write ``inject.<kind>`` to ``events/chaos.<node>.jsonl`` (one O_APPEND write)."""
    info = Injection(data, t_inject=time.time(), rank=rank, node=node, injected=True)
    with EventWriter(rd.events_dir / f"chaos.{node}.jsonl", run=rd.run_id, node=node) as w:
        w.emit(f"inject.{kind}", msg, level=level, step=step, data=dict(info))
    return info


def send_signal(rd: RunDir, node: str, pid: int, sig: str = "SIGKILL", *, kind: str = "kill",
                rank: int | None = None, step: int | None = None, parents: Sequence[int] = (),
                attempt: int | None = None, **extra: Any) -> Injection:
    """Send ``sig`` to ``pid`` (checked to descend from one of ``parents`` when given — the
    job's launchers); ``inject.<kind>``. Raises ``TitanError`` when the process is not ours
    or already gone."""
    import psutil

    signum = getattr(signal, sig)
    try:
        proc = psutil.Process(pid)
        if parents and not {p.pid for p in proc.parents()} & set(parents):
            raise TitanError(f"pid {pid} is not a worker of launcher(s) {list(parents)}; refusing to signal it")
    except psutil.NoSuchProcess:
        raise TitanError(f"pid {pid} is already gone") from None
    info = emit_inject(rd, node, kind, f"{sig} to pid {pid}" + (f" (rank {rank})" if rank is not None else ""),
                       step=step, rank=rank, pid=pid, signal=sig, attempt=attempt, **extra)
    os.kill(pid, signum)
    return info


# -- disk ---------------------------------------------------------------------------------
_run = run_checked


def mount_tmpfs(path: Path, size: str = "64m") -> Undo:
    """Mount a real tmpfs of ``size`` on ``path`` (keeps nothing that was there); returns undo."""
    if os.geteuid() != 0:
        raise TitanError("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    _run("mount", "-t", "tmpfs", "-o", f"size={size}", "titan-chaos", str(path))
    return lambda: unmount(path)


def unmount(path: Path) -> None:
    """Lazy-unmount ``path`` (FUSE or tmpfs); ignores a path that is not mounted."""
    if shutil.which("fusermount3"):
        _run("fusermount3", "-u", "-z", str(path), check=False)
    _run("umount", "-l", str(path), check=False)


def fill_disk(rd: RunDir, node: str, path: Path, *, leave_bytes: int = 0, step: int | None = None) -> Undo:
    """Fill the filesystem under ``path`` until ``leave_bytes`` remain (a real ENOSPC for the
    next write); ``inject.disk``. The undo removes the filler."""
    filler = path / ".titan-chaos-filler"
    free = shutil.disk_usage(path).free
    with open(filler, "wb", buffering=0) as fh:  # unbuffered: nothing left to flush (and fail) at close
        chunk = b"\0" * (1 << 20)
        # The free space is read again before every chunk: the job's checkpoint retention may
        # delete a checkpoint meanwhile (a fill computed once left 4 MiB free at load 40).
        # Bounded: a file system that stores zeros for free (compression) never fills.
        written, cap = 0, 2 * free + (64 << 20)
        while (want := shutil.disk_usage(path).free - leave_bytes) > 0 and written < cap:
            try:
                written += fh.write(chunk[: min(len(chunk), want)]) or 0
            except OSError:
                break
    left = shutil.disk_usage(path).free  # the effect: what a save may still write
    emit_inject(rd, node, "disk", f"filled {path} ({free >> 20} MiB were free, {left} bytes left)", step=step,
                what="enospc", path=str(path), filled_bytes=filler.stat().st_size, free_after_bytes=left)
    return lambda: filler.unlink(missing_ok=True)


def mount_slow_fs(backing: Path, mount: Path, control: Path) -> Undo:
    """Mount a FUSE passthrough of ``backing`` on ``mount`` whose ``fsync`` sleeps the number
    of seconds written in ``control`` (0 until a fault sets it). Needs ``fuse3`` + ``mfusepy``."""
    if not Path("/dev/fuse").exists() or not shutil.which("fusermount3"):
        raise TitanError("slow-fsync disk needs /dev/fuse and fusermount3 (Debian fuse3)")
    backing.mkdir(parents=True, exist_ok=True)
    mount.mkdir(parents=True, exist_ok=True)
    control.write_text("0")
    proc = subprocess.Popen([sys.executable, "-m", "titan.chaos.slowfs", str(backing), str(mount), str(control)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 15
    while not os.path.ismount(mount):
        if proc.poll() is not None:
            raise TitanError(f"slow FUSE mount failed: {proc.stderr.read().decode()[-400:] if proc.stderr else ''}")
        if time.monotonic() > deadline:
            proc.kill()
            raise TitanError("slow FUSE mount did not appear within 15 s")
        time.sleep(0.05)

    def undo() -> None:
        unmount(mount)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
    return undo


def set_fsync_delay(rd: RunDir, node: str, control: Path, seconds: float, *, step: int | None = None) -> Undo:
    """Make every fsync on the slow FUSE mount take ``seconds``; ``inject.disk``."""
    control.write_text(str(seconds))
    emit_inject(rd, node, "disk", f"fsync now takes {seconds:g} s", step=step, what="slow_fsync", seconds=seconds)
    return lambda: control.write_text("0")


def damage_newest_checkpoint(rd: RunDir, node: str, how: str = "corrupt", *, step: int | None = None) -> Injection:
    """Corrupt (overwrite bytes in the middle of) or truncate the largest data file of the
    newest committed checkpoint under ``rd.checkpoints``; ``inject.disk``.

    Raises ``TitanError`` when there is no checkpoint yet.
    """
    # Committed checkpoints only (``step-<n>``), never one already quarantined or in staging.
    cands = [p for p in rd.checkpoints.iterdir() if p.is_dir() and re.fullmatch(r"step-\d+", p.name)] \
        if rd.checkpoints.is_dir() else []
    cands = [p for p in cands if any(p.rglob("*.distcp")) or any(p.rglob("*.pt"))]
    if not cands:
        raise TitanError(f"no checkpoint under {rd.checkpoints} to {how}")
    newest = max(cands, key=lambda p: (_step_of(p), p.stat().st_mtime))
    files = sorted((f for f in newest.rglob("*") if f.is_file() and f.suffix in (".distcp", ".pt")),
                   key=lambda f: f.stat().st_size)
    victim = files[-1]
    size = victim.stat().st_size
    if how == "truncate":
        os.truncate(victim, size // 2)
        damaged = size - victim.stat().st_size
    else:
        n = min(4096, max(size // 4, 1))
        with open(victim, "r+b") as fh:
            fh.seek(size // 2)
            old = fh.read(n)
            new = os.urandom(n)
            fh.seek(size // 2)
            fh.write(new)
            fh.flush()
            os.fsync(fh.fileno())
        damaged = sum(a != b for a, b in zip(old, new))  # the effect: bytes that really changed
    return emit_inject(rd, node, "disk", f"{how} {victim.relative_to(rd.path)} ({size} bytes, {damaged} damaged)",
                       step=step, what=how, file=str(victim), checkpoint=newest.name, ckpt_step=_step_of(newest),
                       damaged_bytes=damaged)


def _step_of(p: Path) -> int:
    digits = "".join(c for c in p.name if c.isdigit())
    return int(digits) if digits else -1


# -- stress --------------------------------------------------------------------------------
#: Memory a ``vm`` stress takes per worker unless told otherwise.
VM_BYTES_PER_WORKER = 768 << 20


def _stress_cmd(what: str, workers: int, seconds: float, vm_bytes: int) -> tuple[list[str], str]:
    """The stressor's command line and its name: stress-ng when installed, else Titan's own
    CPU burner / memory allocator (``python -m titan.chaos.hog``)."""
    tool = shutil.which("stress-ng")
    if tool:
        opt = "--cpu" if what == "cpu" else "--vm"
        cmd = [tool, opt, str(workers), "--timeout", f"{max(1, int(round(seconds)))}s", "--quiet"]
        if what != "cpu":
            cmd += ["--vm-bytes", str(vm_bytes), "--vm-keep"]
        return cmd, "stress-ng"
    return [sys.executable, "-m", "titan.chaos.hog", what, str(workers), str(seconds), str(vm_bytes)], "titan.chaos.hog"


def auto_workers(what: str) -> int:
    """Stress workers for ``workers=0``: 2 per CPU (``vm``: 2)."""
    return 2 * (os.cpu_count() or 1) if what == "cpu" else 2


#: Nice value of the stressor's scheduling group on an idle machine: a noisy neighbour with
#: a large share (:func:`stress_nice` lowers it on a loaded one).
STRESS_NICE = -10


def stress_nice(load: float | None = None) -> int:
    """The stressor group's nice value: a share of about 90 % of the CPU against the groups
    already running. A group's weight grows 1.25× per nice step below 0, and the 1-minute
    load average stands in for the competing groups' count (it counts tasks, so it errs
    towards a larger share): −10 on an idle box, −13 at load 2, −20 from load ~10 on — a
    fixed −10 slowed the job only 1.35× at load 27, below every detector (issue 21). Costs
    one ``getloadavg``."""
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:
            load = 1.0
    return max(-20, min(STRESS_NICE, -round(math.log(9.0 * max(1.0, load)) / math.log(1.25))))


def _boost(pid: int, nice: int | None = None) -> str:
    """Give the stressor ``pid`` (and every process of its session) a large CPU share.

    With autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``, the default on
    most distributions) the CPU is shared per *session*: a stressor in a session of its own
    gets one session's share however many workers it has — on a 2-core box running the job
    and the stressor, half the CPU, so a "4-worker stress" slowed steps only 1.1× (issue 21);
    on a machine others load, almost nothing. Its group's nice value sets that share; without
    autogroup the process's own nice value does (:func:`stress_nice` by default). Returns
    what was set. Needs root to lower."""
    nice = stress_nice() if nice is None else nice
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
        return f"autogroup nice {nice}"
    except OSError:
        try:
            os.setpriority(os.PRIO_PROCESS, pid, nice)
            return f"nice {nice}"
        except OSError as e:
            return f"share unchanged ({e.strerror})"


def start_stress(rd: RunDir, node: str, what: str = "cpu", workers: int = 2, seconds: float = 10.0, *,
                 step: int | None = None, netns: list[str] | None = None, vm_bytes: int = VM_BYTES_PER_WORKER,
                 planned_step: int | None = None) -> tuple[Undo, Callable[[], None]]:
    """CPU (or ``vm`` memory) pressure for ``seconds``: stress-ng when installed, else Titan's
    own burner / allocator (:mod:`titan.chaos.hog`, real pages touched); ``inject.stress``.
    ``workers <= 0``: 2 per CPU. The stressor's session gets a large CPU share
    (:func:`_boost`): a co-located process that really competes with the job.

    Returns ``(undo, sample)``: ``undo`` ends it early and writes ``inject.stress_end`` with
    what it measured — the stressor's CPU seconds and the memory it held at its peak
    (``sample`` records both; call it while the stress runs, e.g. half-way)."""
    if what not in ("cpu", "vm"):
        raise TitanError(f"unknown stress {what!r}: use cpu or vm")
    sized = "auto" if workers <= 0 else "given"
    if workers <= 0:
        workers = auto_workers(what)
    cmd, tool = _stress_cmd(what, workers, seconds, vm_bytes)
    proc = subprocess.Popen((netns or []) + cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    share = _boost(proc.pid)  # before its workers fork: they inherit the session's group
    emit_inject(rd, node, "stress", f"{what} stress x{workers} ({sized}, {share}) for {seconds:g} s ({tool})",
                step=step, what=what, workers=workers, sized=sized, share=share, seconds=seconds, tool=tool,
                pid=proc.pid, bytes=workers * vm_bytes if what == "vm" else 0)
    peak = {"rss": 0, "cpu": 0.0}

    def sample() -> None:
        import psutil

        try:
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        except psutil.Error:
            return
        rss, cpu = 0, 0.0
        for p in tree:
            try:
                with p.oneshot():
                    # Private memory of the stressor (USS would be exact but costs a smaps read).
                    mi = p.memory_info()
                    rss += mi.rss - getattr(mi, "shared", 0)
                    ct = p.cpu_times()
                    cpu += ct.user + ct.system
            except psutil.Error:
                continue
        peak["rss"] = max(peak["rss"], rss)
        peak["cpu"] = max(peak["cpu"], cpu)

    def undo() -> None:
        sample()
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(5)
        emit_inject(rd, node, "stress_end", f"{what} stress ended: {peak['cpu']:.1f} CPU s, "
                    f"{peak['rss'] >> 20} MiB held", step=None, what=what, planned_step=planned_step,
                    cpu_seconds=round(peak["cpu"], 3), memory_taken_bytes=peak["rss"])
    return undo, sample
