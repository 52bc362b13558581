"""Events and run-directory JSON are strict JSON: a NaN is written as "nan", never as NaN.

Python's ``json`` writes ``NaN``/``Infinity`` by default, which jq, JavaScript and most log
pipelines reject (issue 15: ``"grad_norm": NaN`` in step events). Schema version 2 writes
the strings ``"nan"``/``"inf"``/``"-inf"``; version-1 files (which could hold the tokens)
still read, with their data normalised to the same strings. The conftest checks every
run directory the test suite produces (``tests/_strict_json_scan.py``).
"""

from __future__ import annotations

import json
import math

from titan.events import SCHEMA_VERSION, EventWriter, RunDir, atomic_write_json, loads_strict, read_run
from titan.monitor.samples import SampleWriter, read_samples

from _strict_json_scan import violations


def test_a_non_finite_step_value_is_written_as_a_string_a_strict_parser_accepts(tmp_path):
    path = tmp_path / "w.jsonl"
    with EventWriter(path, run="r", node="n", rank=0) as w:
        w.emit("step", step=3, data={"loss": float("nan"), "grad_norm": float("inf"),
                                     "losses": [1.0, float("-inf")], "nested": {"x": float("nan")}})
    line = path.read_text().splitlines()[0]
    obj = loads_strict(line)  # raises on NaN/Infinity tokens
    assert obj["v"] == SCHEMA_VERSION >= 2, obj["v"]
    assert obj["data"] == {"loss": "nan", "grad_norm": "inf", "losses": [1.0, "-inf"], "nested": {"x": "nan"}}, obj
    assert math.isnan(float(obj["data"]["loss"])), "float() of the stored value must give the number back"


def test_tensor_values_that_are_nan_are_strict_too(tmp_path):
    import torch

    path = tmp_path / "t.jsonl"
    with EventWriter(path, run="r", node="n") as w:
        w.emit("step", step=1, data={"grad_norm": torch.tensor(float("nan"))})
    assert loads_strict(path.read_text().splitlines()[0])["data"]["grad_norm"] == "nan"


def test_a_version_1_run_directory_with_nan_tokens_still_reads(tmp_path):
    rd = RunDir.create(tmp_path / "runs", "old")
    rd.events_dir.mkdir(parents=True, exist_ok=True)
    old = ('{"v":1,"ts":"2026-11-30T13:19:21.000000Z","kind":"step","t":1764508761.0,"mono":1.0,"run":"old",'
           '"node":"vm","rank":0,"seq":1,"step":4,"data":{"loss":NaN,"grad_norm":Infinity,"ok":2.5}}\n')
    (rd.events_dir / "vm.rank0.attempt0.pid1.jsonl").write_text(old)
    res = read_run(rd)
    assert not res.problems, res.problems
    (ev,) = res.events
    assert ev.v == 1 and dict(ev.data) == {"loss": "nan", "grad_norm": "inf", "ok": 2.5}, ev.data
    loads_strict(json.dumps(ev.to_dict()))  # what `titan events --json` prints is strict


def test_run_json_and_agent_samples_are_strict(tmp_path):
    atomic_write_json(tmp_path / "x.json", {"a": float("nan"), "b": [float("inf")]})
    assert loads_strict((tmp_path / "x.json").read_text()) == {"a": "nan", "b": ["inf"]}
    sw = SampleWriter(tmp_path / "s.jsonl")
    sw.write(1.0, {"gpu.temp": float("nan"), "cpu": 0.5})
    sw.close()
    for line in (tmp_path / "s.jsonl").read_text().splitlines():
        loads_strict(line)
    ((_, snap),) = list(read_samples(tmp_path / "s.jsonl"))
    assert math.isnan(snap["gpu.temp"]) and snap["cpu"] == 0.5, snap


def test_the_scan_flags_a_nan_token_and_ignores_garbage(tmp_path):
    rd = RunDir.create(tmp_path / "runs", "scan")
    (rd.path / "launcher.vm.jsonl").write_text('{"v":1,"kind":"x","data":{"a":NaN}}\nnot json at all\n{"torn":')
    bad = violations(tmp_path)
    assert len(bad) == 1 and "launcher.vm.jsonl:1" in bad[0] and "NaN" in bad[0], bad
    (rd.path / "launcher.vm.jsonl").write_text('{"v":2,"kind":"x","data":{"a":"nan"}}\n')
    assert violations(tmp_path) == []


def test_the_shared_reference_run_is_strict_json(reference_run):
    assert violations(reference_run.run_dir.path) == []
