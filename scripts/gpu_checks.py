"""GPU checks of titan's CUDA paths, called by scripts/gpu-check.sh (one check per run).

    python scripts/gpu_checks.py rng-ckpt        # one process
    torchrun --nproc-per-node N scripts/gpu_checks.py guard-nccl
    torchrun --nproc-per-node N scripts/gpu_checks.py nccl-heal

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


def nccl_heal() -> None:
    """The NCCL primitives of in-place healing (issue 23; the tested default is gloo with a
    warm group restart): ``ProcessGroup.abort()`` of a subgroup leaves the world group
    working; ``dist.shrink_group([last], shrink_flags=SHRINK_ABORT)`` on the survivors while a
    collective the excluded rank never joins is pending, then an all-reduce on the shrunk group.
    ``revoke``/``reconfigure`` are reported absent when this torch has no such API."""
    import datetime

    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    rank = int(os.environ.get("RANK", "0"))
    say = print if rank == 0 else (lambda *_a, **_k: None)
    if not torch.cuda.is_available() or not dist.is_nccl_available():
        say("SKIP nccl-heal: CUDA/NCCL not available")
        return
    shrink = getattr(dist, "shrink_group", None) or getattr(c10d, "shrink_group", None)
    nccl_cls = getattr(dist, "ProcessGroupNCCL", None)
    absent = [n for n in ("revoke", "reconfigure")
              if not any(hasattr(o, n) for o in (dist, c10d, nccl_cls, dist.ProcessGroup) if o is not None)]
    say(f"INFO nccl-heal: torch {torch.__version__}, NCCL {torch.cuda.nccl.version()}, shrink_group "
        f"{'present' if shrink else 'absent'}, ProcessGroupNCCL.abort "
        f"{'present' if nccl_cls is not None and hasattr(nccl_cls, 'abort') else 'absent'}")
    for n in absent:
        say(f"SKIP nccl-{n}: this torch has no {n} API (torch.distributed, distributed_c10d, ProcessGroupNCCL)")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=dev, timeout=datetime.timedelta(seconds=60))
    world = dist.get_world_size()
    store = c10d._get_default_store()

    # 1. abort a subgroup; the world group keeps working
    sub = dist.new_group(list(range(world)), backend="nccl")
    x = torch.ones(1, device=dev)
    dist.all_reduce(x, group=sub)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    sub.abort()
    abort_ms = (time.perf_counter() - t0) * 1e3
    after_abort = "no error"
    try:
        y = torch.ones(1, device=dev)
        dist.all_reduce(y, group=sub)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - the expected outcome: the aborted group refuses work
        after_abort = type(e).__name__
    w = torch.ones(1, device=dev)
    dist.all_reduce(w)
    torch.cuda.synchronize()
    ok = after_abort != "no error" and int(w.item()) == world
    say(f"{'PASS' if ok else 'FAIL'} nccl-abort: subgroup aborted in {abort_ms:.1f} ms, its next all-reduce -> "
        f"{after_abort}; world all-reduce after it = {int(w.item())} (expected {world})")

    # 2. shrink the world group around a rank that stopped answering
    backend = dist.group.WORLD._get_backend(dev)
    if shrink is None:
        say("SKIP nccl-shrink: this torch has no shrink_group")
    elif world < 2:
        say("SKIP nccl-shrink: needs >= 2 ranks (one per GPU); this host has 1 GPU")
    elif not getattr(backend, "supports_shrinking", False):
        say(f"SKIP nccl-shrink: the NCCL backend does not support shrinking here (NCCL {torch.cuda.nccl.version()}; "
            "ncclCommShrink needs NCCL >= 2.27)")
    else:
        gone = world - 1
        if rank == gone:  # the failed rank: joins nothing more, waits until the survivors are done
            store.wait(["nccl-heal-done"], datetime.timedelta(seconds=90))
            os._exit(0)
        hung = torch.ones(1, device=dev)
        work = dist.all_reduce(hung, async_op=True)  # never completes: rank `gone` does not join
        time.sleep(0.5)
        t0 = time.perf_counter()
        err = None
        try:
            new = shrink([gone], shrink_flags=c10d.SHRINK_ABORT)
            z = torch.full((1,), float(rank + 1), device=dev)
            dist.all_reduce(z, group=new)
            torch.cuda.synchronize()
            got, new_world = int(z.item()), dist.get_world_size(new)
        except Exception as e:  # noqa: BLE001 - reported as the check's failure
            err, got, new_world = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}", None, None
        shrink_ms = (time.perf_counter() - t0) * 1e3
        want = sum(r + 1 for r in range(world) if r != gone)
        ok = err is None and got == want and new_world == world - 1
        say(f"{'PASS' if ok else 'FAIL'} nccl-shrink: rank {gone} excluded with a collective pending, "
            f"shrink + first all-reduce in {shrink_ms:.0f} ms; world {new_world}, sum {got} (expected {want})"
            + (f": {err}" if err else ""))
        del work
        if rank == 0:
            store.set("nccl-heal-done", "1")
        os._exit(0 if ok else 1)  # the parent communicator was aborted: no orderly teardown
    dist.destroy_process_group()


if __name__ == "__main__":
    {"rng-ckpt": rng_ckpt, "guard-nccl": guard_nccl, "nccl-heal": nccl_heal}[sys.argv[1]]()
