"""The event writer: whole lines, nothing lost on SIGKILL, slow-write fallback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from titan.events import SCHEMA_VERSION, EventWriter, read_file


def test_each_event_is_one_complete_json_line(tmp_path):
    path = tmp_path / "e.jsonl"
    with EventWriter(path, run="r", node="n", rank=0, attempt=0) as w:
        w.emit("step", step=1, data={"loss": 1.5})
        w.emit("guard.nonfinite", "NaN in rank 1", level="warning", step=2, phase="backward")
    lines = path.read_text().splitlines()
    assert len(lines) == 2, lines
    objs = [json.loads(x) for x in lines]
    assert [o["kind"] for o in objs] == ["step", "guard.nonfinite"]
    assert objs[0]["data"] == {"loss": 1.5} and objs[0]["v"] == SCHEMA_VERSION and objs[0]["ts"].endswith("Z")
    assert objs[1]["seq"] == 2 and objs[1]["phase"] == "backward" and objs[1]["level"] == "warning"


def test_step_events_are_sampled_but_forced_ones_kept(tmp_path):
    path = tmp_path / "e.jsonl"
    with EventWriter(path, run="r", node="n", step_every=10) as w:
        for s in range(1, 31):
            w.emit("step", step=s, force=(s == 7))
        w.emit("ckpt.saved", step=11)
    evs, _ = read_file(path)
    assert [(e.kind, e.step) for e in evs] == [("step", 7), ("step", 10), ("step", 20), ("step", 30), ("ckpt.saved", 11)]


_CHILD = textwrap.dedent("""
    import sys
    from titan.events import EventWriter
    w = EventWriter(sys.argv[1], run="r", node="n", rank=0)
    i = 0
    while True:
        i += 1
        w.emit("step", step=i, data={"pad": "x" * 200})
        if i % 100 == 0:
            sys.stdout.write(f"{i}\\n"); sys.stdout.flush()
""")


@pytest.mark.timeout(60)
def test_sigkill_mid_stream_loses_no_emitted_line(tmp_path):
    path = tmp_path / "e.jsonl"
    p = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        reported = 0
        while reported < 2000:
            line = p.stdout.readline()
            assert line, "writer child died early"
            reported = int(line)
        p.send_signal(signal.SIGKILL)
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    evs, problems = read_file(path)
    steps = [e.step for e in evs]
    # Every event the child had reported as emitted is on disk, in order, none torn.
    assert steps[:reported] == list(range(1, reported + 1))
    assert steps == list(range(1, len(steps) + 1))
    assert problems == [], problems


def test_slow_write_switches_to_queue_and_reports(tmp_path, monkeypatch):
    path = tmp_path / "e.jsonl"
    w = EventWriter(path, run="r", node="n", slow_write_s=0.05, queue_size=3)
    real_write = os.write
    calls = {"n": 0}

    def slow_write(fd, data):
        calls["n"] += 1
        if calls["n"] == 1:
            time.sleep(0.1)  # one stalled write, as on a disk that hiccups
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", slow_write)
    w.emit("step", step=1)
    assert w.queued, "a write slower than the bound must switch the writer to its queue"
    monkeypatch.setattr(os, "write", real_write)
    w.close()
    evs, problems = read_file(path)
    kinds = [e.kind for e in evs]
    assert kinds[:2] == ["step", "events.slow_write"], kinds
    assert evs[1].data["seconds"] >= 0.05 and problems == []


def test_full_queue_drops_and_counts(tmp_path):
    path = tmp_path / "e.jsonl"
    w = EventWriter(path, run="r", node="n", queue_size=2)
    w._start_queue()
    with w._lock:  # hold the drain thread off while the queue overflows
        for s in range(10):
            w._enqueue_locked(b"")
    assert w.dropped == 8
    w.close()
    evs, _ = read_file(path)
    dropped = [e for e in evs if e.kind == "events.dropped"]
    assert dropped and dropped[0].data["dropped_total"] == 8
