"""The report page reads well in real headless Chromium, checked on the rendered DOM:

* one skipped loss spike does not stretch the loss axis (it is clipped and marked);
* no two labels of a figure overlap — plot and axis titles, annotations (the timeline's
  incident labels), tick labels — measured as bounding boxes of the rendered SVG text;
* the header's command is never cut inside a word and does not run off the page.

A screenshot of each checked page is kept next to it (``report/screenshot-layout.png``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from titan.cli.environment import Environment
from titan.cli.main import run as cli
from titan.events import Event
from titan.sla.synthetic import SynthRun

pytestmark = pytest.mark.timeout(180)

SPIKE = 200.0
#: Every text label of each Plotly figure, and the pairs whose boxes intersect (by > 1 px).
_OVERLAPS_JS = r"""
(() => {
  const sel = ['.gtitle', '.xtitle', '.ytitle', '[class^="y"][class$="title"]', '[class^="x"][class$="title"]',
               '.annotation-text', '.xtick text', '.ytick text', '[class^="y"][class$="tick"] text',
               '.legendtext'].join(',');
  const out = {};
  for (const fig of document.querySelectorAll('.js-plotly-plot')) {
    const seen = new Set();
    const boxes = [];
    for (const el of fig.querySelectorAll(sel)) {
      if (seen.has(el) || !el.textContent.trim()) continue;
      seen.add(el);
      const r = el.getBoundingClientRect();
      if (r.width < 1 || r.height < 1) continue;
      const cls = (el.getAttribute('class') || el.parentNode.getAttribute('class') || '').split(' ')[0];
      boxes.push({t: el.textContent.trim().slice(0, 40), c: cls, l: r.left, r: r.right, top: r.top, b: r.bottom});
    }
    const bad = [];
    for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
      const a = boxes[i], b = boxes[j];
      const w = Math.min(a.r, b.r) - Math.max(a.l, b.l), h = Math.min(a.b, b.b) - Math.max(a.top, b.top);
      if (w > 1 && h > 1) bad.push(`${a.c}:'${a.t}' x ${b.c}:'${b.t}' (${w.toFixed(0)}x${h.toFixed(0)} px)`);
    }
    out[fig.id] = {labels: boxes.length, overlaps: bad};
  }
  return out;
})()
"""


def _crowded_run(tmp_path):
    """3 ranks; a 200x loss spike skipped at step 17, a NaN skipped at 19, a kill and a hang a
    few seconds apart (close incident labels), 14 moving telemetry series, a long command."""
    s = (SynthRun(world=3).startup(3).steps(40, ckpt_every=10, stall=0.4, skipped=(17, 19))
         .fault("inject.kill", rank=1, after=0.4).detect(1.2).restart(2.5, resume_from=40)
         .steps(3).fault("inject.hang", rank=0, after=0.2).detect(3, kind="hang.detected", rank=0)
         .restart(2, resume_from=40).steps(20, ckpt_every=10, stall=0.4).end(0.8))
    for ev in s.events:
        if ev.kind == "step" and ev.step == 17:
            ev.data["loss"] = SPIKE
    names = ["host_cpu_util", "host_mem_used_bytes", "host_load1", "disk_read_bytes_per_s",
             "disk_write_bytes_per_s", "disk_busy_fraction", "net_rx_bytes_per_s", "net_tx_bytes_per_s",
             "net_tcp_retransmits_per_s", "gpu0_util", "gpu0_mem_used_bytes", "gpu0_temp_c", "gpu0_power_w",
             "probe_rtt_seconds_to_peer_node1"]
    for i in range(40):
        m = {n: (k + 1) * 10.0 + ((i * (k + 3)) % 7) * (k + 1) for k, n in enumerate(names)}
        s.events.append(Event(kind="agent.sample", t=s.t_start + i * 2, mono=0.0, run="synth", node="n0",
                              data={"m": m}))
    rd = s.write(tmp_path, "crowded")
    rj = json.loads(rd.run_json.read_text())
    rj["command"] = ["titan", "run", "--nproc-per-node", "3", "--set", "checkpoint.every_steps=10"] + [
        f"--set=guard.option_number_{k}=value-{k}" for k in range(14)] + [
        "--", "-m", "titan.workloads.tinygpt", "--steps", "63", "--out", "/a/very/long/path/" + "x" * 120]
    rd.run_json.write_text(json.dumps(rj))
    return rd, rj["command"]


@pytest.fixture(scope="module")
def crowded_page(tmp_path_factory):
    # This folder's conftest (by path: in a full run `conftest` names another folder's).
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("_report_chromium", Path(__file__).with_name("conftest.py"))
    chromium = sys.modules.get("_report_chromium") or importlib.util.module_from_spec(spec)
    if "_report_chromium" not in sys.modules:
        sys.modules["_report_chromium"] = chromium  # dataclasses look their module up there
        spec.loader.exec_module(chromium)  # type: ignore[union-attr]
    CHROMIUM, chromium_session = chromium.CHROMIUM, chromium.chromium_session
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install -y chromium; .ci/run installs it)")
    tmp = tmp_path_factory.mktemp("layout")
    rd, command = _crowded_run(tmp)
    env = Environment.captured(tmp)
    assert cli(["report", str(rd.path), "--no-triage"], env) == 0, env.stderr.getvalue()
    with chromium_session(tmp) as load:
        res = load(rd.report / "index.html")
        res.screenshot(rd.report / "screenshot-layout.png")
        assert res.ready == "1" and res.console_errors == [], (res.ready, res.console_errors)
        yield res, command


def test_one_skipped_spike_does_not_stretch_the_loss_axis(crowded_page):
    res, _ = crowded_page
    loss = res.evaluate("(() => { const g = document.getElementById('fig-loss'); const r = g._fullLayout.yaxis.range;"
                        " return {range: r, traces: g.data.map(t => ({name: t.name, x: t.x, y: t.y})),"
                        " notes: (g.layout.annotations || []).map(a => a.text)}; })()")
    lo, hi = loss["range"]
    assert hi < 20, f"one {SPIKE:g} spike must not stretch the loss axis (kept losses are < 5); range {loss['range']}"
    out = [t for t in loss["traces"] if "outside" in t["name"]]
    assert out and 17 in out[0]["x"], f"the spike at step 17 should be marked as outside the axis: {loss['traces']}"
    i = out[0]["x"].index(17)
    assert lo <= out[0]["y"][i] <= hi, "the marker sits on the plot's edge, inside the axis"
    assert any("17" in n and "200" in n for n in loss["notes"]), f"the clipped value is written on the plot: {loss['notes']}"


def test_no_two_labels_of_a_figure_overlap(crowded_page):
    """Timeline incident labels, telemetry panel titles, axis titles, ticks: DOM boxes."""
    res, _ = crowded_page
    boxes = res.evaluate(_OVERLAPS_JS)
    assert boxes.get("fig-telemetry", {}).get("labels", 0) >= 14, f"telemetry labels found: {boxes.get('fig-telemetry')}"
    assert boxes.get("fig-timeline", {}).get("labels", 0) >= 6, f"timeline labels found: {boxes.get('fig-timeline')}"
    bad = {fid: v["overlaps"] for fid, v in boxes.items() if v["overlaps"]}
    assert not bad, "overlapping labels (see report/screenshot-layout.png):\n" + json.dumps(bad, indent=1)[:4000]


def test_header_command_is_whole_words_inside_the_page(crowded_page):
    res, command = crowded_page
    head = res.evaluate("(() => { const c = document.querySelector('header .cmd') || document.querySelector('header .sub');"
                        " return c && {text: c.textContent.split('command: ').pop().trim(), title: c.getAttribute('title'),"
                        " right: c.getBoundingClientRect().right, page: document.documentElement.clientWidth,"
                        " scroll: document.documentElement.scrollWidth}; })()")
    assert head is not None, "the header should show the command"
    full = " ".join(command)
    shown = head["text"].removesuffix(" …")
    assert full.startswith(shown) and (shown == full or full[len(shown)] == " "), \
        f"the command is cut inside a word: ...{shown[-40:]!r}"
    assert head["title"] == full, "the whole command is in the tooltip"
    assert head["right"] <= head["page"] + 1 and head["scroll"] <= head["page"] + 1, head
