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


def test_a_disk_that_went_full_and_was_freed_again_is_still_said(tmp_path, small_disk):
    """A failed save removes its partial files and retention deletes old checkpoints: the disk
    is no longer full at the end, yet it was (CI regression: the final line said SUCCEEDED and
    nothing else). The watch keeps the lowest reading; the conclusion says both."""
    from titan.events import RunDir
    from titan.exitcodes import ExitCode
    from titan.launch.conclude import conclude
    from titan.launch.diskspace import DiskWatch, disk_state

    rd = RunDir.create(small_disk / "runs", run_id="freed")
    started = time.time()
    with DiskWatch(rd.path, interval_s=0.05) as w:
        _fill(small_disk)
        deadline = time.monotonic() + 10
        while w.full_since is None and time.monotonic() < deadline:
            time.sleep(0.05)
        (small_disk / "filler").unlink()
    end = disk_state(rd.path)
    assert end["full"] is False, end  # the premise: free again at the end
    disk = w.merge(end)
    assert disk["full"] is True and disk["full_at_end"] is False and disk["lowest_free_bytes"] < (1 << 20), disk
    c = conclude(ExitCode.SUCCEEDED, rd, "n0", started, [], None, disk)
    line = c.final_line(0)
    assert "disk full" in line and "went full during the run" in line, line
    # Without the watch's reading, the end state alone says nothing (what the launcher said before).
    assert "disk full" not in conclude(ExitCode.SUCCEEDED, rd, "n0", started, [], None, end).final_line(0)


def test_a_save_refused_for_lack_of_space_makes_the_disk_full_in_the_conclusion(tmp_path):
    from titan.events import RunDir
    from titan.exitcodes import ExitCode
    from titan.launch.conclude import conclude
    from titan.launch.diskspace import disk_state

    rd = RunDir.create(tmp_path / "runs", run_id="refused")
    started = time.time()
    from titan.events import EventWriter  # the workers' own writer, as in a run

    w = EventWriter(rd.event_file("n0", 0, 0, os.getpid()), run=rd.run_id, node="n0", rank=0, attempt=0)
    w.emit("ckpt.failed", "checkpoint step 25 failed: disk_full", level="error", step=25,
           data={"step": 25, "kind": "disk_full"})
    w.emit("ckpt.failed", "checkpoint step 30 failed: io_error", level="error", step=30,
           data={"step": 30, "kind": "io_error"})
    w.close()
    c = conclude(ExitCode.SUCCEEDED, rd, "n0", started, [], None, disk_state(rd.path))
    assert c.disk is not None and c.disk["full"] is True and c.disk["saves_refused"] == 1, c.disk
    assert "1 checkpoint save(s) failed for lack of space (steps 25..25)" in c.final_line(0), c.final_line(0)
