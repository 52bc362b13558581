"""Foreign text (log lines, event fields, paths) placed into Markdown without changing its meaning.

A log line may hold ``|`` (which would split a table cell), backticks (which would end an inline
code span early), newlines (which would end a table row) or ``*``/``_``/``[`` (which would start
emphasis or a link). Every Markdown file Titan writes passes such text through one of these.
"""

from __future__ import annotations

import re

__all__ = ["md_cell", "md_code", "md_text"]

# ``_`` between two word characters is not emphasis (GFM), so ``user_code`` stays readable.
_SPECIAL = re.compile(r"([\\`*\[\]<>|]|(?<!\w)_|_(?!\w))")
_TICKS = re.compile(r"`+")


def _one_line(s: object) -> str:
    return " ".join(str(s).splitlines())


def md_text(s: object) -> str:
    """``s`` as literal Markdown text on one line: every character that Markdown would read as
    markup is backslash-escaped (CommonMark allows that for any ASCII punctuation)."""
    return _SPECIAL.sub(r"\\\1", _one_line(s))


def md_cell(s: object) -> str:
    """``s`` as the literal content of a table cell (one line, markup and ``|`` escaped)."""
    return md_text(s)


def md_code(s: object, *, in_table: bool = False) -> str:
    """``s`` as an inline code span: the fence is one backtick longer than the longest run of
    backticks inside, padded with spaces where ``s`` starts or ends with a backtick (CommonMark
    6.1). ``in_table``: ``|`` is escaped too, since GFM splits cells before it parses code spans
    (and renders ``\\|`` there as ``|``); outside a table that would show the backslash."""
    t = _one_line(s)
    if in_table:
        t = t.replace("|", "\\|")
    longest = max((len(m.group(0)) for m in _TICKS.finditer(t)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if t.startswith("`") or t.endswith("`") or (t.startswith(" ") and t.endswith(" ") and t.strip()) else ""
    return f"{fence}{pad}{t}{pad}{fence}"
