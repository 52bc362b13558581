"""Plotly figure specifications (plain dicts for Plotly.js) built from ``RunData``."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from titan.report.data import NOTABLE_LEVELS, RunData, phase_spans, step_times_by_rank, telemetry
from titan.sla.accounting import BUCKET_DOC, BUCKETS
from titan.sla.steps import event_attempt

__all__ = ["BUCKET_COLORS", "figures"]

BUCKET_COLORS = {
    "goodput": "#2ca02c", "startup": "#7f7f7f", "ckpt_stall": "#1f77b4", "eval": "#9467bd",
    "detection": "#d62728", "restart": "#ff7f0e", "recompute": "#8c564b", "skipped_replayed": "#e377c2",
    "shutdown": "#bcbd22",
}
_PHASE_COLORS = ["#c7e9c0", "#c6dbef", "#fdd0a2", "#dadaeb", "#fcbba1", "#d9d9d9", "#fde0ef", "#e5f5e0"]
_X = {"title": {"text": "seconds since the run started"}, "zeroline": False}
#: Most points one figure draws (SVG, no WebGL: headless and remote viewers may lack a GPU).
_MAX_TICKS = 4000
#: Telemetry small multiples: plot height and the label above each panel, in pixels.
_PANEL_PX = 80
_PANEL_LABEL_PX = 20
_MAX_SERIES_POINTS = 2000
#: Incident labels above the timeline: one row every this many pixels; rows are assigned so
#: that labels never overlap on a plot as narrow as _NARROW_PLOT_PX (at ~_CHAR_PX per char).
_LABEL_ROW_PX = 14
_NARROW_PLOT_PX = 480
_CHAR_PX = 6.5


def _label_rows(xs: list[float], widths_chars: list[int], span: float) -> list[int]:
    """Greedy rows for left-anchored labels at data positions ``xs`` (time order not needed):
    a label goes to the lowest row whose last label ends before it starts. O(n · rows)."""
    per_px = span / _NARROW_PLOT_PX
    ends: list[float] = []
    out = [0] * len(xs)
    for i in sorted(range(len(xs)), key=lambda k: xs[k]):
        width = (widths_chars[i] * _CHAR_PX + 8) * per_px
        row = next((r for r, e in enumerate(ends) if e <= xs[i]), len(ends))
        if row == len(ends):
            ends.append(0.0)
        ends[row] = xs[i] + width
        out[i] = row
    return out


def _layout(text: str, **kw: Any) -> dict[str, Any]:
    base = {"title": {"text": text, "x": 0.01}, "margin": {"l": 70, "r": 20, "t": 40, "b": 45},
            "legend": {"orientation": "h", "y": -0.2}, "hovermode": "closest",
            "paper_bgcolor": "white", "plot_bgcolor": "#fafafa"}
    base.update(kw)
    return base


def _timeline(d: RunData) -> dict[str, Any]:
    acc, t0 = d.acc, d.acc.t0
    rows = ["job"] + [f"rank {r}" for r in d.ranks] + ["launcher"]
    traces: list[dict[str, Any]] = []
    by_label: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for a, b, lab in acc.segments:
        by_label[lab].append((a - t0, b - a))
    for lab in BUCKETS:
        if by_label.get(lab):
            xs = by_label[lab]
            traces.append({"type": "bar", "orientation": "h", "name": lab, "legendgroup": "buckets",
                           "y": ["job"] * len(xs), "base": [x for x, _ in xs], "x": [w for _, w in xs],
                           "marker": {"color": BUCKET_COLORS[lab]}, "width": 0.7,
                           "hovertemplate": f"{lab}: %{{x:.2f}} s from %{{base:.2f}} s<extra>{BUCKET_DOC[lab]}</extra>"})
    spans = phase_spans(d.events, t0)
    phases = sorted({s["phase"] for s in spans})
    for i, ph in enumerate(phases):
        ss = [s for s in spans if s["phase"] == ph and s["t1"] > s["t0"]]
        if ss:
            traces.append({"type": "bar", "orientation": "h", "name": f"phase {ph}", "legendgroup": "phases",
                           "y": [f"rank {s['rank']}" for s in ss], "base": [s["t0"] for s in ss],
                           "x": [s["t1"] - s["t0"] for s in ss], "width": 0.5, "opacity": 0.8,
                           "marker": {"color": _PHASE_COLORS[i % len(_PHASE_COLORS)]},
                           "customdata": [s["attempt"] for s in ss],
                           "hovertemplate": f"phase {ph}, attempt %{{customdata}}<extra></extra>"})
    steps: dict[int, dict[str, list]] = defaultdict(lambda: {"x": [], "y": [], "s": []})
    notable: dict[str, list] = {"x": [], "y": [], "text": []}
    restarts: dict[str, list] = {"x": [], "y": [], "text": []}
    for ev in d.events:
        if ev.kind.startswith("agent."):
            continue
        row = f"rank {ev.rank}" if ev.rank is not None else "launcher"
        if ev.kind == "step":
            s = steps[event_attempt(ev)]
            s["x"].append(ev.t - t0)
            s["y"].append(row)
            s["s"].append(ev.step)
        elif ev.kind in ("launcher.restart", "worker.started"):
            restarts["x"].append(ev.t - t0)
            restarts["y"].append(row)
            restarts["text"].append(f"{ev.kind} (attempt {event_attempt(ev)})")
        elif ev.level in NOTABLE_LEVELS or ev.kind.startswith(("inject.", "guard.", "hang.", "straggler.")):
            notable["x"].append(ev.t - t0)
            notable["y"].append(row)
            notable["text"].append(f"{ev.kind} step {ev.step}: {ev.msg}"[:200])
    total = sum(len(s["x"]) for s in steps.values())
    k = max(1, -(-total // _MAX_TICKS))  # keep the SVG light: every k-th step tick on long runs
    for att in sorted(steps):
        s = {key: v[::k] for key, v in steps[att].items()}
        traces.append({"type": "scatter", "mode": "markers",
                       "name": f"steps, attempt {att}", "legendgroup": "steps", "x": s["x"], "y": s["y"],
                       "customdata": s["s"], "marker": {"symbol": "line-ns-open", "size": 9, "line": {"width": 1}},
                       "hovertemplate": "step %{customdata} at %{x:.2f} s<extra></extra>"})
    if restarts["x"]:
        traces.append({"type": "scatter", "mode": "markers", "name": "(re)start", "x": restarts["x"],
                       "y": restarts["y"], "text": restarts["text"], "hovertemplate": "%{text}<extra></extra>",
                       "marker": {"symbol": "triangle-right", "size": 10, "color": "#ff7f0e"}})
    if notable["x"]:
        traces.append({"type": "scatter", "mode": "markers", "name": "faults, warnings, errors", "x": notable["x"],
                       "y": notable["y"], "text": notable["text"], "hovertemplate": "%{text}<extra></extra>",
                       "marker": {"symbol": "x", "size": 10, "color": "#d62728"}})
    shapes, notes = [], []
    for inc in acc.incidents:
        for t, color, dash in ((inc.onset_t, "#d62728", "dash"), (inc.detect_t, "#ff7f0e", "dot"),
                               (inc.recovered_t, "#2ca02c", "dot")):
            if t is not None:
                shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": t - t0, "x1": t - t0, "y0": 0,
                               "y1": 1, "line": {"color": color, "dash": dash, "width": 1}})
        notes.append({"x": inc.onset_t - t0, "y": 1, "yref": "paper", "xref": "x", "showarrow": False,
                      "yanchor": "bottom", "xanchor": "left", "text": f"#{inc.index} {inc.kind}",
                      "font": {"size": 10, "color": "#d62728"}})
    levels = _label_rows([n["x"] for n in notes], [len(n["text"]) for n in notes], max(acc.t1 - t0, 1e-9))
    for n, lv in zip(notes, levels):
        n["yshift"] = _LABEL_ROW_PX * lv
    top = 44 + _LABEL_ROW_PX * (max(levels, default=0) + 1)
    return {"data": traces, "layout": _layout(
        "Timeline: accounting, every rank's phases and steps, incidents", barmode="overlay",
        height=max(110 + 40 * len(rows), 130 + 21 * len(traces)) + top - 40, xaxis=_X, shapes=shapes,
        annotations=notes, margin={"l": 70, "r": 20, "t": top, "b": 45},
        title={"text": "Timeline: accounting, every rank's phases and steps, incidents", "x": 0.01,
               "y": 1, "yref": "container", "yanchor": "top", "pad": {"t": 10}},
        legend={"orientation": "v", "x": 1.01, "y": 1, "font": {"size": 11}, "tracegroupgap": 6},
        yaxis={"categoryorder": "array", "categoryarray": list(reversed(rows)), "automargin": True})}


def _loss(d: RunData) -> dict[str, Any] | None:
    ex = [e for e in d.acc.execs if e.loss is not None]
    if not ex:
        return None
    finite = [e for e in ex if math.isfinite(e.loss)]  # type: ignore[arg-type]
    top = max((e.loss for e in finite), default=1.0)  # type: ignore[type-var]
    groups = {
        "kept": ([e for e in finite if e.label == "goodput"], {"color": "#1f77b4", "size": 4}, "lines+markers"),
        "lost to rollback (recomputed)": ([e for e in finite if e.label == "recompute"],
                                          {"color": "#8c564b", "size": 7, "symbol": "circle-open"}, "markers"),
        "skipped / replayed": ([e for e in finite if e.label == "skipped_replayed"],
                               {"color": "#e377c2", "size": 10, "symbol": "x"}, "markers"),
    }
    lo, hi = _loss_window([e.loss for e in groups["kept"][0]] or [e.loss for e in finite])  # type: ignore[misc]
    inside = lambda v: lo <= v <= hi  # noqa: E731
    traces = []
    for name, (es, marker, mode) in groups.items():
        es = [e for e in es if inside(e.loss)]  # type: ignore[arg-type]
        if es or name == "kept":
            traces.append({"type": "scatter", "mode": mode, "name": name, "x": [e.step for e in es],
                           "y": [e.loss for e in es], "marker": marker, "customdata": [e.attempt for e in es],
                           "hovertemplate": "step %{x}: loss %{y:.4f} (attempt %{customdata})<extra>" + name + "</extra>"})
    outside = [e for e in finite if not inside(e.loss)]  # type: ignore[arg-type]
    layout_y: dict[str, Any] = {"title": {"text": "loss"}}
    notes: list[dict[str, Any]] = []
    if outside:  # one spike must not flatten the curve: clip it to the axis and say so
        pad = (hi - lo) * 0.04
        edge = lambda v: hi + pad if v > hi else lo - pad  # noqa: E731
        labels = {"goodput": "kept", "recompute": "lost to rollback", "skipped_replayed": "skipped / replayed"}
        traces.append({"type": "scatter", "mode": "markers", "name": "outside the axis (clipped)",
                       "x": [e.step for e in outside], "y": [edge(e.loss) for e in outside],
                       "customdata": [[e.loss, labels.get(e.label, e.label)] for e in outside],
                       "marker": {"color": "#e377c2", "size": 11, "line": {"width": 1, "color": "#222"},
                                  "symbol": ["triangle-up" if e.loss > hi else "triangle-down" for e in outside]},
                       "hovertemplate": "step %{x}: loss %{customdata[0]:.4g} (%{customdata[1]}), outside the axis"
                                        "<extra></extra>"})
        layout_y["range"] = [lo - 2 * pad, hi + 2 * pad]
        listed = ", ".join(f"step {e.step}: {e.loss:.4g}" for e in outside[:4]) + (" …" if len(outside) > 4 else "")
        notes.append({"xref": "paper", "yref": "paper", "x": 0.99, "y": 0.99, "xanchor": "right", "yanchor": "top",
                      "showarrow": False, "text": f"outside the axis: {listed}", "font": {"size": 11, "color": "#a21caf"},
                      "bgcolor": "rgba(255,255,255,0.8)"})
    bad = [e for e in ex if not math.isfinite(e.loss)]  # type: ignore[arg-type]
    if bad:
        y_bad = layout_y["range"][1] if "range" in layout_y else top
        traces.append({"type": "scatter", "mode": "markers", "name": "non-finite loss", "x": [e.step for e in bad],
                       "y": [y_bad] * len(bad), "marker": {"color": "#d62728", "size": 11, "symbol": "triangle-down"},
                       "hovertemplate": "step %{x}: loss not finite<extra></extra>"})
    return {"data": traces, "layout": _layout("Loss (skipped and replayed steps marked)", height=360,
                                              xaxis={"title": {"text": "step"}, "zeroline": False},
                                              yaxis=layout_y, annotations=notes)}


def _loss_window(kept: list[float]) -> tuple[float, float]:
    """The loss range the axis shows: the kept curve's span and half of it again each side.
    A value outside (a skipped 50x spike) is clipped to the edge and marked, so one outlier
    cannot flatten the curve."""
    if not kept:
        return -math.inf, math.inf
    a, b = min(kept), max(kept)
    span = (b - a) or (abs(b) * 0.1) or 1.0
    return a - 0.5 * span, b + 0.5 * span


def _step_time(d: RunData) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    st = step_times_by_rank(d.events)
    if not st:
        return None, None
    box = [{"type": "box", "name": f"rank {r}", "y": [v for _, v, _ in st[r]], "boxpoints": "outliers",
            "hovertemplate": "%{y:.4f} s<extra>rank " + str(r) + "</extra>"} for r in sorted(st)]
    series = []
    for r in sorted(st):
        xs: list[int | None] = []
        ys: list[float | None] = []
        k = max(1, -(-len(st[r]) // _MAX_SERIES_POINTS))
        for i, (step, v, att) in enumerate(st[r]):
            if i % k and (i + 1 == len(st[r]) or st[r][i + 1][2] == att) and att == st[r][i - 1][2]:
                continue  # thinned, but keep both ends of every attempt
            if i and att != st[r][i - 1][2]:  # a restart: break the line instead of drawing back
                xs.append(None)
                ys.append(None)
            xs.append(step)
            ys.append(v)
        series.append({"type": "scatter", "mode": "lines", "name": f"rank {r}", "x": xs, "y": ys,
                       "line": {"width": 1}, "connectgaps": False})
    strag = [ev for ev in d.events if ev.kind == "straggler.detected"]
    if strag:
        series.append({"type": "scatter", "mode": "markers", "name": "straggler.detected",
                       "x": [ev.step for ev in strag], "y": [0] * len(strag), "text": [ev.msg for ev in strag],
                       "marker": {"symbol": "star", "size": 12, "color": "#d62728"},
                       "hovertemplate": "%{text}<extra></extra>"})
    return ({"data": box, "layout": _layout("Step-time distribution per rank (stragglers stand out)", height=340,
                                             showlegend=False, yaxis={"title": {"text": "step_time_s"}})},
            {"data": series, "layout": _layout("Step time by step, per rank", height=320,
                                                xaxis={"title": {"text": "step"}}, yaxis={"title": {"text": "s"}})})


def _badput(d: RunData) -> dict[str, Any]:
    acc = d.acc
    labels = list(BUCKETS)
    vals = [acc.buckets[k] for k in labels]
    w = acc.wall_s or 1.0
    return {"data": [{"type": "bar", "orientation": "h", "y": labels, "x": vals,
                      "marker": {"color": [BUCKET_COLORS[k] for k in labels]},
                      "text": [f"{v:.2f} s ({v / w:.1%})" for v in vals], "textposition": "auto",
                      "customdata": [BUCKET_DOC[k] for k in labels],
                      "hovertemplate": "%{y}: %{x:.3f} s<br>%{customdata}<extra></extra>"}],
            "layout": _layout("Where the wall time went (goodput and badput by cause)", height=360, showlegend=False,
                              xaxis={"title": {"text": "seconds"}},
                              yaxis={"autorange": "reversed", "automargin": True})}


def _telemetry(d: RunData) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    tel = telemetry(d.events, d.acc, d)
    if not tel["series"] and not tel["alerts"]:
        return None, tel
    names = list(tel["series"]) or ["alerts"]
    n = len(names)
    layout_axes: dict[str, Any] = {}
    traces: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    # Small multiples: one y-axis per series (bytes next to ratios would flatten the ratios),
    # each named by a horizontal label above its panel (rotated axis titles of short panels
    # run into each other).
    inner = n * (_PANEL_PX + _PANEL_LABEL_PX)
    for i, name in enumerate(names):
        ax = "y" if i == 0 else f"y{i + 1}"
        top = 1 - (i * (_PANEL_PX + _PANEL_LABEL_PX) + _PANEL_LABEL_PX) / inner
        layout_axes["yaxis" if i == 0 else f"yaxis{i + 1}"] = {
            "domain": [max(0.0, top - _PANEL_PX / inner), top], "automargin": True, "nticks": 4,
            "tickfont": {"size": 10}}
        notes.append({"xref": "paper", "yref": "paper", "x": 0, "y": top, "xanchor": "left", "yanchor": "bottom",
                      "showarrow": False, "text": name, "font": {"size": 11, "color": "#333"}})
        if name in tel["series"]:
            ser = tel["series"][name]
            traces.append({"type": "scatter", "mode": "lines+markers", "name": name, "x": ser["x"], "y": ser["y"],
                           "yaxis": ax, "marker": {"size": 3}, "line": {"width": 1}})
    if tel["alerts"]:
        traces.append({"type": "scatter", "mode": "markers", "name": "agent alerts", "yaxis": "y",
                       "x": [a["t"] for a in tel["alerts"]],
                       "y": [min(tel["series"][names[0]]["y"], default=0) if tel["series"] else 0] * len(tel["alerts"]),
                       "text": [f"{a['node']}: {a['kind']} {a['msg']}"[:200] for a in tel["alerts"]],
                       "marker": {"symbol": "diamond", "size": 10, "color": "#d62728"},
                       "hovertemplate": "%{text}<extra></extra>"})
    shapes = [{"type": "rect", "xref": "x", "yref": "paper", "x0": a, "x1": b, "y0": 0, "y1": 1,
               "fillcolor": "#d62728", "opacity": 0.05, "line": {"width": 0}} for a, b in tel["windows"]]
    for inc in d.acc.incidents:
        x = inc.onset_t - d.acc.t0
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x, "y0": 0, "y1": 1,
                       "line": {"color": "#d62728", "dash": "dash", "width": 1}})
    return ({"data": traces, "layout": _layout("Node telemetry around incidents (agent samples)",
                                                height=100 + inner, shapes=shapes, annotations=notes,
                                                showlegend=False, margin={"l": 70, "r": 20, "t": 40, "b": 55},
                                                **layout_axes, xaxis={**_X, "anchor": "y" if n == 1 else f"y{n}"})}, tel)


def figures(d: RunData) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """All figures by element id (absent when there is nothing to plot), and telemetry info."""
    figs: dict[str, dict[str, Any]] = {"fig-timeline": _timeline(d), "fig-badput": _badput(d)}
    loss = _loss(d)
    if loss:
        figs["fig-loss"] = loss
    box, series = _step_time(d)
    if box:
        figs["fig-steptime"] = box
        figs["fig-steptime-series"] = series  # type: ignore[assignment]
    tel_fig, tel = _telemetry(d)
    if tel_fig:
        figs["fig-telemetry"] = tel_fig
    return figs, tel
