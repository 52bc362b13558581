"""``titan report``: files written, several runs aggregated, user errors, triage guarded."""

from __future__ import annotations

import json

import pytest

from titan.cli.environment import Environment
from titan.cli.main import run as cli
from titan.sla.synthetic import SynthRun

pytestmark = pytest.mark.timeout(60)


def test_report_writes_html_markdown_and_json_for_each_run(tmp_path):
    a = SynthRun(world=2).startup(1).steps(8).end(0).write(tmp_path / "a", "run-a")
    b = (SynthRun(world=2).startup(1).steps(6, ckpt_every=3, stall=0.2).fault(after=0.3).detect(1)
         .restart(2, resume_from=6).steps(3).end(0).write(tmp_path / "b", "run-b"))
    c = SynthRun(world=2).startup(1).steps(3).fault(after=0.1).detect(1).end(0.5, exit_code=1).write(tmp_path / "c", "run-c")
    env = Environment.captured(tmp_path)
    rc = cli(["report", str(a.path), str(b.path), str(c.path), "--json", "--no-triage", "--sla-hours", "0.001"], env)
    assert rc == 0, env.stderr.getvalue()
    out = json.loads(env.stdout.getvalue())
    agg = out["across_runs"]
    assert agg["runs"] == 3 and agg["job_success_rate"] == pytest.approx(2 / 3)
    assert agg["interruption_free_rate"] == pytest.approx(1 / 3)
    for rd in (a, b, c):
        for name in ("index.html", "summary.md", "summary.json"):
            assert (rd.report / name).is_file(), f"missing {rd.report / name}"
        summ = json.loads((rd.report / "summary.json").read_text())
        assert summ["reconciliation"]["within_1pct"], summ["reconciliation"]
    md = (b.report / "summary.md").read_text()
    assert "| 1 | restart |" in md and "inject.kill" in md


def test_report_table_for_people_names_the_cross_run_figures(tmp_path):
    a = SynthRun(world=1).startup(1).steps(3).end(0).write(tmp_path / "a", "ra")
    b = SynthRun(world=1).startup(1).steps(3).end(0).write(tmp_path / "b", "rb")
    env = Environment.captured(tmp_path)
    assert cli(["report", str(a.path), str(b.path), "--no-triage", "--out", "fleet"], env) == 0, env.stderr.getvalue()
    text = env.stdout.getvalue()
    assert "job success rate 100.0%" in text and "uninterrupted stretches" in text
    assert json.loads((tmp_path / "fleet" / "runs.json").read_text())["runs"] == 2
    assert "- job success rate: 100.0%" in (tmp_path / "fleet" / "runs.md").read_text()


def test_report_on_a_folder_that_is_not_a_run_is_a_one_line_user_error(tmp_path):
    env = Environment.captured(tmp_path)
    (tmp_path / "empty").mkdir()
    assert cli(["report", str(tmp_path / "empty")], env) == 2
    err = env.stderr.getvalue()
    assert err.startswith("titan: error:") and "hint:" in err and "Traceback" not in err


def test_overhead_measurement_in_run_json_is_reported_not_bucketed(tmp_path):
    rd = SynthRun(world=1).startup(1).steps(4).end(0).write(tmp_path, "ov")
    obj = json.loads(rd.run_json.read_text())
    obj["overhead"] = {"guard+agent": {"bare_tokens_per_s": 1000.0, "with_tokens_per_s": 985.0, "fraction": 0.015,
                                       "source": "bench/guard_overhead.py"}}
    rd.run_json.write_text(json.dumps(obj))
    env = Environment.captured(tmp_path)
    assert cli(["report", str(rd.path), "--no-triage"], env) == 0, env.stderr.getvalue()
    html = (rd.report / "index.html").read_text()
    assert "overhead-table" in html and "bench/guard_overhead.py" in html
    summ = json.loads((rd.report / "summary.json").read_text())
    assert "guard+agent" in summ["overhead"] and "guard+agent" not in summ["buckets_s"]


def test_a_triage_that_raises_does_not_stop_the_report(tmp_path, monkeypatch):
    import sys
    import types

    def triage(paths):  # noqa: ANN001, ANN202
        raise RuntimeError("triage exploded")

    monkeypatch.setitem(sys.modules, "titan.triage", types.SimpleNamespace(triage=triage))
    rd = SynthRun(world=1).startup(1).steps(3).fault(after=0.1).detect(1).end(0, exit_code=1).write(tmp_path, "tf")
    env = Environment.captured(tmp_path)
    assert cli(["report", str(rd.path)], env) == 0, env.stderr.getvalue()
    summ = json.loads((rd.report / "summary.json").read_text())
    assert "triage exploded" in summ["triage"]["reason"], summ["triage"]
    assert "Triage verdict not available" in (rd.report / "index.html").read_text()


def test_titan_report_as_a_real_subprocess(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    rd = SynthRun(world=2).startup(1).steps(4).end(0).write(tmp_path, "sub")
    titan = Path(sys.executable).with_name("titan")
    p = subprocess.run([str(titan), "report", str(rd.path), "--no-triage"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "succeeded" in p.stdout and (rd.report / "index.html").stat().st_size > 1_000_000


def test_overhead_file_on_the_command_line(tmp_path):
    rd = SynthRun(world=1).startup(1).steps(3).end(0).write(tmp_path, "ovf")
    f = tmp_path / "ab.json"
    f.write_text(json.dumps({"guard": {"fraction": 0.012, "source": "bench/guard_overhead.py"}}))
    env = Environment.captured(tmp_path)
    assert cli(["report", str(rd.path), "--overhead", str(f), "--json"], env) == 0, env.stderr.getvalue()
    assert json.loads(env.stdout.getvalue())["runs"][0]["overhead"]["guard"]["fraction"] == 0.012
    f.write_text("[1, 2]")
    env = Environment.captured(tmp_path)
    assert cli(["report", str(rd.path), "--overhead", str(f)], env) == 2
    assert "is not a JSON object" in env.stderr.getvalue()


def test_node_telemetry_comes_from_the_agents_metric_files_around_the_incident(tmp_path):
    pytest.importorskip("titan.monitor.samples", reason="the node agent (titan.monitor) is not installed")
    from titan.monitor.samples import SampleWriter

    s = SynthRun(world=2).startup(1).steps(5).fault(after=0.2).detect(1).restart(2, resume_from=5).steps(3).end(0)
    rd = s.write(tmp_path, "tel")
    w = SampleWriter(rd.metrics / "agent.n0.jsonl")
    for i in range(-100, 200):  # 1 Hz from 100 s before the run to well after it
        w.write(s.t_start + i, {"host_cpu_util_ratio": 0.9 if 5 <= i <= 8 else 0.1, "host_mem_used_bytes": 2e9})
    w.close()
    env = Environment.captured(tmp_path)
    assert cli(["report", str(rd.path), "--no-triage"], env) == 0, env.stderr.getvalue()
    html = (rd.report / "index.html").read_text()
    assert "metrics/agent.*.jsonl" in html and "n0: host_cpu_util_ratio" in html
    import re

    figs = json.loads(re.search(r"const FIGS = (\{.*?\});\nconst CONFIG", html, re.S).group(1).replace("<\\/", "</"))
    xs = next(t["x"] for t in figs["fig-telemetry"]["data"] if t["name"] == "n0: host_cpu_util_ratio")
    onset = 6.2  # the kill, in seconds since the start
    assert min(xs) >= onset - 60 - 1e-6 and max(xs) <= onset + 1 + 60 + 1e-6, "expected only ±60 s around the incident"
    assert len(xs) > 100


def test_a_job_that_went_on_at_min_says_so_in_the_summary(tmp_path):
    s = SynthRun(world=2).startup(1).steps(6, ckpt_every=3).fault(after=0.1).detect(1)
    s.emit("launcher.world", rank=None, level="warning", msg="continuing at MIN: 1 of 2 nodes (was 2)",
           data={"nodes": 1, "min": 1, "max": 2, "at_min": True, "previous": 2, "lost": ["n1"], "round": 1})
    rd = s.restart(2, resume_from=6).steps(3).end(0).write(tmp_path, "min")
    env = Environment.captured(tmp_path)
    assert cli(["report", str(rd.path), "--no-triage"], env) == 0, env.stderr.getvalue()
    md = (rd.report / "summary.md").read_text()
    assert "- continued at MIN: 1 of 2 nodes (was 2)" in md and "lost: n1" in md, md[:1500]
    assert json.loads((rd.report / "summary.json").read_text())["shrunk"][0]["at_min"] is True
    assert "continued at MIN" in (rd.report / "index.html").read_text()
