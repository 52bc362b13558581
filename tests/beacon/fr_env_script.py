"""Worker for test_flight_recorder_env: the README wiring, one all-reduce, the recorder's entries."""

import json
import os

import torch
import torch.distributed as dist

import titan.beacon as beacon
from titan.worker import WorkerContext, init_distributed

ctx = WorkerContext.from_env()
beacon.install(ctx)  # sets the flight recorder's size variable before the process group exists
init_distributed(ctx)
t = torch.ones(4)
dist.all_reduce(t)
import torch._C._distributed_c10d as c10d  # noqa: E402

trace = c10d._dump_fr_trace_json(True, False)
entries = json.loads(trace).get("entries", []) if trace else []
line = "FR " + json.dumps({"rank": ctx.rank, "entries": len(entries), "fr": os.environ.get("TORCH_FR_BUFFER_SIZE"),
                           "nccl": os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")}) + "\n"
os.write(1, line.encode())  # one write: the two ranks share the launcher's stdout
beacon.done()
dist.destroy_process_group()
ctx.events.close()
