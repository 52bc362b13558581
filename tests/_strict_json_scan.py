"""Find lines Titan wrote that a strict JSON parser rejects (``NaN``, ``Infinity``).

Used by ``tests/conftest.py`` after every test (its ``tmp_path``) and at the end of the
session (every fixture directory): every ``*.jsonl`` line and every ``*.json`` file inside
a run directory must parse with ``json.loads(..., parse_constant=raise)``. Lines that are
not JSON at all are left alone: tests write garbage and torn lines on purpose (the reader
skips and reports those); what is flagged is JSON that only a lenient parser accepts.
"""

from __future__ import annotations

from pathlib import Path

from titan.events import StrictJSONError, loads_strict

_MAX_BYTES = 64 << 20


def _run_dirs(root: Path) -> list[Path]:
    found = {p.parent for p in root.rglob("run.json")} | {p.parent for p in root.rglob("launcher.*.jsonl")}
    return sorted(found)


def _lenient_only(text: str) -> str | None:
    """The non-finite token when ``text`` is JSON only to a lenient parser, else None."""
    try:
        loads_strict(text)
        return None
    except StrictJSONError as e:
        return str(e)
    except ValueError:
        return None  # not JSON at all (deliberate garbage, a torn line)


def violations(root: Path, *, limit: int = 20) -> list[str]:
    """``file:line: reason`` for each non-strict line under run directories in ``root``."""
    out: list[str] = []
    if not root.is_dir():
        return out
    for rd in _run_dirs(root):
        for f in sorted(rd.rglob("*.json*")):
            if f.suffix not in (".json", ".jsonl") or not f.is_file() or f.stat().st_size > _MAX_BYTES:
                continue
            try:
                data = f.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            chunks = data.split("\n") if f.suffix == ".jsonl" else [data]
            for i, chunk in enumerate(chunks, start=1):
                if not chunk.strip():
                    continue
                why = _lenient_only(chunk)
                if why is not None:
                    out.append(f"{f}:{i}: {why}: {chunk[:160]}")
                    if len(out) >= limit:
                        return out
    return out


__all__ = ["violations"]
