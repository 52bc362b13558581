"""The ``grep -F`` prefilter: one C pass over big files for the rules' keywords.

``grep -n -b`` prints each hit's line number and byte offset, so the scan reads only the lines
around a hit. ``grep_many`` runs one grep for a batch of files (``-H -Z`` names each hit's file)
and yields every file's hits in the order asked. Cost: one process per ``GREP_BATCH`` files.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator, Sequence

from titan.triage.rules import RuleSet

__all__ = ["GREP", "GREP_ENV", "GREP_BATCH", "GrepFailed", "grep_hit", "grep_many"]

#: the grep binary; ``None`` where there is none (the scan then reads every file in Python)
GREP = shutil.which("grep")
GREP_ENV = {"LC_ALL": "C", "PATH": os.environ.get("PATH", "")}
#: files per ``grep_many`` process (argv stays far below the kernel's limit)
GREP_BATCH = 128


def grep_hit(raw: bytes) -> tuple[int, int, bytes] | None:
    """``line:offset:text`` of ``grep -n -b`` → (line, offset, text without the newline)."""
    ln_s, _, rest = raw.partition(b":")
    off_s, _, body = rest.partition(b":")
    try:
        return int(ln_s), int(off_s), body.rstrip(b"\n")
    except ValueError:
        return None


def grep_many(paths: Sequence[Path], rules: RuleSet) -> Iterator[tuple[int, Iterator[tuple[int, int, bytes]]]]:
    """One ``grep -F`` process for many files: ``(index, that file's hits)`` in the order of ``paths``.

    Every index is yielded, a file without hits with an empty iterator; each file's hits must be
    consumed (or dropped) before the next is asked for — the output streams, memory stays bounded.
    Cost: one process per ``GREP_BATCH`` files instead of one per file (a fork of this process and
    its wake-ups per file cost more than grep's own reading on a loaded machine). Raises
    ``GrepFailed`` at the end of a batch where grep reported an error (the caller rescans it).
    """
    for b0 in range(0, len(paths), GREP_BATCH):
        batch = [str(p) for p in paths[b0:b0 + GREP_BATCH]]
        index = {name.encode("utf-8", "surrogateescape"): b0 + i for i, name in enumerate(batch)}
        cmd = [GREP, "-F", "-n", "-b", "-a", "-H", "-Z", "-f", rules.keywords_file(), "--", *batch]
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=GREP_ENV) as proc:
            assert proc.stdout is not None
            nxt = b0

            def flush(upto: int) -> Iterator[tuple[int, Iterator[tuple[int, int, bytes]]]]:
                nonlocal nxt
                while nxt < upto:
                    yield nxt, iter(())
                    nxt += 1

            stream = (_named_hit(raw, index) for raw in proc.stdout)
            for i, group in itertools.groupby(stream, key=lambda x: x[0]):
                if i < nxt:  # a name grep printed otherwise, or out of order: never expected
                    continue
                yield from flush(i)
                yield i, (h for h in (grep_hit(raw) for _, raw in group) if h is not None)
                nxt = i + 1
            yield from flush(b0 + len(batch))
            proc.wait()
            if proc.returncode not in (0, 1):
                raise GrepFailed(b0, b0 + len(batch))


def _named_hit(raw: bytes, index: dict[bytes, int]) -> tuple[int, bytes]:
    """``name\\0line:offset:text`` of ``grep -H -Z`` → (the name's index, ``line:offset:text``); -1 if unknown."""
    name, _, rest = raw.partition(b"\0")
    return index.get(name, -1), rest


class GrepFailed(Exception):
    """grep reported an error for the files ``start`` … ``end - 1`` of a ``grep_many`` call."""

    def __init__(self, start: int, end: int) -> None:
        super().__init__(f"grep failed for files {start}..{end - 1}")
        self.start, self.end = start, end
