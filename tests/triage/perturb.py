"""Meaning-preserving rewrites of a case's logs, for the invariance tests (tests/triage/test_invariance.py).

A triage that reads mechanisms gives the same verdict — or the verdict renamed the same way —
when a case's logs are rewritten in ways that change no fact about the failure:

- ``noise``: unrelated, untimed lines (model-loading chatter, warnings, W&B sync lines) added at
  the start and end of every file and before new records;
- ``hosts``: every hostname and IP address renamed consistently (contents, file and folder names);
- ``ranks``: ranks renumbered by reversal (r -> R-1-r) in the global-rank forms (``[rankN]:``,
  ``[Rank N]``, ``rankN`` in file names), on cases that print ranks in no other form;
- ``times``: ISO timestamps moved to another year and written with the other separator
  (``T``/space, ``,``/``.``);
- ``order``: the files renamed so that their order on disk reverses (same rank/host hints);
- ``colour``: the logs as a terminal or CI capture keeps them — each line's leading bracketed or
  parenthesised prefix (``[rank3]:``, ``(Worker pid=N, ip=A)``, a bracketed stamp) and the level
  words ``ERROR``/``WARNING``/``INFO`` wrapped in ANSI colour sequences (structured files untouched);
- ``collector``: every line of an ISO-stamped file behind a log collector's RFC 3339 stamp
  (``kubectl logs --timestamps``, ``docker logs -t``): the line's own instant, else the last one
  before it (files with zone offsets, untimed and structured files untouched);
- ``crlf``: every line ended by CR LF, as files saved or pasted on Windows are;
- ``grepped``: every line behind ``grep -H``'s ``NAME:`` prefix (a ``grep -r`` paste), NAME the file's own
  name (stack-dump and structured files untouched: their readers take whole blocks);
- ``merged``: every file in one, each behind the ``==> name <==`` header that ``tail -n +1 FILES``
  prints (how logs of several ranks are pasted into one issue), on cases whose every file carries
  timestamps (untimed files have no order across them; one merged file would give them one).

Each rewrite returns the new files and how the expected culprit maps, or None when it does not
apply to the case. Pure text functions; no triage import.
"""

from __future__ import annotations

import random
import re
from typing import Callable

Files = dict[str, str]

NOISE = (
    "Some weights of the model checkpoint were not used when initializing the model.",
    "You are using the default legacy behaviour of the tokenizer.",
    "wandb: Syncing run lively-sun-12",
    "wandb: ⭐️ View project at https://wandb.ai/some-team/some-project",
    "Using /root/.cache/torch_extensions/py310_cu121 as PyTorch extensions root...",
    "Loading extension module fused_adam...",
    "  warnings.warn(",
    "Setting ds_accelerator to cuda (auto detect)",
)
_RECORD = re.compile(r"^(?:\[|\d{4}-\d\d-\d\d|[A-Z]\d{4} |[A-Z][a-z]{2} +\d)")


def noise(files: Files, seed: int) -> Files:
    rng = random.Random(seed)
    out: Files = {}
    for rel, text in files.items():
        lines = text.split("\n")
        new: list[str] = [rng.choice(NOISE)]
        for i, ln in enumerate(lines):
            if i and _RECORD.match(ln) and rng.random() < 0.3:
                new.append(rng.choice(NOISE))
            new.append(ln)
        body = "\n".join(new)
        out[rel] = body.rstrip("\n") + "\n" + "\n".join(rng.choice(NOISE) for _ in range(3)) + "\n"
    return out


def _sub_tokens(text: str, mapping: dict[str, str]) -> str:
    if not mapping:
        return text
    rx = re.compile(r"(?<![\w.-])(" + "|".join(re.escape(k) for k in sorted(mapping, key=len, reverse=True))
                    + r")(?![\w-]|\.\w)")
    return rx.sub(lambda m: mapping[m.group(1)], text)


def hosts(files: Files, known: set[str]) -> tuple[Files, dict[str, str]] | None:
    """Rename the hosts/IPs in ``known`` (as the corpus test harvests them) to invented ones."""
    names = sorted(h for h in known if len(h) >= 4 and not h.isdigit()
                   and not re.fullmatch(r"(?i)(?:rank|r|attempt)[_-]?\d+", h))  # rank folders are not hosts
    if not names:
        return None
    mapping: dict[str, str] = {}
    for i, h in enumerate(names):
        mapping[h] = f"10.251.{i // 250}.{i % 250 + 1}" if re.fullmatch(r"(?:\d{1,3}\.){3}\d{1,3}", h) else f"zz{i}x{i + 7}"
    out = {_sub_name(rel, mapping): _sub_tokens(text, mapping) for rel, text in files.items()}
    return out, mapping


def _sub_name(rel: str, mapping: dict[str, str]) -> str:
    """A file path's tokens (split on / . _ -, as file-name hints are read) renamed."""
    parts = re.split(r"([/._])", rel)
    out = "".join(mapping.get(p, p) for p in parts)
    for k, v in mapping.items():  # a dotted or dashed host inside a name ("dmesg_jean-zay-iam06.txt")
        out = re.sub(r"(?<![A-Za-z0-9])" + re.escape(k) + r"(?![A-Za-z0-9])", v, out)
    return out


_OTHER_RANK_FORMS = re.compile(r"GLOBAL_RANK|MEMBER: |local_rank|nranks|\brank \d|rank=\d|\[default\d|Rank \d+ failed|"
                               r"missing ranks|\btask \d|^\d+: ", re.M)
_GLOBAL_FORMS = re.compile(r"\[rank(\d+)\]|\[Rank (\d+)\]|(?<![\w])Rank (\d+)\b")
_NAME_FORM = re.compile(r"(rank[_-]?)(\d+)(?=[._/-]|$)")


def ranks(files: Files) -> tuple[Files, Callable[[int | None], int | None]] | None:
    blob = "\n".join(files.values())
    if _OTHER_RANK_FORMS.search(blob):
        return None
    seen = {int(x) for m in _GLOBAL_FORMS.finditer(blob) for x in m.groups() if x is not None}
    seen |= {int(m.group(2)) for rel in files for m in _NAME_FORM.finditer(rel)}
    if len(seen) < 2 or 0 not in seen:  # the world's size is only known from 0 up to the highest rank seen
        return None
    top = max(seen) + 1

    def f(r: int | None) -> int | None:
        return None if r is None else top - 1 - r

    def text_sub(t: str) -> str:
        def g(m: re.Match[str]) -> str:
            s = m.group(0)
            return re.sub(r"\d+", lambda d: str(f(int(d.group(0)))), s)
        return _GLOBAL_FORMS.sub(g, t)

    out = {_NAME_FORM.sub(lambda m: m.group(1) + str(f(int(m.group(2)))), rel): text_sub(t) for rel, t in files.items()}
    return out, f


_ISO = re.compile(r"\b(20\d\d)-(\d\d)-(\d\d)([T _])(\d\d:\d\d:\d\d)([.,]\d+)?")
_CTIME = re.compile(r"(\b[A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d(?:\.\d+)? )(20\d\d)\b")


def times(files: Files) -> Files | None:
    blob = "\n".join(files.values())
    if not _ISO.search(blob):
        return None

    def g(m: re.Match[str]) -> str:
        y = int(m.group(1)) + 4  # a leap-year step: Feb 29 stays a date
        lead = m.string[:m.start()].rsplit("\n", 1)[-1]
        # the separator is the log formatter's choice only in a line's own stamp; inside a message
        # (Slurm's 'CANCELLED AT 2026-11-30T09:00:19') it is part of the tool's format
        sep = m.group(4) if len(lead) > 24 or m.group(4) == "_" else " " if m.group(4) == "T" else "T"
        frac = m.group(6) or ""
        frac = ("." + frac[1:]) if frac.startswith(",") else ("," + frac[1:]) if frac else ""
        return f"{y}-{m.group(2)}-{m.group(3)}{sep}{m.group(5)}{frac}"
    def epoch(m: re.Match[str]) -> str:  # torchrun error files stamp epoch seconds
        import datetime as dt
        d = dt.datetime.fromtimestamp(int(m.group(2)), tz=dt.timezone.utc)
        return m.group(1) + str(int(d.replace(year=d.year + 4).timestamp()))
    return {rel: _EPOCH.sub(epoch, _CTIME.sub(lambda m: m.group(1) + str(int(m.group(2)) + 4), _ISO.sub(g, t)))
            for rel, t in files.items()}


_EPOCH = re.compile(r'("timestamp": ")(1[5-9]\d{8})\b')


def order(files: Files) -> Files | None:
    if len(files) < 2:
        return None
    rels = sorted(files)
    out: Files = {}
    for i, rel in enumerate(rels):
        head, _, name = rel.rpartition("/")
        new = f"z{chr(ord('z') - i % 26)}{'a' * (i // 26)}_{name}"  # reversed sort order, no new rank/host hints
        out[(head + "/" if head else "") + new] = files[rel]
    return out


def merged(files: Files) -> Files | None:
    if len(files) < 2 or not all(_ISO.search(t) or _CTIME.search(t) for t in files.values()):
        return None
    if any(t.lstrip().startswith("{") or "NVSMI LOG" in t[:4096] for t in files.values()):
        return None  # structured files (JSON error files, flight-recorder dumps, nvidia-smi -q) are read as such
    return {"pasted.txt": "".join(f"==> {rel} <==\n{t.rstrip(chr(10))}\n\n" for rel, t in sorted(files.items()))}


_LEAD = re.compile(r"^(\[[^\]\n]{1,80}\]:?|\([^)\n]{1,80}\))")
_LEVEL = re.compile(r"\b(ERROR|WARNING|INFO)\b")


def colour(files: Files) -> Files | None:
    """ANSI colour around line prefixes and level words, as terminals and CI log viewers keep them."""
    out: Files = {}
    changed = False
    for rel, t in files.items():
        if t.lstrip().startswith(("{", "[{")) or "NVSMI LOG" in t[:4096] or rel.endswith(".json"):
            out[rel] = t
            continue
        lines = []
        for ln in t.split("\n"):
            new = _LEAD.sub(lambda m: f"\x1b[36m{m.group(1)}\x1b[0m", ln, count=1)
            new = _LEVEL.sub(lambda m: f"\x1b[1;31m{m.group(1)}\x1b[0m", new)
            changed |= new != ln
            lines.append(new)
        out[rel] = "\n".join(lines)
    return out if changed else None


_OFFSET = re.compile(r"\b20\d\d-\d\d-\d\d[T _]\d\d:\d\d:\d\d(?:[.,]\d+)?[+-]\d\d:?\d\d\b")


def _rfc3339(m: re.Match[str]) -> str:
    y, mo, d, _sep, hms, frac = m.groups()
    return f"{y}-{mo}-{d}T{hms}.{(frac or '.0')[1:]}Z"


def collector(files: Files) -> Files | None:
    """A collector's stamp in front of every line, carrying the line's own instant (or the last one before it)."""
    out: Files = {}
    changed = False
    for rel, t in files.items():
        first = _ISO.search(t)
        if first is None or _OFFSET.search(t) or t.lstrip().startswith(("{", "[{")) or "NVSMI LOG" in t[:4096] \
                or rel.endswith(".json"):
            out[rel] = t
            continue
        cur = _rfc3339(first)
        lines = []
        for ln in t.split("\n"):
            m = _ISO.search(ln[:160])
            if m:
                cur = _rfc3339(m)
            lines.append(f"{cur} {ln}" if ln.strip() else ln)
        out[rel] = "\n".join(lines)
        changed = True
    return out if changed else None


def crlf(files: Files) -> Files | None:
    """CR LF line ends throughout."""
    return {rel: t.replace("\r\n", "\n").replace("\n", "\r\n") for rel, t in files.items()}


_STACKS = re.compile(r"^(?:Thread \d+ \(|Thread 0x[0-9a-fA-F]+ \(|Current thread 0x|Process \d+: )", re.M)


def grepped(files: Files) -> Files | None:
    """Each line prefixed with its file's name and a colon, as ``grep -H`` prints a match."""
    out: Files = {}
    changed = False
    for rel, t in files.items():
        name = rel.rsplit("/", 1)[-1]
        if t.lstrip().startswith(("{", "[{")) or "NVSMI LOG" in t[:4096] or rel.endswith(".json") or _STACKS.search(t) \
                or not name.endswith((".log", ".txt", ".out", ".err")):
            out[rel] = t
            continue
        out[rel] = "\n".join(f"{name}:{ln}" if ln else ln for ln in t.split("\n"))
        changed = True
    return out if changed else None
