"""Capture REAL failure logs for the triage corpus on this machine (gloo, CPU).

Usage:  .venv/bin/python tests/triage/corpus/_capture/capture.py [SCENARIO ...]

Each scenario runs a real ``python -m torch.distributed.run`` job of 2–3 ranks that fails
in one way, and stores what a user would have: torchrun's console output
(``console.log``), the per-rank logs torchrun writes with ``--log-dir``/``--tee``, error
files, and where relevant kernel lines (``dmesg``) or flight-recorder dumps. The
``expected.json`` beside them is written by hand from what the scenario did. Timeouts and
process-group kills keep every run bounded.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parent
PY = sys.executable
WORKER = HERE / "worker.py"


def _torchrun(out: Path, nproc: int, wargs: list[str], extra: list[str] | None = None,
              env_extra: dict[str, str] | None = None, timeout: float = 90.0) -> str:
    logdir = Path(tempfile.mkdtemp(prefix="titan_cap_"))
    env = dict(os.environ, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1", **(env_extra or {}))
    cmd = [PY, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--max-restarts=0",
           "--monitor-interval=0.5", "--log-dir", str(logdir), "--tee", "3",
           *(extra or ["--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0"]),
           str(WORKER), *wargs]
    top = out
    out = out / "logs"
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True, text=True, errors="replace")
    try:
        text, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        text, _ = proc.communicate()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    (out / "console.log").write_text(text)
    # per-rank files torchrun wrote: <logdir>/<run_id>/attempt_0/<local_rank>/{stdout,stderr}.log,error.json
    for f in sorted(logdir.rglob("*")):
        if f.is_file() and f.stat().st_size:
            parts = f.relative_to(logdir).parts
            name = f"rank{parts[-2]}.{f.name}" if len(parts) >= 2 and parts[-2].isdigit() else f.name
            shutil.copy(f, out / name)
    shutil.rmtree(logdir, ignore_errors=True)
    (top / "COMMAND").write_text(" ".join(["TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", *[
        "python" if c == PY else ("tests/triage/corpus/_capture/worker.py" if c == str(WORKER) else c)
        for c in cmd]]) + "\n")
    return text


def _dmesg_since(mark: float) -> str:
    out = subprocess.run(["dmesg", "--time-format", "iso"], capture_output=True, text=True).stdout
    keep = []
    for line in out.splitlines():
        ts = line.split(" ", 1)[0]
        try:
            import datetime as dt
            t = dt.datetime.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=dt.timezone.utc).timestamp()
        except ValueError:
            continue
        if t >= mark - 1:
            keep.append(line)
    return "\n".join(keep) + "\n"


def raise_2(out: Path) -> None:
    _torchrun(out, 2, ["--mode", "raise", "--bad-rank", "1"])


def valueerror_3(out: Path) -> None:
    _torchrun(out, 3, ["--mode", "valueerror", "--bad-rank", "2", "--pg-timeout", "20"])


def sigkill_2(out: Path) -> None:
    _torchrun(out, 2, ["--mode", "sigkill", "--bad-rank", "1", "--pg-timeout", "20"])


def hang_2(out: Path) -> None:
    _torchrun(out, 2, ["--mode", "hang", "--bad-rank", "1", "--pg-timeout", "5"])


def hang_3(out: Path) -> None:
    _torchrun(out, 3, ["--mode", "hang", "--bad-rank", "0", "--pg-timeout", "5"])


def nan_2(out: Path) -> None:
    _torchrun(out, 2, ["--mode", "nan", "--bad-rank", "1", "--fail-step", "5"])


def oom_2(out: Path) -> None:
    _torchrun(out, 2, ["--mode", "oom", "--bad-rank", "0", "--pg-timeout", "20"])


def cgroup_oom_2(out: Path) -> None:
    cg = Path("/sys/fs/cgroup/memory/titan_triage_oom")
    cg.mkdir(exist_ok=True)
    try:
        (cg / "memory.limit_in_bytes").write_text(str(600 << 20))
        mark = time.time()
        _torchrun(out, 2, ["--mode", "cgroup_oom", "--bad-rank", "1", "--pg-timeout", "20", "--path", str(cg)])
        time.sleep(0.5)
        (out / "logs" / "dmesg.log").write_text(_dmesg_since(mark))
    finally:
        for pid in (cg / "cgroup.procs").read_text().split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
        cg.rmdir()


def _with_tmpfs(fn):  # type: ignore[no-untyped-def]
    def run(out: Path) -> None:
        mnt = Path(tempfile.mkdtemp(prefix="titan_full_"))
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], check=True)
        try:
            fn(out, mnt)
        finally:
            subprocess.run(["umount", str(mnt)], check=False)
            mnt.rmdir()
    run.__name__ = fn.__name__
    return run


@_with_tmpfs
def enospc_2(out: Path, mnt: Path) -> None:
    _torchrun(out, 2, ["--mode", "enospc", "--bad-rank", "0", "--pg-timeout", "20", "--path", str(mnt)])


@_with_tmpfs
def enospc_torch_2(out: Path, mnt: Path) -> None:
    _torchrun(out, 2, ["--mode", "enospc_torch", "--bad-rank", "0", "--pg-timeout", "20", "--path", str(mnt)])


def rdzv_bad_endpoint(out: Path) -> None:
    _torchrun(out, 2, ["--mode", "raise"], extra=["--nnodes=2", "--rdzv-backend=c10d",
              "--rdzv-endpoint=rdzv-host.invalid:29400", "--rdzv-conf=join_timeout=10"], timeout=60)


def rdzv_timeout(out: Path) -> None:
    _torchrun(out, 1, ["--mode", "raise"], extra=["--nnodes=2", "--rdzv-backend=c10d",
              "--rdzv-endpoint=127.0.0.1:29471", "--rdzv-conf=join_timeout=8,last_call_timeout=2"],
              timeout=60)


def fr_2(out: Path) -> None:
    d = Path(tempfile.mkdtemp(prefix="titan_fr_"))
    try:
        _torchrun(out, 2, ["--mode", "fr", "--bad-rank", "1", "--pg-timeout", "5", "--path", str(d)],
                  env_extra={"TORCH_FR_BUFFER_SIZE": "2000"})
        for f in d.iterdir():
            shutil.copy(f, out / "logs" / f.name)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def segv_2(out: Path) -> None:
    _torchrun(out, 2, ["--mode", "segv", "--bad-rank", "1", "--pg-timeout", "20"])


def sigstop_2(out: Path) -> None:
    _torchrun(out, 2, ["--mode", "sigstop", "--bad-rank", "1", "--pg-timeout", "5"], timeout=60)


def dataloader_3(out: Path) -> None:
    _torchrun(out, 3, ["--mode", "dataloader", "--bad-rank", "2", "--pg-timeout", "20"])


SCENARIOS = {f.__name__: f for f in (segv_2, sigstop_2, dataloader_3, raise_2, valueerror_3, sigkill_2, hang_2, hang_3, nan_2, oom_2,
                                     cgroup_oom_2, enospc_2, enospc_torch_2, rdzv_bad_endpoint,
                                     rdzv_timeout, fr_2)}


def main(argv: list[str]) -> None:
    names = argv or list(SCENARIOS)
    for n in names:
        out = CORPUS / f"real_{n}"
        if out.exists():
            shutil.rmtree(out)
        t0 = time.time()
        SCENARIOS[n](out)
        print(f"{n}: {time.time() - t0:.1f}s -> {out}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
