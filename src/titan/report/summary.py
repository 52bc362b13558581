"""The report's JSON and Markdown summaries."""

from __future__ import annotations

from typing import Any

from titan.events import utc_iso
from titan.mdtext import md_cell, md_text
from titan.report.data import RunData
from titan.sla.accounting import BUCKET_DOC, BUCKETS

__all__ = ["summary_dict", "summary_markdown", "fmt_s"]


def fmt_s(x: float | None) -> str:
    """Seconds for people: '—' for None, then s / min / h."""
    if x is None:
        return "—"
    if abs(x) < 120:
        return f"{x:.2f} s"
    if abs(x) < 7200:
        return f"{x / 60:.1f} min"
    return f"{x / 3600:.2f} h"


def summary_dict(d: RunData) -> dict[str, Any]:
    """``summary.json``: the accounting plus run facts, triage and what could not be read."""
    from titan.sla.figures import run_figures

    out = d.acc.to_dict()
    out.update({
        "figures": run_figures(d.acc).to_dict(),
        "run_id": d.rd.run_id, "started": utc_iso(d.acc.t0), "ended": utc_iso(d.acc.t1), "ranks": d.ranks,
        "command": d.run_json.get("command"), "triage": d.triage, "read_problems": d.problems,
        "events": len(d.events),
        "restart_storms": [dict(e.data, t=e.t) for e in d.events if e.kind == "launcher.restart_storm"],
        # Rounds with fewer nodes than before (a node lost, no spare): the job went on smaller.
        "shrunk": [dict(e.data, t=e.t, node=e.node) for e in d.events if e.kind == "launcher.world"],
        "capabilities_off": sorted({k for e in d.events if e.kind == "launcher.capabilities"
                                    for k in e.data.get("off") or []}),
    })
    return out


def summary_markdown(d: RunData) -> str:
    """``summary.md``: the same figures as the page's head, for a terminal or a ticket."""
    a = d.acc
    s = summary_dict(d)
    out = [f"# Titan run report: {md_text(d.rd.run_id)}", "",
           f"- outcome: **{'succeeded' if a.outcome.get('succeeded') else 'failed'}** ({a.outcome.get('source')})",
           f"- wall time: {fmt_s(a.wall_s)} ({utc_iso(a.t0)} → {utc_iso(a.t1)}), ranks: {len(d.ranks)}, "
           f"attempts: {len(s['attempts'])}, last step: {s['steps']['last_step']}",
           f"- goodput: **{a.goodput_fraction:.1%}**; interruptions: {s['interruptions']}; worst RTO "
           f"{fmt_s(s['figures']['worst_rto_s'])}; steps lost {s['figures']['steps_lost']}, skipped "
           f"{s['figures']['steps_skipped']}",
           f"- reconciliation: buckets sum {a.reconciliation['sum_s']:.3f} s vs {a.reconciliation['reference']} "
           f"{a.reconciliation.get('recorded_wall_s', a.reconciliation['wall_s']):.3f} s "
           f"(error {a.reconciliation['error_fraction']:.3%})",
           *[f"- restart storm: {st.get('restarts')} restarts within {st.get('window_s')} s "
             f"({md_text('; '.join(st.get('causes') or []) or 'causes unknown')})" for st in s["restart_storms"]],
           *[f"- continued at {'MIN' if w.get('at_min') else 'a smaller size'}: {w.get('nodes')} of "
             f"{w.get('max')} nodes (was {w.get('previous')}) from +{w['t'] - a.t0:.0f} s"
             + (f"; lost: {md_text(', '.join(w.get('lost') or []))}" if w.get("lost") else "")
             + f" (seen by {md_text(w.get('node'))})" for w in s["shrunk"]],
           *([f"- capabilities off in this run: {', '.join(s['capabilities_off'])}"] if s["capabilities_off"] else []),
           "",
           "## Goodput and badput", "", "| cause | seconds | share | meaning |", "|---|---:|---:|---|"]
    for k in BUCKETS:
        v = a.buckets[k]
        out.append(f"| {k} | {v:.3f} | {v / a.wall_s if a.wall_s else 0:.1%} | {BUCKET_DOC[k]} |")
    out += ["", "## Incidents", ""]
    if a.incidents:
        out += ["| # | kind | onset (source) | detected by | rank | step | detection | RTO | RPO steps | RPO time | skipped |",
                "|---|---|---|---|---|---|---:|---:|---:|---:|---:|"]
        for i in a.incidents:
            rank = str(i.rank) if i.rank is not None else ", ".join(map(str, i.ranks))
            out.append(f"| {i.index} | {md_cell(i.kind)} | +{i.onset_t - a.t0:.2f} s ({md_cell(i.onset_source)}) | "
                       f"{md_cell(i.detect_kind)} | {md_cell(rank)} | {'' if i.step is None else i.step} | "
                       f"{fmt_s(i.detection_s)} | {fmt_s(i.rto_s)} | {i.rpo_steps} | {fmt_s(i.rpo_s)} | "
                       f"{i.skipped_steps} |")
    else:
        out.append("None.")
    if d.triage is not None:
        out += ["", "## Triage", ""]
        t = d.triage
        if not t.get("entry_point"):
            out.append(f"Not available: {md_text(t.get('reason'))}")
        else:
            for k in ("diagnosed", "class", "action", "scope", "culprit", "confidence", "reason", "first_anomaly"):
                if t.get(k) is not None:
                    out.append(f"- {k}: {md_text(t[k])}")
    out += ["", "## Overhead of monitoring and defences (A/B)", ""]
    ov = a.overhead
    if ov.get("measured") is False:
        out.append(md_text(ov.get("note", "not measured")))
    else:
        for k, v in ov.items():
            out.append(f"- {k}: {md_text(v)}")
    if d.problems:
        out += ["", "## Lines that could not be read", ""] + [f"- {md_text(p)}" for p in d.problems[:50]]
    return "\n".join(out) + "\n"
