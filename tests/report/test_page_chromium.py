"""The report renders in real headless Chromium: no console errors, no network, all plots."""

from __future__ import annotations

import re

import pytest

from titan.cli.environment import Environment
from titan.cli.main import run as cli
from titan.events import Event
from titan.report import SECTIONS
from titan.sla.synthetic import SynthRun

pytestmark = pytest.mark.timeout(120)


def _eventful_run(tmp_path):
    """3 ranks: a skipped step, a straggler, a kill and a hang with restarts, eval, agent samples."""
    s = (SynthRun(world=3).startup(3).steps(40, ckpt_every=10, stall=0.4, skipped=(17,), slow_rank=2, slow_factor=1.3)
         .eval(1.5).fault("inject.kill", rank=1, after=0.4).detect(1.2).restart(2.5, resume_from=40)
         .steps(12, ckpt_every=10, stall=0.4).fault("inject.hang", rank=0, after=0.2)
         .detect(5, kind="hang.detected", rank=0).restart(2, resume_from=50).steps(15, ckpt_every=10, stall=0.4).end(0.8))
    for i in range(22):
        s.events.append(Event(kind="agent.sample", t=s.t_start + i * 4, mono=0.0, run="synth", node="n0",
                              data={"m": {"host_cpu_util": 10 + (40 if 11 < i < 15 else 0) + i % 3,
                                          "host_mem_used_bytes": 1e9 + i * 1e7}}))
    s.events.append(Event(kind="agent.alert", t=s.t_start + 50, mono=0.0, run="synth", node="n0", level="warning",
                          msg="host_cpu_util above baseline + 3σ", data={"rule": "baseline"}))
    return s.write(tmp_path, "eventful")


def test_report_renders_in_headless_chromium_without_errors(tmp_path, chromium_page):
    rd = _eventful_run(tmp_path)
    env = Environment.captured(tmp_path)
    assert cli(["report", str(rd.path), "--no-triage"], env) == 0, env.stderr.getvalue()
    page = rd.report / "index.html"
    res = chromium_page(page)
    shot = res.screenshot(rd.report / "screenshot.png")
    assert res.ready == "1", f"expected every plot to render (ready=1), seen ready={res.ready!r}; errors {res.console_errors}"
    assert res.console_errors == [], f"expected no console errors, seen {res.console_errors}"
    assert res.external_requests == [], f"the page must need no network, it requested {res.external_requests}"
    missing = res.evaluate(f"{list(SECTIONS)!r}.filter(id => !document.getElementById(id))")
    assert missing == [], f"sections missing from the page: {missing}"
    plots = res.evaluate("[...document.querySelectorAll('.js-plotly-plot')].filter(e => e.querySelector('.main-svg')).map(e => e.id)")
    expected = {"fig-timeline", "fig-loss", "fig-steptime", "fig-steptime-series", "fig-badput", "fig-telemetry"}
    assert expected <= set(plots), f"expected rendered plots {sorted(expected)}, seen {plots}"
    rows = res.evaluate("document.getElementById('fig-timeline').layout.yaxis.categoryarray")
    assert {"job", "rank 0", "rank 1", "rank 2", "launcher"} <= set(rows), f"timeline rows: {rows}"
    names = res.evaluate("document.getElementById('fig-loss').data.map(t => [t.name, t.x])")
    marked = {n: x for n, x in names}
    assert 17 in marked.get("skipped / replayed", []), f"step 17 should be marked skipped; traces {list(marked)}"
    assert set(marked.get("lost to rollback (recomputed)", [])) == {51, 52}, marked.get("lost to rollback (recomputed)")
    n_incidents = res.evaluate("document.querySelectorAll('#incident-table tr').length - 1")
    assert n_incidents == 3, f"expected 3 incident rows (skip, kill, hang), seen {n_incidents}"
    assert shot.stat().st_size > 20_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_page_is_self_contained(tmp_path):
    rd = SynthRun(world=2).startup(1).steps(5).end(0).write(tmp_path)
    env = Environment.captured(tmp_path)
    assert cli(["report", str(rd.path)], env) == 0, env.stderr.getvalue()
    text = (rd.report / "index.html").read_text()
    assert not re.search(r"<(script|link|img)[^>]+(src|href)\s*=", text, re.I), "expected no external resources"
    assert "plotly.js v" in text[:200_000], "expected the Plotly.js bundle inlined"
    assert (rd.report / "summary.md").read_text().startswith("# Titan run report")
