"""One rank of a 2-"node" × 2-rank gloo job whose nodes have separate checkpoint folders.

Run by ``test_nodelocal.py`` with ``torch.multiprocessing``: each node's folder is a
different path (what a node-local disk looks like to the ranks), each node's replica
server runs in the test process (as ``titan run`` would host it).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))


def rank_main(rank: int, world: int, port: int, spec: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    from titan.checkpoint import Checkpointer
    from titan.settings import load_settings
    from titan.worker import WorkerContext

    from _ckpt_model import build, params, train_steps

    node = spec["nodes"][rank]
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank % 2), "LOCAL_WORLD_SIZE": "2",
           "TITAN_NODE_ID": node, "TORCHELASTIC_RESTART_COUNT": str(spec.get("attempt", 0))}
    os.environ.update(spec["env"][node])
    os.environ.update({"OMP_NUM_THREADS": "1"})
    torch.set_num_threads(1)
    import datetime

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    settings = load_settings(env={"TITAN_CHECKPOINT_EVERY_STEPS": str(spec["every"]),
                                  "TITAN_CHECKPOINT_MODE": spec.get("mode", "sync"),
                                  "TITAN_CHECKPOINT_SAVE_ON_SIGTERM": "false",
                                  "TITAN_CHECKPOINT_REPLICATE": spec.get("replicate", "auto"),
                                  **spec.get("settings", {})})
    ctx = WorkerContext.from_env(settings, run_dir=spec["run_dirs"][node], env=env)
    st = build()
    ck = Checkpointer(ctx, root=spec["roots"][node])
    out: dict[str, Any] = {"rank": rank}
    try:
        start = ck.restore(st)
        out["start"] = start
        out["layout"] = ck.layout.to_dict()
        train_steps(st, start, spec["stop"], ck)
        ck.close()
        out["params"] = [p.tolist() for p in params(st)]
    except BaseException as e:  # noqa: BLE001 - reported to the test
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        Path(spec["out"], f"rank{rank}.json").write_text(json.dumps(out))
        dist.destroy_process_group()
