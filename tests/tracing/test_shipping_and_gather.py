"""Log shipping mappings and configs; `titan gather` merging node-local run directories."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from titan.cli.environment import Environment
from titan.cli.main import run
from titan.events import Event, EventWriter, RunDir, read_run
from titan.exitcodes import ExitCode
from titan.tracing.shipping import ES_FIELDS, LOKI_LABELS, to_elasticsearch, to_loki

ROOT = Path(__file__).resolve().parents[2]
if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _documented_kinds() -> list[str]:
    """Every kind named in the first column of a table in docs/events.md."""
    kinds = set()
    for line in (ROOT / "docs" / "events.md").read_text().splitlines():
        m = re.match(r"^\| `([a-z_]+(?:\.[a-z_.]+)?)` \|", line)
        if m and m.group(1) not in ("v", "ts", "t", "mono", "seq", "run", "node", "pid", "step", "phase",
                                    "kind", "level", "msg", "data", "attempt"):
            kinds.add(m.group(1))
    return sorted(kinds)


def _flat(d: dict, prefix: str = "") -> set[str]:
    out = set()
    for k, v in d.items():
        if isinstance(v, dict) and k != "data":
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out.add(f"{prefix}{k}")
    return out


def test_every_documented_kind_maps_to_elasticsearch_and_loki():
    kinds = _documented_kinds()
    assert len(kinds) >= 8 and "worker.started" in kinds, kinds
    for kind in kinds:
        ev = Event(kind=kind, t=1_700_000_000.25, mono=1.0, run="r1", node="n1", rank=3, attempt=1, pid=42, seq=7,
                   step=10, phase="backward", level="warning", msg="m", data={"x": 1})
        doc = to_elasticsearch(ev)
        assert _flat(doc) == set(ES_FIELDS), kind
        assert doc["event"]["kind"] == kind and doc["@timestamp"] == "2023-11-14T22:13:20.250000Z"
        labels, line, ts = to_loki(ev)
        assert tuple(labels) == LOKI_LABELS and labels["kind"] == kind and ts == 1_700_000_000_250_000_000
        assert json.loads(line)["rank"] == 3 and "rank" not in labels  # high cardinality stays in the line


def test_vector_config_parses_and_implements_the_mapping():
    cfg = tomllib.loads((ROOT / "deploy" / "vector" / "titan.toml").read_text())
    ids = set(cfg["sources"]) | set(cfg["transforms"])
    for section in ("transforms", "sinks"):
        for name, c in cfg[section].items():
            assert set(c["inputs"]) <= ids, (name, c["inputs"])
    vrl = cfg["transforms"]["titan_parse"]["source"]
    for field in ES_FIELDS:
        assert f".{field}" in vrl or f'."{field}"' in vrl, field
    assert set(cfg["sinks"]["loki"]["labels"]) == set(LOKI_LABELS)


def test_fluent_bit_config_parses_and_implements_the_mapping():
    cfg = yaml.safe_load((ROOT / "deploy" / "fluent-bit" / "titan.yaml").read_text())
    pipe = cfg["pipeline"]
    renamed = {r.split()[1] for r in pipe["filters"][0]["rename"]} | {a.split()[0] for a in pipe["filters"][0]["add"]}
    assert renamed == set(ES_FIELDS), renamed ^ set(ES_FIELDS)
    loki = next(o for o in pipe["outputs"] if o["name"] == "loki")
    assert [kv.split("=")[0].strip() for kv in loki["labels"].split(",")] == list(LOKI_LABELS)


def _node_part(root: Path, node: str, ranks: list[int], t0: float) -> Path:
    rd = RunDir.create(root / node, "job1")
    rd.update_run_json({"run_id": "job1", "node_id": node})
    for r in ranks:
        with EventWriter(rd.event_file(node, r, 0, 100 + r), run="job1", node=node, rank=r, attempt=0) as w:
            w.emit("step", step=1)
    with EventWriter(rd.launcher_file(node), run="job1", node=node) as w:
        w.emit("launcher.started")
    return rd.path


def test_gather_merges_two_nodes_into_one_readable_job(tmp_path):
    a = _node_part(tmp_path, "nodeA", [0, 1], 0)
    b = _node_part(tmp_path, "nodeB", [2, 3], 0)
    env = Environment.captured(tmp_path)
    code = run(["gather", "merged", str(a), str(b), "--json"], env)
    assert code == ExitCode.SUCCEEDED, env.stderr.getvalue()
    res = read_run(tmp_path / "merged")
    assert {(e.node, e.rank) for e in res.events if e.kind == "step"} == {("nodeA", 0), ("nodeA", 1), ("nodeB", 2), ("nodeB", 3)}
    assert {e.node for e in res.events if e.kind == "launcher.started"} == {"nodeA", "nodeB"}
    merged = json.loads((tmp_path / "merged" / "run.json").read_text())
    assert set(merged["nodes"]) == {"nodeA", "nodeB"}
    env2 = Environment.captured(tmp_path)
    assert run(["events", str(tmp_path / "merged"), "--kind", "step", "--json"], env2) == ExitCode.SUCCEEDED
    assert len(env2.stdout.getvalue().splitlines()) == 4
    # Triage reads the gathered job as one (a clean job: no diagnosis, but no error either).
    env3 = Environment.captured(tmp_path)
    code = run(["triage", str(tmp_path / "merged"), "--json"], env3)
    assert code in (ExitCode.DIAGNOSED, ExitCode.UNDIAGNOSED), env3.stderr.getvalue()
    assert json.loads(env3.stdout.getvalue())["class"] in (None, "") or code == ExitCode.DIAGNOSED


def test_gather_with_a_fetch_command(tmp_path):
    a = _node_part(tmp_path, "nodeA", [0], 0)
    b = _node_part(tmp_path, "nodeB", [1], 0)
    env = Environment.captured(tmp_path)
    code = run(["gather", "m2", f"hostA:{a}", f"hostB:{b}", "--fetch-command", "cp -a {path}/. {dest}/"], env)
    assert code == ExitCode.SUCCEEDED, env.stderr.getvalue()
    assert len([e for e in read_run(tmp_path / "m2").events if e.kind == "step"]) == 2


@pytest.mark.parametrize("argv, match", [
    (["gather", "out", "nope"], "is not a folder"),
    (["gather", "out", "plain"], "not a Titan run directory"),
    (["gather", "out", "x", "--fetch-command", "true"], "is not HOST:PATH"),
    (["gather", "out", "h:/p", "--fetch-command", "false"], "fetching h:/p failed"),
])
def test_gather_bad_input(tmp_path, argv, match):
    (tmp_path / "plain").mkdir()
    env = Environment.captured(tmp_path)
    assert run(argv, env) == ExitCode.USER_ERROR
    assert match in env.stderr.getvalue() and "Traceback" not in env.stderr.getvalue()
    assert not (tmp_path / "out").exists()


def test_gather_refuses_parts_of_different_runs(tmp_path):
    a = _node_part(tmp_path, "nodeA", [0], 0)
    b = RunDir.create(tmp_path / "other", "job2")
    b.update_run_json({"run_id": "job2", "node_id": "nodeB"})
    env = Environment.captured(tmp_path)
    assert run(["gather", "out", str(a), str(b.path)], env) == ExitCode.USER_ERROR
    assert "different runs" in env.stderr.getvalue()
