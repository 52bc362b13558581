"""One rank of the 2-rank SIGTERM scenarios of ``test_preempt_ride.py`` (torch.multiprocessing).

Each scenario: a small DDP model under a ``StepGuard`` and a ``Checkpointer`` (async saves
every 3 steps, SIGTERM handler on), trained step by step; at ``sigterm_step`` rank 1 sends
itself a real SIGTERM, either before the step's forward (``"early"``) or after its
``guard.step`` and before its ``maybe_save`` (``"late"``). ``wiring`` says how the loop
hands the guard its loss and whether the checkpointer is wired to the guard:

* ``ride``: the loss before the backward (``add_loss``) and ``use_checkpointer``: the
  checkpointer's flags ride DDP's gradient all-reduce with the guard's vector;
* ``closure``: a closure (``guard.step(fwd_bwd)``, the guard's own exchange after the
  backward) and ``use_checkpointer``: the flags ride that exchange;
* ``exchange``: ``add_loss`` but no ``use_checkpointer``: ``maybe_save`` all-reduces them.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))


def _scenario(sc: dict[str, Any], rank: int, world: int, out: Path) -> dict[str, Any]:
    import torch
    from torch import nn

    from titan.checkpoint import Checkpointer, Preempted
    from titan.guard import StepGuard
    from titan.settings import load_settings
    from titan.worker import WorkerContext

    run = out / sc["name"]
    settings = load_settings(env={"TITAN_CHECKPOINT_EVERY_STEPS": "3", "TITAN_CHECKPOINT_MODE": "async",
                                  "TITAN_CHECKPOINT_SAVE_ON_SIGTERM": "true",
                                  "TITAN_CHECKPOINT_SNAPSHOT_EVERY_STEPS": "0",
                                  "TITAN_CHECKPOINT_DIR": str(run / "ckpt")})
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
           "TITAN_NODE_ID": "node0"}
    ctx = WorkerContext.from_env(settings, run_dir=run, env=env)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = StepGuard(ddp, opt, max_norm=1.0, ctx=ctx)
    ckpt = Checkpointer(ctx)
    state = {"model": model, "optimizer": opt, "guard": guard}
    wiring = sc["wiring"]
    if wiring in ("ride", "closure"):
        guard.use_checkpointer(ckpt, state)
    g = torch.Generator().manual_seed(100 + rank)
    res: dict[str, Any] = {"rode": [], "preempted_at": None}

    def fwd_bwd() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        loss = nn.functional.cross_entropy(ddp(x), y)
        if wiring != "closure":
            guard.add_loss(loss)  # before the backward: the guard's vector rides DDP's last bucket
        loss.backward()
        return loss

    try:
        for step in range(1, sc["steps"] + 1):
            signal_now = rank == 1 and step == sc["sigterm_step"]
            if signal_now and sc["when"] == "early":
                os.kill(os.getpid(), signal.SIGTERM)
            if wiring == "closure":
                r = guard.step(fwd_bwd)
            else:
                fwd_bwd()
                r = guard.step()
            res["rode"].append(r.rode)
            if signal_now and sc["when"] == "late":
                os.kill(os.getpid(), signal.SIGTERM)
            ckpt.maybe_save(step, state)
        ckpt.close()
    except Preempted as e:
        res["preempted_at"], res["last_saved_step"], res["exit_code"] = step, ckpt.last_saved_step, e.code
    finally:
        guard.close()
        ctx.events.close()
    res["flags_rode"], res["flags_exchanged"] = ckpt.flags_rode, ckpt.flags_exchanged
    return res


def rank_main(rank: int, world: int, port: int, scenarios: list[dict[str, Any]], out: str) -> None:
    import torch
    import torch.distributed as dist

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    results: dict[str, Any] = {}
    try:
        for sc in scenarios:
            try:
                results[sc["name"]] = _scenario(sc, rank, world, Path(out))
            except BaseException as e:  # noqa: BLE001 - reported to the test
                results[sc["name"]] = {"error": f"{type(e).__name__}: {e}"}
                raise
            dist.barrier()
    finally:
        Path(out, f"rank{rank}.json").write_text(json.dumps(results))
        dist.destroy_process_group()
