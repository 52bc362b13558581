"""Fork server for crash-consistency tests (run as a script; prints one JSON result).

The parent imports torch once and forks one child per save; children are SIGKILLed at
every protocol boundary (injection points) and then at random times. After each child,
the parent checks that ``latest`` names a checkpoint that verifies, and restores the
newest good one into fresh objects (every time for injection points, every 10th random
kill) — as a restarted job would.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402

torch.set_num_threads(1)  # forked children of a process that used OpenMP threads can hang

from titan.checkpoint import Checkpointer, inject  # noqa: E402
from titan.checkpoint.manifest import read_latest, verify  # noqa: E402

from _ckpt_model import build, context  # noqa: E402


def _state(width: int):
    st = build()
    st["model"][0] = torch.nn.Linear(8, width)
    st["model"][2] = torch.nn.Linear(width, 1)
    st["optim"] = torch.optim.AdamW(st["model"].parameters(), lr=1e-2)
    st["sched"] = torch.optim.lr_scheduler.StepLR(st["optim"], 2)
    return st


def _child(run: Path, step: int, crash_at: str | None, width: int) -> None:
    try:
        if crash_at:
            inject.set_hook(lambda p: os.kill(os.getpid(), signal.SIGKILL) if p == crash_at else None)
        st = _state(width)
        st["sampler"].consumed = step
        ck = Checkpointer(context(run, mode="sync", keep_last=3))
        ck.save(step, st, blocking=True)
        ck.close()
        os._exit(0)
    except BaseException:  # noqa: BLE001
        os._exit(3)


def _fork(run: Path, step: int, crash_at: str | None, width: int) -> int:
    pid = os.fork()
    if pid == 0:
        _child(run, step, crash_at, width)
    return pid


def _check(run: Path, restore: bool, width: int) -> dict:
    root = run / "checkpoints"
    latest = read_latest(root)
    out = {"latest": latest, "latest_ok": latest is None or verify(root / latest).ok}
    if restore:
        st = _state(width)
        out["restored"] = Checkpointer(context(run, mode="sync")).restore(st)
        out["consumed"] = st["sampler"].consumed
    return out


def main() -> None:
    base, n_random, width = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    results = {"points": {}, "random": []}
    for point in inject.POINTS:
        run = base / f"point-{point}"
        for step, crash in ((2, None), (4, point)):
            pid = _fork(run, step, crash, width)
            _, status = os.waitpid(pid, 0)
        results["points"][point] = {"signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                                    **_check(run, True, width)}
    run = base / "random"
    durations = []
    for step in (1, 2):  # the second (warm) save sets the kill window
        t0 = time.monotonic()
        os.waitpid(_fork(run, step, None, width), 0)
        durations.append(time.monotonic() - t0)
    save_s = durations[-1]
    rng = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else None)
    start = time.monotonic()
    for i in range(n_random):
        step = i + 3
        pid = _fork(run, step, None, width)
        time.sleep(rng.uniform(0, save_s * 1.2))
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status)
        chk = _check(run, i % 10 == 9, width)
        chk.update(step=step, killed=killed)
        results["random"].append(chk)
    results["save_s"] = save_s
    results["random_s"] = time.monotonic() - start
    print(json.dumps(results))


if __name__ == "__main__":
    main()
