"""``titan report``: one self-contained HTML page per run, plus Markdown and JSON summaries.

``write_report(run_dir)`` writes ``RUN_DIR/report/index.html`` (Plotly.js inlined, so
the page needs no network), ``summary.md`` and ``summary.json``. Data comes from the
event spine and ``titan.sla``; the triage verdict from ``titan.triage`` when present.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from titan.events import RunDir, atomic_write_json, atomic_write_text
from titan.report.data import RunData, collect, triage_verdict
from titan.report.figures import figures
from titan.report.page import SECTIONS, plotly_js, render_page
from titan.report.summary import summary_dict, summary_markdown

__all__ = ["ReportPaths", "RunData", "SECTIONS", "collect", "plotly_js", "render_page", "summary_dict",
           "summary_markdown", "triage_verdict", "write_report"]


@dataclasses.dataclass(frozen=True)
class ReportPaths:
    """Where one run's report went, and its data."""

    html: Path
    markdown: Path
    json: Path
    data: RunData


def write_report(path: str | RunDir, *, run_triage: bool = True,
                 overhead: dict[str, Any] | None = None, out_dir: Path | None = None) -> ReportPaths:
    """Build and write the report of one run. Cost: reads every event file once; the page
    is ~5 MB (the Plotly.js bundle). Raises ``UserError`` for a non-run directory or a
    missing Plotly bundle. ``overhead`` replaces ``run.json['overhead']`` (A/B figures).
    ``out_dir`` (default ``<run>/report``): where the files go; nothing else is written."""
    d = collect(path, run_triage=run_triage)
    if overhead:  # an A/B measurement given on the command line wins over run.json's
        d.acc.overhead = dict(overhead)
    figs, tel = figures(d)
    summary = summary_dict(d)
    out = Path(out_dir) if out_dir is not None else d.rd.report
    out.mkdir(parents=True, exist_ok=True)
    page = render_page(d, figs, tel, summary)
    paths = ReportPaths(html=out / "index.html", markdown=out / "summary.md", json=out / "summary.json", data=d)
    atomic_write_text(paths.html, page)
    atomic_write_text(paths.markdown, summary_markdown(d))
    atomic_write_json(paths.json, summary)
    return paths
