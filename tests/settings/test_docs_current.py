"""docs/settings.md lists every setting and variable (regenerate: python -m titan.settings.docs)."""

from __future__ import annotations

from pathlib import Path

from titan.settings.docs import render

DOC = Path(__file__).resolve().parents[2] / "docs" / "settings.md"


def test_settings_doc_is_current():
    assert DOC.read_text() == render(), "docs/settings.md is stale: run `python -m titan.settings.docs`"
