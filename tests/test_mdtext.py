"""Foreign text in Titan's Markdown keeps its meaning: a parser reads back exactly the text."""

from __future__ import annotations

from markdown_it import MarkdownIt

from titan.mdtext import md_cell, md_code, md_text
from titan.triage.model import Finding, Verdict
from titan.triage.render import markdown_section

NASTY = "[/__w/pytorch/pair.cc:537] a | b `c` ``d`` *e* _f_ <g> \\h [i](j)"


def _inline_text(md: str) -> list[str]:
    """The text of every inline node the parser produced (code spans and plain text)."""
    out: list[str] = []
    for tok in MarkdownIt("commonmark").enable("table").parse(md):
        for ch in tok.children or []:
            if ch.type in ("text", "code_inline"):
                out.append(ch.content)
    return out


def test_code_span_round_trips_backticks_and_markup():
    for s in (NASTY, "`lead", "trail`", "plain"):
        (tok,) = [t for t in MarkdownIt("commonmark").parseInline(md_code(s))[0].children if t.type == "code_inline"]
        assert tok.content == s, (s, md_code(s), tok.content)


def test_text_round_trips_without_emphasis_or_links():
    toks = MarkdownIt("commonmark").parseInline(md_text(NASTY))[0].children
    assert [t.type for t in toks] == ["text"], [t.type for t in toks]
    assert toks[0].content == NASTY


def test_table_cells_hold_pipes_and_backticks():
    md = "| a | b |\n|---|---|\n" + f"| {md_cell(NASTY)} | {md_code(NASTY, in_table=True)} |\n"
    toks = MarkdownIt("commonmark").enable("table").parse(md)
    cells = [t for t in toks if t.type == "td_open"]
    assert len(cells) == 2, md
    assert _inline_text(md)[-2:] == [NASTY, NASTY], _inline_text(md)


def test_triage_section_keeps_a_gloo_line_in_one_cell():
    f = Finding(rule="r1", role="cause", cls="comm_error", file="logs/rank0.log", line=3, text=NASTY, rank=0)
    v = Verdict(cls="comm_error", culprit={"rank": 1}, scope="rank", action="restart_from_checkpoint",
                first_anomaly=f, evidence=[f], confidence=0.9, reason="peer | closed *early*")
    md = markdown_section(v)
    rows = [t for t in MarkdownIt("commonmark").enable("table").parse(md) if t.type == "tr_open"]
    assert len(rows) == 2, md  # header + one evidence row, not split by the line's `|`
    texts = _inline_text(md)
    assert NASTY in texts and "peer | closed *early*" in "".join(texts), texts
