"""In-loop fault classification and the fault boundary (the restart policy is the launcher's:
tests/launch/test_restart_policy.py)."""

from __future__ import annotations

import json

import pytest
import torch.distributed as dist

from titan.errors import TitanAbort
from titan.exitcodes import ExitCode
from titan.settings import load_settings
from titan.worker import WorkerContext
from titan.worker.errors import classify, fault_boundary


@pytest.mark.parametrize("exc, kind, code", [
    (RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 5000ms for recv "
                  "operation to complete"), "comm_timeout", ExitCode.WORKER_COMM_FAULT),
    (RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1234"),
     "peer_closed", ExitCode.WORKER_COMM_FAULT),
    (dist.DistBackendError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"), "comm_backend",
     ExitCode.WORKER_COMM_FAULT),
    (dist.DistNetworkError("failed to connect"), "comm_network", ExitCode.WORKER_COMM_FAULT),
    (dist.DistStoreError("Timed out after 601 seconds waiting for clients"), "store", ExitCode.WORKER_COMM_FAULT),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), "cuda_sticky", ExitCode.WORKER_CUDA_FAULT),
    (RuntimeError("CUDA error: out of resources"), "cuda", ExitCode.WORKER_CUDA_FAULT),
    (ValueError("shapes do not match"), "other", ExitCode.JOB_FAILED),
])
def test_classify(exc, kind, code):
    f = classify(exc)
    assert (f.kind, f.exit_code) == (kind, code), f"expected {kind}/{code.name}, saw {f.kind}/{f.exit_code.name}"


def _ctx(tmp_path, rank=0, attempt=0, **sets):
    s = load_settings(env={}, cli=sets)
    return WorkerContext.from_env(s, run_dir=tmp_path, env={"RANK": str(rank), "TORCHELASTIC_RESTART_COUNT": str(attempt)})


def _events(tmp_path, kind):
    out = []
    for f in (tmp_path / "events").glob("*.jsonl"):
        out += [json.loads(x) for x in f.read_text().splitlines() if json.loads(x)["kind"] == kind]
    return out


def test_fault_boundary_records_and_exits_with_the_class_code(tmp_path):
    ctx = _ctx(tmp_path)
    ctx.step = 17
    with pytest.raises(SystemExit) as ei:
        with fault_boundary(ctx):
            raise RuntimeError("Connection closed by peer [127.0.0.1]:5")
    assert ei.value.code == int(ExitCode.WORKER_COMM_FAULT)
    (ev,) = _events(tmp_path, "worker.fault")
    assert ev["step"] == 17 and ev["data"]["class"] == "peer_closed" and ev["rank"] == 0


def test_fault_boundary_turns_an_abort_into_its_exit_code(tmp_path):
    ctx = _ctx(tmp_path)
    with pytest.raises(SystemExit) as ei:
        with fault_boundary(ctx):
            raise TitanAbort("stop", int(ExitCode.GAVE_UP))
    assert ei.value.code == int(ExitCode.GAVE_UP)
