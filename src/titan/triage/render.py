"""Human and report renderings of a verdict (the CLI owns the terminal; this only builds text)."""

from __future__ import annotations

from typing import Any

from titan.events import utc_iso
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
        lines += [f"Run succeeded: {v.reason}.", ""]
        if v.incidents:
            lines += ["| # | kind | step | class | action | culprit | cost (s) | RTO (s) | steps lost |",
                      "|---|---|---|---|---|---|---|---|---|"]
            for r in v.incidents:
                lines.append(f"| {r['index']} | {r['kind']} | {r['step']} | {r['class'] or ''} | {r['action'] or ''} | "
                             f"{culprit_text(r['culprit'])} | {r['cost_s']:.1f} | {r['rto_s'] or 0:.1f} | "
                             f"{r['rpo_steps']} |")
            lines.append("")
    elif not v.diagnosed:
        lines += [f"No diagnosis: {v.reason}.", ""]
        for c in v.candidates:
            lines.append(f"- nearest candidate: `{c['rule']}` ({c['class'] or c['role']}) at `{c['file']}:{c['line']}`")
        if v.candidates:
            lines.append("")
    else:
        lines += [f"- **class**: `{v.cls}`  **action**: `{v.action}`  **scope**: {v.scope}  "
                  f"**confidence**: {v.confidence:.2f}",
                  f"- **culprit**: {culprit_text(v.culprit)}", f"- **why**: {v.reason}"]
        if v.first_anomaly:
            f = v.first_anomaly
            when = utc_iso(f.t) if f.t is not None else "untimed"
            lines.append(f"- **first anomaly**: `{f.file}:{f.line}` ({when}): `{f.text[:200]}`")
        if v.steps:
            lines += ["", "Reasoning:", ""] + [f"{i}. {st}" for i, st in enumerate(v.steps, start=1)]
        lines += ["", "| time (UTC) | where | rank | rule | line |", "|---|---|---|---|---|"]
        for e in v.evidence:
            t = utc_iso(e.t)[11:23] if e.t is not None else ""
            text = e.text[:120].replace("|", "\\|")
            lines.append(f"| {t} | {e.file}:{e.line} | {'' if e.rank is None else e.rank} | {e.rule} | {text} |")
        lines.append("")
    for p in v.problems[:10]:
        lines.append(f"- note: {p}")
    return "\n".join(lines) + "\n"
