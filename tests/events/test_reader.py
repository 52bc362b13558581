"""The reader: merged order across files, clock offsets, torn lines, schema versions."""

from __future__ import annotations

import json

import pytest

from titan.errors import UserError
from titan.events import Event, EventWriter, RunDir, filter_events, read_run


def _line(**kw) -> str:
    base = dict(v=1, kind="step", t=0.0, mono=0.0, run="r", node="a", seq=1)
    base.update(kw)
    return json.dumps(base) + "\n"


def test_merges_files_in_time_order_whatever_the_file_order(tmp_path):
    rd = RunDir.create(tmp_path, "r")
    # File names sort the opposite way from the event times.
    (rd.events_dir / "a.rank0.attempt0.pid1.jsonl").write_text(_line(t=10.0, seq=1, rank=0) + _line(t=30.0, seq=2, rank=0))
    (rd.events_dir / "b.rank1.attempt0.pid2.jsonl").write_text(_line(t=5.0, seq=1, node="b", rank=1) + _line(t=20.0, seq=2, node="b", rank=1))
    res = read_run(rd.path)
    assert [e.t for e in res.events] == [5.0, 10.0, 20.0, 30.0]
    assert res.problems == []


def test_clock_offsets_recorded_at_rendezvous_are_corrected(tmp_path):
    rd = RunDir.create(tmp_path, "r")
    # Node b's clock runs 100 s ahead of rank 0's; its event really happened at 15.
    (rd.events_dir / "a.rank0.attempt0.pid1.jsonl").write_text(
        _line(kind="clock.offset", t=1.0, seq=1, data={"offsets_s": {"a": 0.0, "b": 100.0}})
        + _line(t=10.0, seq=2) + _line(t=20.0, seq=3))
    (rd.events_dir / "b.rank1.attempt0.pid2.jsonl").write_text(_line(t=115.0, seq=1, node="b"))
    res = read_run(rd.path)
    assert [(e.node, e.t) for e in res.events][1:] == [("a", 10.0), ("b", 115.0), ("a", 20.0)]
    assert res.clock_offsets["b"] == 100.0


def test_torn_last_line_is_skipped_and_reported(tmp_path):
    rd = RunDir.create(tmp_path, "r")
    f = rd.events_dir / "a.rank0.attempt0.pid1.jsonl"
    f.write_text(_line(t=1.0, seq=1) + _line(t=2.0, seq=2)[:25])
    res = read_run(rd.path)
    assert [e.t for e in res.events] == [1.0]
    assert len(res.torn_lines) == 1 and res.torn_lines[0].line == 2


def test_newer_schema_version_and_garbage_are_reported_not_fatal(tmp_path):
    rd = RunDir.create(tmp_path, "r")
    f = rd.events_dir / "a.rank0.attempt0.pid1.jsonl"
    f.write_text(_line(t=1.0, seq=1) + _line(t=2.0, seq=2, v=99) + "not json\n" + _line(t=3.0, seq=3))
    res = read_run(rd.path)
    assert [e.t for e in res.events] == [1.0, 3.0]
    reasons = [p.reason for p in res.problems]
    assert any("newer than this reader" in r for r in reasons), reasons
    assert any("JSONDecodeError" in r for r in reasons), reasons
    assert not any(p.torn for p in res.problems)


def test_round_trip_through_writer_and_filters(tmp_path):
    rd = RunDir.create(tmp_path, "r")
    for rank in (0, 1):
        with EventWriter(rd.event_file("n", rank, 0, 100 + rank), run="r", node="n", rank=rank, attempt=0) as w:
            w.emit("step", step=1)
            w.emit("guard.skip", level="warning", step=1)
    evs = read_run(rd.path).events
    assert len(evs) == 4
    assert {e.rank for e in filter_events(evs, kinds=["guard"])} == {0, 1}
    assert len(filter_events(evs, ranks=[1], min_level="warning")) == 1
    assert isinstance(evs[0], Event) and evs[0].source and evs[0].line == 1


def test_missing_or_non_run_directory_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        read_run(tmp_path / "nope")
    (tmp_path / "plain").mkdir()
    with pytest.raises(UserError, match="not a Titan run directory"):
        read_run(tmp_path / "plain")
