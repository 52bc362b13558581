"""Worker used to capture REAL failure logs for the triage corpus (see capture.py).

Run under ``python -m torch.distributed.run``; the failure mode comes from ``--mode``.
It is a small data-parallel loop on gloo that logs like a typical training script
(``asctime`` timestamps, step/loss/grad_norm lines) and then fails in one way.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import math
import os
import resource
import signal
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", required=True)
    p.add_argument("--bad-rank", type=int, default=1)
    p.add_argument("--fail-step", type=int, default=4)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--pg-timeout", type=float, default=5.0)
    p.add_argument("--path", default="")
    return p.parse_args()


@record
def main() -> None:
    a = _args()
    rank = int(os.environ["RANK"])
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s [rank{rank}] %(levelname)s %(message)s")
    log = logging.getLogger("train")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a.pg_timeout))
    world = dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if a.mode == "fr":  # like TORCH_NCCL_DUMP_ON_TIMEOUT: every rank dumps when the job is torn down
        def _on_term(signum: int, frame: object) -> None:
            _dump_fr(a, rank)
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, _on_term)
    try:
        _loop(a, log, rank, world, model, opt)
    except Exception:
        if a.mode == "fr":
            _dump_fr(a, rank)
        raise
    dist.destroy_process_group()


def _loop(a, log, rank, world, model, opt) -> None:  # type: ignore[no-untyped-def]
    bad = rank == a.bad_rank
    for step in range(1, a.steps + 1):
        t0 = time.time()
        x = torch.randn(32, 16)
        y = torch.randn(32, 1)
        if a.mode == "nan" and bad and step >= a.fail_step:
            x[0, 0] = float("nan")
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        if step == a.fail_step and bad:
            _fail(a, log, step)
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9).item()
        opt.step()
        log.info("step %d loss %.4f grad_norm %.4f step_time %.3fs", step, loss.item(), gn, time.time() - t0)
        if a.mode == "nan" and not (math.isfinite(loss.item()) and math.isfinite(gn)):
            if not math.isfinite(loss.item()):
                raise FloatingPointError(f"non-finite loss {loss.item()} at step {step}")
            log.warning("non-finite grad_norm %s at step %d (loss finite)", gn, step)
        time.sleep(0.2)


def _fail(a: argparse.Namespace, log: logging.Logger, step: int) -> None:
    if a.mode == "raise":
        raise RuntimeError(f"shape mismatch in custom loss at step {step}: expected [32, 1], got [32, 2]")
    if a.mode == "valueerror":
        raise ValueError(f"invalid label index 7 for 4 classes (step {step})")
    if a.mode == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if a.mode == "segv":
        import ctypes

        ctypes.string_at(0)
    if a.mode == "sigstop":  # frozen process (e.g. a debugger or a stuck driver call): no Python runs at all
        os.kill(os.getpid(), signal.SIGSTOP)
    if a.mode == "dataloader":
        class _DS(torch.utils.data.Dataset):  # type: ignore[type-arg]
            def __len__(self) -> int:
                return 8

            def __getitem__(self, i: int) -> torch.Tensor:
                if i == 5:
                    raise KeyError(f"sample {i} has no field 'tokens'")
                return torch.zeros(4)

        for _ in torch.utils.data.DataLoader(_DS(), batch_size=2, num_workers=1):
            pass
    if a.mode in ("hang", "fr"):
        log.info("entering data loader wait (simulated stuck rank) at step %d", step)
        time.sleep(3 * a.pg_timeout)
    if a.mode == "oom":
        # memory-limited *this* process only: address space = current + 256 MiB
        with open("/proc/self/status") as f:
            vm = next(int(l.split()[1]) for l in f if l.startswith("VmSize:")) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + (256 << 20), vm + (256 << 20)))
        log.info("allocating activation buffer at step %d", step)
        torch.empty(2 << 30, dtype=torch.uint8).fill_(1)
    if a.mode == "cgroup_oom":
        cg = a.path
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        log.info("allocating activation buffer at step %d", step)
        bufs = []
        for _ in range(64):
            bufs.append(torch.ones(64 << 20, dtype=torch.uint8))
    if a.mode == "enospc":
        log.info("saving checkpoint at step %d to %s", step, a.path)
        with open(os.path.join(a.path, f"ckpt_step{step}.bin"), "wb") as f:
            for _ in range(64):
                f.write(os.urandom(64 << 10))
            f.flush()
            os.fsync(f.fileno())
    if a.mode == "enospc_torch":
        log.info("saving checkpoint at step %d to %s", step, a.path)
        torch.save({"w": torch.randn(1 << 20)}, os.path.join(a.path, f"ckpt_step{step}.pt"))


def _dump_fr(a: argparse.Namespace, rank: int) -> None:
    # documented in MACHINE-NOTES: gloo keeps a flight recorder when TORCH_FR_BUFFER_SIZE is set
    data = torch._C._distributed_c10d._dump_fr_trace_json(True, True)
    with open(os.path.join(a.path, f"fr_trace_rank{rank}.json"), "w") as f:
        f.write(data if isinstance(data, str) else data.decode())


if __name__ == "__main__":
    main()
