"""Shared harness of the guard tests: a small classifier, deterministic data, a guarded
loop and a plain reference loop, run in 1 process or 2 gloo ranks (torch.multiprocessing).

A scenario is a dict; ``run_world(world, scenarios)`` runs each scenario on every rank in
one spawn (process start-up dominates on 2 cores) and returns per-rank results.
"""

from __future__ import annotations

import copy
import json
import math
import os
import socket
import traceback
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

DIM, CLASSES, HIDDEN, N_DATA = 16, 8, 32, 4096


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_data(seed: int = 0, poison: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + seed)
    x = torch.randn(N_DATA, DIM, generator=g)
    teacher = torch.randn(DIM, CLASSES, generator=g)
    y = (x @ teacher + 0.5 * torch.randn(N_DATA, CLASSES, generator=g)).argmax(1)
    for i in poison or []:
        x[i] = math.nan
    return x, y


def make_model(seed: int = 0, dropout: float = 0.1) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(DIM, HIDDEN), nn.ReLU(), nn.Dropout(dropout), nn.Linear(HIDDEN, HIDDEN),
                         nn.ReLU(), nn.Linear(HIDDEN, CLASSES))


def batch_indices(step: int, rank: int, world: int, bs: int, micro: int = 0, accum: int = 1) -> list[int]:
    base = ((step - 1) * world * accum + micro * world + rank) * bs
    return [(base + i) % N_DATA for i in range(bs)]


def run_scenario(sc: dict[str, Any], rank: int, world: int, out: Path) -> dict[str, Any]:
    """Run one scenario on this rank; returns steps, params and what was raised."""
    from titan.chaos.inject import Injector
    from titan.events import EventWriter
    from titan.guard import GuardConfig, StepGuard

    name = sc["name"]
    torch.manual_seed(sc.get("seed", 0) * 100 + rank)  # dropout differs per rank, reproducibly
    model = make_model(sc.get("seed", 0), sc.get("dropout", 0.1))
    wrap = sc.get("wrap", "ddp" if world > 1 else "none")
    if wrap == "ddp":
        model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=sc.get("bucket_cap_mb", 25))
    elif wrap == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=sc.get("lr", 3e-3))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + 0.01 * s))
    scaler = None
    if sc.get("scaler"):
        scaler = torch.amp.GradScaler("cpu", init_scale=sc["scaler"], growth_interval=sc.get("growth", 2000))
    x, y = make_data(sc.get("seed", 0), sc.get("poison"))
    bs, accum, steps = sc.get("bs", 32), sc.get("accum", 1), sc["steps"]
    plain = sc.get("plain", False)
    events = EventWriter(out / f"{name}.rank{rank}.jsonl", run=name, node=f"node{rank}", rank=rank, world=world)
    policy = GuardConfig(**sc.get("policy", {}))
    guard = None if plain else StepGuard(model, opt, scheduler=sched, scaler=scaler, max_norm=sc.get("max_norm", 1.0),
                                         policy=policy, events=events, node=f"node{rank}")
    step_now = {"s": 0}
    inj = Injector(rank, step_fn=lambda: step_now["s"], events=events)
    for f in sc.get("faults", []):
        getattr(inj, f["kind"])(**{k: v for k, v in f.items() if k != "kind"})
    inj.attach(model)
    results: list[dict[str, Any]] = []
    raised = None

    ride = bool(sc.get("ride")) and guard is not None

    def fwd_bwd(s: int) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        total = torch.zeros(())
        for m in range(accum):
            idx = batch_indices(s, rank, world, bs, m, accum)
            ctx = model.no_sync() if (wrap == "ddp" and m < accum - 1) else nullcontext()
            with ctx:
                loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
                loss = inj.loss(loss) / accum
                if ride:  # the loss before its backward: the verdict rides DDP's all-reduce
                    guard.add_loss(loss)
                (scaler.scale(loss) if scaler is not None else loss).backward()
            total += loss.detach()
        return total

    snapshot: dict[str, Any] = {}
    app = {"model": model, "opt": opt, "sched": sched, **({"guard": guard} if guard else {})}

    def rollback() -> int:  # an in-memory snapshot, as titan.checkpoint's /dev/shm one
        for k, obj in app.items():
            obj.load_state_dict(copy.deepcopy(snapshot["state"][k]))
        return snapshot["step"]

    if guard is not None and sc.get("snapshot_at"):
        guard._rollback = rollback
    if guard is not None and sc.get("perturb_norm_at") and rank == 1:
        # A rank that computes another global norm from the same reduced gradients (the
        # premise riding rests on, broken on purpose at one step).
        own = guard.check.norm_slot
        guard.check.norm_slot = lambda: own() * (1.0 + 1e-3) if step_now["s"] == sc["perturb_norm_at"] else own()
    try:
        s = 0
        while s < steps:
            s += 1
            step_now["s"] = s
            if plain:
                loss = fwd_bwd(s)
                if s in sc.get("plain_skip", []):
                    opt.zero_grad(set_to_none=True)
                    results.append({"step": s, "skipped": True})
                    continue
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), sc.get("max_norm", 1.0))
                opt.step()
                sched.step()
                results.append({"step": s, "loss": float(loss), "grad_norm": float(norm), "skipped": False})
            else:
                samples = [i for m in range(accum) for i in batch_indices(s, rank, world, bs, m, accum)]
                if sc.get("verify_at") == [rank, s]:
                    guard.request_replay()
                if ride:
                    fwd_bwd(s)
                    rode = guard.check._ride is not None
                    r = guard.step(samples=samples)
                else:
                    rode = False
                    r = guard.step(lambda: fwd_bwd(s), samples=samples)
                results.append({"step": r.step, "loss": r.loss, "grad_norm": r.grad_norm, "skipped": r.skipped,
                                "reason": r.reason, "classification": r.classification, "culprit": r.culprit,
                                "escalation": r.escalation,
                                "scale": scaler.get_scale() if scaler is not None else None,
                                "rolled_back_to": r.rolled_back_to, "replay_match": r.replay_match,
                                "lr": r.lr, "rode": rode})
                if r.rolled_back_to is not None:
                    s = r.rolled_back_to
            if s == sc.get("snapshot_at") and not snapshot:
                snapshot.update(step=s, state={k: copy.deepcopy(obj.state_dict()) for k, obj in app.items()})
    except BaseException as e:  # TitanAbort is a BaseException
        raised = {"type": type(e).__name__, "message": str(e), "exit_code": getattr(e, "exit_code", None)}
        if not hasattr(e, "exit_code"):
            raised["tb"] = traceback.format_exc()
    events.close()
    params = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
              for n, p in model.named_parameters()}
    torch.save(params, out / f"{name}.rank{rank}.params.pt")
    return {"steps": results, "raised": raised, "state": guard.state_dict() if guard else None}


def _worker(rank: int, world: int, port: int, scenarios: list[dict[str, Any]], out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    res = {}
    try:
        for sc in scenarios:
            res[sc["name"]] = run_scenario(sc, rank, world, Path(out))
            if world > 1:
                dist.barrier()
    finally:
        (Path(out) / f"results.rank{rank}.json").write_text(json.dumps(res, default=str))
        if world > 1:
            dist.destroy_process_group()
    if world > 1 and any(sc.get("wrap") == "fsdp" for sc in scenarios):
        from _dist import leave_without_teardown

        leave_without_teardown()  # FSDP2 keeps the group alive past destroy: its teardown can abort (-6)


def run_world(world: int, scenarios: list[dict[str, Any]], out: Path, timeout_s: float = 150.0) -> list[dict]:
    """Run ``scenarios`` on ``world`` gloo ranks; returns one result dict per rank."""
    out.mkdir(parents=True, exist_ok=True)
    if world == 1:
        _worker(0, 1, 0, scenarios, str(out))
    else:
        ctx = mp.start_processes(_worker, args=(world, free_port(), scenarios, str(out)), nprocs=world,
                                 join=False, start_method="spawn")
        try:
            import time

            deadline = time.monotonic() + timeout_s
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{world}-rank run did not finish within {timeout_s:.0f}s")
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join(5)
    return [json.loads((out / f"results.rank{r}.json").read_text()) for r in range(world)]


def params(out: Path, name: str, rank: int = 0) -> dict[str, torch.Tensor]:
    return torch.load(out / f"{name}.rank{rank}.params.pt")


def events(out: Path, name: str, rank: int) -> list[dict[str, Any]]:
    p = out / f"{name}.rank{rank}.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.exists() else []
