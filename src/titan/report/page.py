"""The one self-contained HTML page: Plotly.js inlined, figures as JSON, no network at view time."""

from __future__ import annotations

import functools
import html
import json
import math
from importlib import resources
from typing import Any

from titan.errors import UserError
from titan.events import utc_iso
from titan.report.data import RunData
from titan.report.summary import fmt_s
from titan.sla.accounting import BUCKET_DOC, BUCKETS

__all__ = ["plotly_js", "render_page", "SECTIONS"]

#: Section ids the page always has (tests and users can rely on them).
SECTIONS = ("summary", "timeline", "loss", "steptime", "badput", "incidents", "triage", "telemetry", "overhead")


@functools.lru_cache(maxsize=1)
def plotly_js() -> str:
    """The minified Plotly.js bundle shipped inside the ``plotly`` wheel (~4.8 MB).

    Raises ``UserError`` when the ``plotly`` package (extra ``titan-resilience[report]``) is missing.
    """
    try:
        return resources.files("plotly").joinpath("package_data", "plotly.min.js").read_text(encoding="utf-8")
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise UserError(f"the Plotly.js bundle is not installed ({e})",
                        "pip install 'titan-resilience[report]' (the plotly package ships plotly.min.js)") from None


def _clean(o: Any) -> Any:
    # JSON has no NaN/Infinity; the page shows non-finite values through dedicated traces.
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o


def _json_for_script(obj: Any) -> str:
    # "</" cannot appear inside a <script> element; "<\/" is the same string in JS.
    return json.dumps(_clean(obj), separators=(",", ":"), allow_nan=False).replace("</", "<\\/")


_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0;color:#222;background:#f4f5f7}
header{background:#1f2937;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
header .sub{opacity:.8;font-size:13px;margin-top:4px;overflow-wrap:anywhere}
header .cmd{font-size:12px;white-space:normal;overflow-wrap:anywhere;word-break:break-word}
main{padding:10px 24px 40px;max-width:1400px;margin:auto}
section{background:#fff;border-radius:8px;padding:12px 16px;margin:14px 0;box-shadow:0 1px 2px rgba(0,0,0,.08)}
h2{font-size:16px;margin:4px 0 10px}
.cards{display:flex;flex-wrap:wrap;gap:10px}.card{border:1px solid #e5e7eb;border-radius:6px;padding:8px 12px;min-width:130px}
.card .v{font-size:20px;font-weight:600}.card .k{font-size:12px;color:#666}
.ok{color:#15803d}.bad{color:#b91c1c}
table{border-collapse:collapse;font-size:13px;width:100%}th,td{border-bottom:1px solid #eee;padding:4px 8px;text-align:left}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}.note{color:#666;font-size:13px}
.sw{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:6px}
"""


def _cards(d: RunData, s: dict[str, Any]) -> str:
    from titan.sla.figures import run_figures

    a = d.acc
    f = run_figures(a)  # the same figures `titan drill` prints for this run
    ok = bool(a.outcome.get("succeeded"))
    items = [
        ("outcome", f"<span class='{'ok' if ok else 'bad'}'>{'succeeded' if ok else 'failed'}</span>"),
        ("wall time", fmt_s(f.wall_s)), ("goodput", f"{f.goodput_fraction:.1%}"),
        ("interruptions", str(f.interruptions)), ("incidents (all)", str(f.incidents)),
        ("worst RTO", fmt_s(f.worst_rto_s)),
        ("steps lost (RPO, total)", str(f.steps_lost)), ("steps skipped", str(f.steps_skipped)),
        ("ranks / attempts", f"{len(d.ranks)} / {len(s['attempts'])}"),
        ("last step", str(f.last_step)),
    ]
    for w in s.get("shrunk") or []:  # a node lost with no spare: the job went on smaller
        items.append(("continued at " + ("MIN" if w.get("at_min") else "fewer nodes"),
                      html.escape(f"{w.get('nodes')} of {w.get('max')} nodes")))
    return "<div class='cards'>" + "".join(
        f"<div class='card'><div class='v'>{v}</div><div class='k'>{html.escape(k)}</div></div>" for k, v in items) + "</div>"


def _bucket_table(d: RunData) -> str:
    from titan.report.figures import BUCKET_COLORS

    a = d.acc
    rows = "".join(
        f"<tr><td><span class='sw' style='background:{BUCKET_COLORS[k]}'></span>{k}</td>"
        f"<td class='n'>{a.buckets[k]:.3f}</td><td class='n'>{(a.buckets[k] / a.wall_s if a.wall_s else 0):.1%}</td>"
        f"<td>{html.escape(BUCKET_DOC[k])}</td></tr>" for k in BUCKETS)
    r = a.reconciliation
    ref = r.get("recorded_wall_s", r["wall_s"])
    return (f"<table><tr><th>cause</th><th class='n'>seconds</th><th class='n'>share</th><th>meaning</th></tr>{rows}"
            f"<tr><th>sum</th><th class='n'>{r['sum_s']:.3f}</th><th class='n'></th><th></th></tr></table>"
            f"<p class='note' id='reconciliation'>Reconciliation: the buckets add up to {r['sum_s']:.3f} s; "
            f"{html.escape(r['reference'])} gives {ref:.3f} s; error {r['error_fraction']:.3%} "
            f"({'within' if r['within_1pct'] else 'NOT within'} 1 %). There is no catch-all bucket.</p>")


def _incident_table(d: RunData) -> str:
    a = d.acc
    if not a.incidents:
        return "<p class='note'>No incidents: no fault, restart, skipped or replayed step.</p>"
    head = ("<tr><th>#</th><th>kind</th><th>onset</th><th>onset source</th><th>detected by</th><th>rank</th>"
            "<th>step</th><th class='n'>detection</th><th class='n'>RTO</th><th class='n'>RPO steps</th>"
            "<th class='n'>RPO time</th><th class='n'>skipped</th><th>resumed from</th></tr>")
    rows = "".join(
        f"<tr><td>{i.index}</td><td>{i.kind}</td><td>+{i.onset_t - a.t0:.2f} s ({utc_iso(i.onset_t)[11:23]})</td>"
        f"<td>{html.escape(i.onset_source)}</td><td>{html.escape(i.detect_kind)}</td>"
        f"<td>{_rank_text(i)}</td><td>{'' if i.step is None else i.step}</td>"
        f"<td class='n'>{fmt_s(i.detection_s)}</td><td class='n'>{fmt_s(i.rto_s)}</td><td class='n'>{i.rpo_steps}</td>"
        f"<td class='n'>{fmt_s(i.rpo_s)}</td><td class='n'>{i.skipped_steps}</td>"
        f"<td>{'' if i.resumed_from is None else i.resumed_from}</td></tr>"
        for i in a.incidents)
    return (f"<table id='incident-table'>{head}{rows}</table><p class='note'>Step: the step the fault struck. "
            "Rank: the culprit the evidence names. RTO: fault onset (injection, or the last progress beacon) to "
            "the first kept step after recovery. RPO: steps whose results were lost and recomputed; skipped: "
            "updates the guard dropped (not recomputed).</p>")


def _rank_text(i: Any) -> str:
    if i.rank is not None:
        return str(i.rank)
    return ", ".join(map(str, i.ranks))


def _triage(d: RunData) -> str:
    t = d.triage
    if t is None:
        return "<p class='note'>The run did not fail; no triage needed.</p>"
    if not t.get("entry_point"):
        return f"<p class='note'>Triage verdict not available: {html.escape(str(t.get('reason')))}</p>"
    keys = [k for k in ("diagnosed", "class", "culprit", "scope", "action", "confidence", "reason", "first_anomaly",
                        "failure_time") if k in t] or [k for k in t if k not in ("available", "entry_point")]
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(_plain(t[k]))}</td></tr>" for k in keys)
    ev = t.get("evidence") or []
    evid = "".join(f"<li>{html.escape(_plain(e))}</li>" for e in ev[:12])
    return (f"<table id='triage-verdict'>{rows}</table>" + (f"<p class='note'>Evidence:</p><ul>{evid}</ul>" if evid else "")
            + f"<p class='note'>From {html.escape(t['entry_point'])} (same as <code>titan triage RUN_DIR</code>).</p>")


def _command(c: Any) -> str:
    if isinstance(c, list):
        return " ".join(map(str, c))
    return str(c or "—")


#: Characters of the command the header shows; a longer one ends at a word boundary with
#: "…" and the whole command is in the tooltip.
_COMMAND_CHARS = 300


def _command_html(c: Any) -> str:
    """The run's command for the header: whole words only (never cut inside one, never
    inside an HTML entity), the full text as ``title``; long tokens wrap (CSS)."""
    full = _command(c)
    shown = full
    if len(full) > _COMMAND_CHARS:
        cut = full.rfind(" ", 0, _COMMAND_CHARS + 1)
        shown = (full[:cut] if cut > 0 else full[:_COMMAND_CHARS]) + " …"
    return f"<code class='cmd' title='{html.escape(full, quote=True)}'>{html.escape(shown)}</code>"


def _plain(v: Any) -> str:
    if isinstance(v, dict) and "text" in v and "file" in v:  # a triage finding reference
        tag = "/".join(str(v[k]) for k in ("rule", "class") if v.get(k))
        return f"{v['file']}:{v.get('line', '')} [{tag}] {str(v['text'])[:300]}"
    if isinstance(v, dict) and v and all(not isinstance(x, (dict, list)) for x in v.values()):
        return ", ".join(f"{k}={x}" for k, x in v.items() if x is not None) or "—"
    return v if isinstance(v, str) else json.dumps(v, default=str)[:600]


def _overhead(d: RunData) -> str:
    ov = d.acc.overhead
    if ov.get("measured") is False:
        return (f"<p class='note'>{html.escape(ov.get('note', ''))}. Guard and agent costs sit inside kept steps; "
                "they are reported from an A/B measurement (same workload with and without), never as a bucket.</p>")
    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(json.dumps(v, default=str))}</td></tr>"
                   for k, v in ov.items())
    return f"<table id='overhead-table'>{rows}</table>"


def render_page(d: RunData, figs: dict[str, dict[str, Any]], tel: dict[str, Any], summary: dict[str, Any]) -> str:
    """The whole page as one string (Plotly.js inline; ~5 MB)."""
    def fig(fid: str, missing: str) -> str:
        return f"<div id='{fid}' class='fig'></div>" if fid in figs else f"<p class='note'>{html.escape(missing)}</p>"

    a = d.acc
    tel_note = (f"{tel['n_samples']} agent samples ({tel['source']}); showing ±60 s around each interruption "
                "(the whole run when there was none), the 12 series that moved most."
                if tel["n_samples"] else "No node telemetry: no `titan agent` ran for this run (no agent.* events).")
    problems = ("".join(f"<li>{html.escape(p)}</li>" for p in d.problems[:100]) if d.problems else "")
    body = f"""
<header><h1>Titan run report — {html.escape(d.rd.run_id)}</h1>
<div class='sub'>{utc_iso(a.t0)} → {utc_iso(a.t1)} · {len(summary['attempts'])} attempt(s) · {len(d.events)} events ·
command: {_command_html(d.run_json.get('command'))}</div></header>
<main>
<section id='summary'><h2>Summary</h2>{_cards(d, summary)}</section>
<section id='timeline'><h2>Timeline of every rank</h2>{fig('fig-timeline', '')}
<p class='note'>Top row: every second of the run by cause. One row per rank: phases (bars) and steps (ticks), one colour
per attempt. Launcher row: (re)starts and failures. Dashed red: fault onset; orange: detection; green: recovered.</p></section>
<section id='loss'><h2>Loss</h2>{fig('fig-loss', 'No loss values in the step events.')}</section>
<section id='steptime'><h2>Step time per rank</h2>{fig('fig-steptime', 'No step_time_s in the step events.')}
{fig('fig-steptime-series', '')}</section>
<section id='badput'><h2>Goodput and badput</h2>{fig('fig-badput', '')}{_bucket_table(d)}</section>
<section id='incidents'><h2>Incidents: RTO and RPO</h2>{_incident_table(d)}</section>
<section id='triage'><h2>Triage verdict</h2>{_triage(d)}</section>
<section id='telemetry'><h2>Node telemetry around incidents</h2><p class='note'>{html.escape(tel_note)}</p>
{fig('fig-telemetry', '')}</section>
<section id='overhead'><h2>Overhead of monitoring and defences</h2>{_overhead(d)}</section>
{f"<section id='problems'><h2>Lines that could not be read</h2><ul>{problems}</ul></section>" if problems else ""}
</main>"""
    script = f"""
const FIGS = {_json_for_script(figs)};
const CONFIG = {{responsive: true, displaylogo: false}};
Promise.all(Object.entries(FIGS).map(([id, f]) => Plotly.newPlot(id, f.data, f.layout, CONFIG)))
  .then(() => {{ document.body.dataset.ready = "1"; }})
  .catch((e) => {{ document.body.dataset.ready = "error"; console.error("titan report: plot failed", e); }});
"""
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>Titan report {html.escape(d.rd.run_id)}</title><style>{_CSS}</style>"
            f"<script>{plotly_js()}</script></head><body>{body}<script>{script}</script></body></html>")
