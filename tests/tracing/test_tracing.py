"""Step-phase tracing of the reference workload, over OTLP/HTTP to a receiver in the test."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys

import pytest

from otlp_receiver import OTLPReceiver


def _titan_run(tmp_path, *sets, steps=4, timeout=180):
    cmd = [sys.executable, "-m", "titan", "run", "--nproc-per-node", "2", "--runs-dir", str(tmp_path / "runs"),
           "--run-id", "traced", "--max-restarts", "0"]
    for s in sets:
        cmd += ["--set", s]
    cmd += ["--", "-m", "titan.workloads.tinygpt", "--steps", str(steps), "--no-ckpt", "--threads", "1"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=dict(os.environ))
    assert p.returncode == 0, p.stderr[-3000:]
    return tmp_path / "runs" / "traced"


@pytest.mark.timeout(240)
def test_both_ranks_spans_arrive_with_nesting_and_attributes(tmp_path):
    with OTLPReceiver() as rx:
        _titan_run(tmp_path, "tracing.enabled=true", "tracing.exporter=otlp", f"tracing.endpoint={rx.endpoint}",
                   "tracing.sample_ratio=1.0")
    spans = rx.spans
    assert spans, "no span reached the receiver"
    by_id = {s["span_id"]: s for s in spans}
    ranks = {s["attributes"]["titan.rank"] for s in spans}
    assert ranks == {0, 1}, ranks
    names = collections.Counter(s["name"] for s in spans)
    for name in ("step", "data", "forward", "backward", "comm.bucket"):
        assert names[name] >= 2 * 4, (name, names)  # 2 ranks x 4 steps, at least once each
    for s in spans:
        a = s["attributes"]
        assert a["titan.node"] and a["titan.step"] >= 1 and s["resource"]["service.name"] == "titan-training"
        if s["name"] == "step":
            assert s["parent_span_id"] is None
        elif s["name"] == "comm.bucket":
            parent = by_id[s["parent_span_id"]]
            assert parent["name"] == "backward", parent["name"]
            assert s["start"] >= parent["start"] and a["titan.bytes"] > 0
        else:
            # Every phase span hangs under its step (directly or through an enclosing phase).
            p = by_id[s["parent_span_id"]]
            while p["name"] != "step":
                p = by_id[p["parent_span_id"]]
            assert p["attributes"]["titan.step"] == a["titan.step"] and p["trace_id"] == s["trace_id"]


@pytest.mark.timeout(240)
def test_file_exporter_and_sampling_keep_or_drop_whole_steps(tmp_path):
    run_dir = _titan_run(tmp_path, "tracing.enabled=true", "tracing.sample_ratio=0.5", steps=12)
    files = sorted((run_dir / "traces").glob("*.jsonl"))
    assert len(files) == 2, files
    for f in files:
        spans = [json.loads(x) for x in f.read_text().splitlines()]
        steps = {s["attributes"]["titan.step"] for s in spans if s["name"] == "step"}
        assert 0 < len(steps) < 12, f"a 0.5 ratio should keep some steps and drop others, kept {sorted(steps)}"
        # No orphan: every phase span belongs to a kept step.
        assert {s["attributes"]["titan.step"] for s in spans} <= steps


def test_tracing_is_off_by_default_and_validated():
    from titan.errors import UserError
    from titan.settings import load_settings

    assert load_settings(env={}).tracing.enabled is False
    with pytest.raises(UserError, match="sample_ratio"):
        load_settings(env={}, cli={"tracing.sample_ratio": 2})
