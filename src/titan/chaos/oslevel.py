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
    info = Injection(data, t_inject=time.time(), rank=rank, node=node)
    with EventWriter(rd.events_dir / f"chaos.{node}.jsonl", run=rd.run_id, node=node) as w:
        w.emit(f"inject.{kind}", msg, level=level, step=step, data=dict(info))
    return info


def send_signal(rd: RunDir, node: str, pid: int, sig: str = "SIGKILL", *, kind: str = "kill",
                rank: int | None = None, step: int | None = None, parents: Sequence[int] = (),
                attempt: int | None = None) -> Injection:
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
                       step=step, rank=rank, pid=pid, signal=sig, attempt=attempt)
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
    want = max(free - leave_bytes, 0)
    with open(filler, "wb") as fh:
        chunk = b"\0" * (1 << 20)
        while want > 0:
            try:
                fh.write(chunk[: min(len(chunk), want)])
                fh.flush()
            except OSError:
                break
            want -= len(chunk)
    emit_inject(rd, node, "disk", f"filled {path} ({free >> 20} MiB were free)", step=step, what="enospc",
                path=str(path), filled_bytes=filler.stat().st_size)
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
    else:
        with open(victim, "r+b") as fh:
            fh.seek(size // 2)
            fh.write(os.urandom(min(4096, max(size // 4, 1))))
            fh.flush()
            os.fsync(fh.fileno())
    return emit_inject(rd, node, "disk", f"{how} {victim.relative_to(rd.path)} ({size} bytes)", step=step,
                       what=how, file=str(victim), checkpoint=newest.name, ckpt_step=_step_of(newest))


def _step_of(p: Path) -> int:
    digits = "".join(c for c in p.name if c.isdigit())
    return int(digits) if digits else -1


# -- stress --------------------------------------------------------------------------------
def start_stress(rd: RunDir, node: str, what: str = "cpu", workers: int = 2, seconds: float = 10.0, *,
                 step: int | None = None, netns: list[str] | None = None) -> Undo:
    """CPU (or ``vm`` memory) pressure for ``seconds``: stress-ng when installed, else a
    built-in burner (``workers`` spinning processes); ``inject.stress``. Undo ends it early."""
    tool = shutil.which("stress-ng")
    if tool:
        opt = "--cpu" if what == "cpu" else "--vm"
        cmd = [tool, opt, str(workers), "--timeout", f"{max(1, int(round(seconds)))}s", "--quiet"]
        if what != "cpu":
            cmd += ["--vm-bytes", "256M"]
    else:
        cmd = [sys.executable, "-c", "import sys,time,multiprocessing as m\n"
               "def b(s):\n t=time.time()+s\n while time.time()<t: pass\n"
               f"ps=[m.Process(target=b,args=({seconds},)) for _ in range({workers})]\n"
               "[p.start() for p in ps]; [p.join() for p in ps]"]
    proc = subprocess.Popen((netns or []) + cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    emit_inject(rd, node, "stress", f"{what} stress x{workers} for {seconds:g} s ({'stress-ng' if tool else 'burner'})",
                step=step, what=what, workers=workers, seconds=seconds, tool="stress-ng" if tool else "burner",
                pid=proc.pid)

    def undo() -> None:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(5)
    return undo
