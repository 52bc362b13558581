"""End to end: a guard abort ends ``titan run`` with GAVE_UP and no restart."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.timeout(240)
def test_guard_abort_ends_the_job_with_gave_up_and_no_restart(tmp_path: Path) -> None:
    titan = Path(sys.executable).with_name("titan")
    cmd = [str(titan), "run", "--nproc-per-node", "1", "--max-restarts", "2", "--runs-dir", str(tmp_path),
           "--run-id", "esc", "--set", "guard.persistent_k=2", "--set", "guard.escalation=lower_lr,abort",
           "--", str(HERE / "escalate_script.py")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=200, cwd=tmp_path)
    assert proc.returncode == 3, f"expected exit 3 (GAVE_UP), saw {proc.returncode}\n{proc.stderr[-3000:]}"
    run = tmp_path / "esc"
    files = sorted(p.name for p in (run / "events").glob("*.jsonl") if ".rank" in p.name)
    attempts = {name.split(".")[2] for name in files}
    assert len(attempts) == 1, f"expected one attempt (no restart), saw worker files {files}"
    events = [json.loads(line) for p in (run / "events").glob("*.jsonl") for line in p.read_text().splitlines()
              if line.strip()]
    esc = [e for e in events if e["kind"] == "guard.escalate"]
    assert [e["data"]["action"] for e in esc] == ["lower_lr", "abort"], [e["msg"] for e in esc]
    assert esc[-1]["level"] == "critical" and esc[-1]["data"]["exit_code"] == 3
