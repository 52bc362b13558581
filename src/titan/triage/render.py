"""Human and report renderings of a verdict (the CLI owns the terminal; this only builds text)."""

from __future__ import annotations

from typing import Any

from titan.events import utc_iso
from titan.mdtext import md_cell, md_code, md_text
from titan.triage.model import Verdict

__all__ = ["markdown_section", "culprit_text"]


def culprit_text(c: dict[str, Any]) -> str:
    parts = [f"rank {c['rank']}" if c.get("rank") is not None else "",
             f"node {c['node']}" if c.get("node") else "", f"GPU {c['gpu']}" if c.get("gpu") else ""]
    return ", ".join(p for p in parts if p) or "not localised"


def markdown_section(v: Verdict) -> str:
    """The ``## Triage`` section of a run report (Markdown)."""
    lines = ["## Triage", ""]
    if v.outcome == "succeeded":
        lines += [f"Run succeeded: {md_text(v.reason)}.", ""]
        if v.incidents:
            lines += ["| # | kind | step | class | action | culprit | cost (s) | RTO (s) | steps lost |",
                      "|---|---|---|---|---|---|---|---|---|"]
            for r in v.incidents:
                lines.append(f"| {r['index']} | {md_cell(r['kind'])} | {r['step']} | {md_cell(r['class'] or '')} | "
                             f"{md_cell(r['action'] or '')} | "
                             f"{md_cell(culprit_text(r['culprit']))} | {r['cost_s']:.1f} | {r['rto_s'] or 0:.1f} | "
                             f"{r['rpo_steps']} |")
            lines.append("")
    elif not v.diagnosed:
        lines += [f"No diagnosis: {md_text(v.reason)}.", ""]
        for c in v.candidates:
            lines.append(f"- nearest candidate: {md_code(c['rule'])} ({md_text(c['class'] or c['role'])}) at "
                         f"{md_code(str(c['file']) + ':' + str(c['line']))}")
        if v.candidates:
            lines.append("")
    else:
        lines += [f"- **class**: {md_code(v.cls)}  **action**: {md_code(v.action)}  **scope**: {md_text(v.scope)}  "
                  f"**confidence**: {v.confidence:.2f}",
                  f"- **culprit**: {md_text(culprit_text(v.culprit))}", f"- **why**: {md_text(v.reason)}"]
        if v.first_anomaly:
            f = v.first_anomaly
            when = utc_iso(f.t) if f.t is not None else "untimed"
            lines.append(f"- **first anomaly**: {md_code(f'{f.file}:{f.line}')} ({when}): {md_code(f.text[:200])}")
        if v.steps:
            lines += ["", "Reasoning:", ""] + [f"{i}. {md_text(st)}" for i, st in enumerate(v.steps, start=1)]
        lines += ["", "| time (UTC) | where | rank | rule | line |", "|---|---|---|---|---|"]
        for e in v.evidence:
            t = utc_iso(e.t)[11:23] if e.t is not None else ""
            lines.append(f"| {t} | {md_cell(f'{e.file}:{e.line}')} | {'' if e.rank is None else e.rank} | "
                         f"{md_cell(e.rule)} | {md_code(e.text[:120], in_table=True)} |")
        lines.append("")
    for p in v.problems[:10]:
        lines.append(f"- note: {md_text(p)}")
    return "\n".join(lines) + "\n"
