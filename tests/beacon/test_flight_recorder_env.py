"""Titan turns the flight recorder on with the variable this torch reads, and warns nothing.

Issue 15: every run printed ``TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated`` once per rank,
because Titan set the old name beside the new one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch._C._distributed_c10d as c10d


@pytest.mark.timeout(180)
def test_workers_get_the_current_flight_recorder_variable_and_no_deprecation_warning(tmp_path):
    script = Path(__file__).with_name("fr_env_script.py")
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")}
    p = subprocess.run([sys.executable, "-m", "titan", "run", "--nproc-per-node", "2", "--max-restarts", "0",
                        "--no-agent", "--runs-dir", str(tmp_path / "runs"), "--run-id", "fr", "--", str(script)],
                       capture_output=True, text=True, timeout=170, env=env, start_new_session=True)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    assert "is deprecated" not in out, [ln for ln in out.splitlines() if "deprecated" in ln][:3]
    reports = [json.loads(ln.split("FR ", 1)[1]) for ln in out.splitlines() if ln.startswith("FR {")]
    assert sorted(r["rank"] for r in reports) == [0, 1], out[-2000:]
    generic = hasattr(c10d, "_dump_fr_trace_json")  # this torch has the generic recorder (TORCH_FR_*)
    for r in reports:
        assert r["entries"] >= 1, f"rank {r['rank']}: the flight recorder recorded nothing: {r}"
        if generic:  # this torch knows the current name: only that one is set
            assert r["fr"] and r["nccl"] is None, r
