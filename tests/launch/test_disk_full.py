"""A run directory on a full disk (a 20 MB tmpfs filled mid-run): a classified failure in one
line, run.json finalised, no traceback, no torn line, read-only verbs still work (issue 15).

Before: workers died of SIGBUS (their beacon's unbacked mmap pages), `titan run` ended in
"unexpected OSError: [Errno 28]", run.json said "running", a launcher line was torn, and
`titan report --out elsewhere` failed because it wrote into the full run directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from titan.events import read_run

from _tmpfs import mounted_tmpfs

TITAN = Path(sys.executable).with_name("titan")


@pytest.fixture
def small_disk(tmp_path: Path):
    with mounted_tmpfs(tmp_path / "disk", "20m") as mnt:
        yield mnt


def _fill(mnt: Path) -> int:
    """Write zeros until the file system refuses (ENOSPC); returns the bytes written."""
    n = 0
    with open(mnt / "filler", "wb", buffering=0) as f:
        with contextlib.suppress(OSError):
            while True:
                n += f.write(b"\0" * (64 << 10))
    return n


def _titan(*argv: str, cwd: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(TITAN), *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          start_new_session=True)


@pytest.mark.timeout(300)
def test_a_full_disk_is_one_classified_line_and_the_run_directory_stays_readable(tmp_path, small_disk):
    rd = small_disk / "runs" / "full"
    p = subprocess.Popen([str(TITAN), "run", "--nproc-per-node", "2", "--max-restarts", "1", "--runs-dir",
                          str(small_disk / "runs"), "--run-id", "full", "--", "-m", "titan.workloads.tinygpt",
                          "--steps", "150", "--ckpt-every", "5", "--threads", "1", "--log-every", "0"],
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline:
            if any('"step":20,' in f.read_text() for f in (rd / "events").glob("*.rank0.*.jsonl")):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the run never reached step 20")
        _fill(small_disk)  # (the checkpoints may have filled it already)
        st = os.statvfs(small_disk)
        assert st.f_bavail * st.f_frsize < (1 << 20), "the disk should be full now"
        out, err = p.communicate(timeout=200)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait(10)
    assert "Traceback" not in err and "unexpected OSError" not in err, err[-3000:]
    final = [ln for ln in err.splitlines() if ln.startswith("titan run: ")][-1]
    assert "disk full" in final, f"the final line must say the disk is full: {final}"
    assert not [ln for ln in err.splitlines() if "exitcode: -7" in ln], "a worker died of SIGBUS (beacon mmap)"
    meta = json.loads((rd / "run.json").read_text())
    assert meta["status"] == "finished" and meta["disk"]["full"] is True, {k: meta.get(k) for k in ("status", "disk")}
    assert not list(rd.glob(".*.tmp*")) and not (rd / ".titan-reserve").exists(), list(rd.iterdir())
    problems = read_run(rd).problems
    torn = [f"{Path(x.source).name}:{x.line}: {x.reason}" for x in problems]
    assert not torn, f"lines a full disk tore: {torn[:5]}"
    # Read-only verbs on the full disk.
    ev = _titan("events", str(rd), "--json", cwd=tmp_path)
    assert ev.returncode == 0 and ev.stdout and "Traceback" not in ev.stderr, ev.stderr[-1500:]
    tri = _titan("triage", str(rd), "--no-save", cwd=tmp_path)
    assert tri.returncode in (0, 4, 5) and "Traceback" not in tri.stderr, (tri.returncode, tri.stderr[-1500:])
    rep = _titan("report", str(rd), "--out", str(tmp_path / "elsewhere"), "--no-triage", cwd=tmp_path)
    assert rep.returncode == 0 and "Traceback" not in rep.stderr, rep.stderr[-1500:]
    assert (tmp_path / "elsewhere" / "full" / "index.html").is_file(), list((tmp_path / "elsewhere").rglob("*"))
    assert not list((rd / "report").glob(".*tmp*")), "a failed write left a temporary file in the run directory"
