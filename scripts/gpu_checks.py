"""GPU checks of titan's CUDA paths, called by scripts/gpu-check.sh (one check per run).

    python scripts/gpu_checks.py rng-ckpt        # one process
    torchrun --nproc-per-node N scripts/gpu_checks.py guard-nccl

Prints ``PASS|FAIL|SKIP <check>: <detail>`` lines (rank 0 only for guard-nccl).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time

import torch


def _ctx(run_dir: str):
    from titan.settings import load_settings
    from titan.worker import WorkerContext

    s = load_settings(env={}, cli={"checkpoint.every_steps": 1, "checkpoint.mode": "sync", "sdc.enabled": False})
    return WorkerContext.from_env(s, run_dir=run_dir, env={k: v for k, v in os.environ.items() if not k.startswith("TITAN_")})


def rng_ckpt() -> None:
    """Save a checkpoint holding every CUDA device's RNG, draw, restore, draw again: equal."""
    if not torch.cuda.is_available():
        print("SKIP rng-ckpt: CUDA is not available")
        return
    from titan.checkpoint import Checkpointer
    from titan.events import RunDir

    with tempfile.TemporaryDirectory() as d:
        rd = RunDir.create(d, "gpucheck")
        ctx = _ctx(str(rd.path))
        model = torch.nn.Linear(64, 64).cuda()
        opt = torch.optim.AdamW(model.parameters())
        model(torch.randn(4, 64, device="cuda")).sum().backward()
        opt.step()
        for dev in range(torch.cuda.device_count()):
            torch.cuda.manual_seed_all(1234)
            torch.rand(10, device=f"cuda:{dev}")  # move every device's generator off its seed
        app = {"model": model, "optimizer": opt}
        ck = Checkpointer(ctx)
        ck.save(1, app, blocking=True)
        ck.close()
        before = [torch.rand(1000, device=f"cuda:{d}").cpu() for d in range(torch.cuda.device_count())]
        drop = torch.nn.functional.dropout(torch.ones(1000, device="cuda"), 0.5).cpu()
        ck2 = Checkpointer(ctx)
        step = ck2.restore(app)
        ck2.close()
        after = [torch.rand(1000, device=f"cuda:{d}").cpu() for d in range(torch.cuda.device_count())]
        drop2 = torch.nn.functional.dropout(torch.ones(1000, device="cuda"), 0.5).cpu()
        ok = step == 1 and all(torch.equal(a, b) for a, b in zip(before, after)) and torch.equal(drop, drop2)
        print(f"{'PASS' if ok else 'FAIL'} rng-ckpt: restored step {step}; CUDA RNG streams of "
              f"{torch.cuda.device_count()} device(s) and a dropout mask {'identical' if ok else 'DIFFER'} after the round trip")


def guard_nccl() -> None:
    """Guarded DDP on NCCL: forward/backward/hooks under set_sync_debug_mode('error');
    count host syncs of whole steps under 'warn'; a NaN injected on rank 0 is skipped."""
    import warnings

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from titan.chaos.inject import Injector
    from titan.guard import StepGuard
    from titan.workloads.tinygpt.config import PRESETS
    from titan.workloads.tinygpt.model import GPT

    rank = int(os.environ.get("RANK", "0"))
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        if rank == 0:
            print("SKIP guard-nccl: CUDA/NCCL not available")
        return
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    with tempfile.TemporaryDirectory() as d:
        ctx = _ctx(d) if rank == 0 else None
        torch.manual_seed(0)
        model = GPT(PRESETS["tiny"]).cuda()
        ddp = DDP(model, device_ids=[local])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        guard = StepGuard(ddp, opt, max_norm=1.0, ctx=ctx)
        inj = Injector(rank=rank, step_fn=lambda: guard.step_count + 1).nan_grad(
            rank=0, param="blocks.0.mlp.0.weight", step=4).attach(model)
        x = torch.randint(0, 256, (8, 64), device="cuda")
        errors, syncs, skipped = [], [], []

        def fwd_bwd():
            torch.cuda.set_sync_debug_mode("error")  # any host sync in forward/backward/hooks raises
            try:
                loss = ddp(x, x)
                loss.backward()
                return loss.detach()
            except RuntimeError as e:
                errors.append(str(e).splitlines()[0])
                raise
            finally:
                torch.cuda.set_sync_debug_mode(0)

        for step in range(1, 9):
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    res = guard.step(fwd_bwd)
                finally:
                    torch.cuda.set_sync_debug_mode(0)
            syncs.append(sum("synchroniz" in str(m.message) for m in w))
            if res.skipped:
                skipped.append(step)
        torch.cuda.synchronize()
    if rank == 0:
        ok = not errors
        print(f"{'PASS' if ok else 'FAIL'} guard-nccl-no-sync: forward/backward/comm hooks of 8 guarded steps on "
              f"NCCL (world {dist.get_world_size()}) under sync debug 'error'" + (f": {errors[0]}" if errors else ""))
        clean = [n for s, n in enumerate(syncs, 1) if s not in skipped]
        print(f"{'PASS' if clean and max(clean) <= 2 else 'FAIL'} guard-nccl-syncs: host syncs per clean guarded step "
              f"{clean} (the decision's one read; <= 2 expected)")
        print(f"{'PASS' if skipped == [4] else 'FAIL'} guard-nccl-skip: NaN injected on rank 0 at step 4 -> skipped "
              f"steps {skipped}")
    dist.destroy_process_group()


if __name__ == "__main__":
    {"rng-ckpt": rng_ckpt, "guard-nccl": guard_nccl}[sys.argv[1]]()
