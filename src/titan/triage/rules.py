"""Rules as data: ``rules.toml`` (built in) plus users' files, compiled for fast scanning.

A rule maps a pattern to a meaning (class, role, priority, action, scope). Scanning first
looks for any rule keyword in a whole chunk of bytes with one compiled alternation, and only
runs the rules' regexes on the few lines that contain a keyword; this is what keeps a 1 GB
job's logs within the benchmark budget.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Sequence

from titan.errors import UserError
from titan.triage.model import ACTIONS, CLASSES, ROLES, SCOPES

__all__ = ["Rule", "RuleSet", "load_rules"]

_GROUPS = ("rank", "gpu", "pci", "host", "pid", "pid2", "seq", "op", "timeout_ms", "xid", "exitcode", "signame",
           "signame2", "local_rank", "exc", "what", "why", "peer", "status")
#: what a rule may say about the lines around the one it matched (see ``Rule``)
_CONTEXT_MAX = 64


@dataclasses.dataclass(frozen=True)
class Rule:
    id: str
    role: str
    cls: str | None
    priority: int
    keywords: tuple[str, ...]
    pattern: re.Pattern[str]
    action: str | None = None
    scope: str | None = None
    fields: tuple[tuple[str, re.Pattern[str]], ...] = ()
    ref: str = ""
    locates: bool = True  # false: the line's rank reports the fault but is not where it is
    mechanism: str = ""  # the failure mechanism the rule encodes (one sentence)
    wrap: bool = False  # the message is often wrapped over 2-3 physical lines: try joining them
    context_before: int = 0  # lines before the match the rule reads (a traceback's frames)
    context_after: int = 0  # lines after it (a kernel call trace)
    context_requires: re.Pattern[str] | None = None  # the finding stands only if the context matches
    context_class: tuple[tuple[str, re.Pattern[str]], ...] = ()  # class -> context pattern (first match wins)
    phase: str | None = None  # lifecycle: "init" (the job started), "rdzv" (waiting to meet), "end" (finished)
    names_rank: bool = False  # the rank in the message is the culprit, not the writer (a launcher prefix)
    superseded_by_life: bool = False  # a warning that is no cause when the same file shows the job running after it
    peer_failure_prone: bool = False  # what peers of a dying rank also report: loses to a program/device cause elsewhere
    single_witness: str = ""  # why a rule with one corpus witness is a documented message, not a memorised case
    pick: str | None = None  # the finding is a line picked from the context ("traceback_exception")

    def match(self, text: str) -> dict[str, Any] | None:
        """Facts from ``text`` if the rule matches it, else None."""
        m = self.pattern.search(text)
        if not m:
            return None
        facts = {k: v for k, v in m.groupdict().items() if v is not None}
        for name, rx in self.fields:
            fm = rx.search(text)
            if fm and name not in facts:
                facts[name] = fm.group(1)
        return facts


def _rule(obj: dict[str, Any], origin: str) -> Rule:
    def bad(msg: str) -> UserError:
        return UserError(f"rule {obj.get('id', '?')!r} in {origin}: {msg}",
                         "see the header of titan/triage/rules.toml for the rule format")

    for key in ("id", "role", "pattern", "keywords"):
        if key not in obj:
            raise bad(f"missing field {key!r}")
    role, cls = obj["role"], obj.get("class")
    if role not in ROLES:
        raise bad(f"role must be one of {', '.join(ROLES)}")
    if cls is not None and cls not in CLASSES:
        raise bad(f"class must be one of {', '.join(CLASSES)}")
    if role == "cause" and cls is None:
        raise bad("a cause needs a class")
    if obj.get("phase") not in (None, "init", "end", "rdzv"):
        raise bad("phase must be init, rdzv or end")
    if obj.get("pick") not in (None, "traceback_exception"):
        raise bad("pick must be traceback_exception")
    for key in ("context_before", "context_after"):
        if not isinstance(obj.get(key, 0), int) or not 0 <= obj.get(key, 0) <= _CONTEXT_MAX:
            raise bad(f"{key} must be an integer 0..{_CONTEXT_MAX}")
    ctx_cls = obj.get("context_class") or {}
    if not isinstance(ctx_cls, dict) or any(k not in CLASSES for k in ctx_cls):
        raise bad(f"context_class must map classes ({', '.join(CLASSES)}) to patterns")
    if obj.get("action") is not None and obj["action"] not in ACTIONS:
        raise bad(f"action must be one of {', '.join(ACTIONS)}")
    if obj.get("scope") is not None and obj["scope"] not in SCOPES:
        raise bad(f"scope must be one of {', '.join(SCOPES)}")
    kws = obj["keywords"]
    if not isinstance(kws, list) or not kws or not all(isinstance(k, str) and k for k in kws):
        raise bad("keywords must be a non-empty list of non-empty strings")
    try:
        pattern = re.compile(obj["pattern"])
        fields = tuple((k, re.compile(v)) for k, v in (obj.get("fields") or {}).items())
        requires = re.compile(obj["context_requires"]) if obj.get("context_requires") else None
        by_ctx = tuple((k, re.compile(v)) for k, v in ctx_cls.items())
    except re.error as e:
        raise bad(f"bad regular expression: {e}") from None
    return Rule(id=str(obj["id"]), role=role, cls=cls, priority=int(obj.get("priority", 50)), keywords=tuple(kws),
                pattern=pattern, action=obj.get("action"), scope=obj.get("scope"), fields=fields,
                ref=str(obj.get("ref", "")), locates=bool(obj.get("locates", True)),
                mechanism=str(obj.get("mechanism", "")), wrap=bool(obj.get("wrap", False)),
                context_before=int(obj.get("context_before", 0)), context_after=int(obj.get("context_after", 0)),
                context_requires=requires, context_class=by_ctx, phase=obj.get("phase"),
                names_rank=bool(obj.get("names_rank", False)),
                superseded_by_life=bool(obj.get("superseded_by_life", False)),
                peer_failure_prone=bool(obj.get("peer_failure_prone", False)),
                single_witness=str(obj.get("single_witness", "")), pick=obj.get("pick"))


#: Lines the scanner reads for facts, not verdicts (NCCL init: pid/host -> rank; NCCL's bootstrap
#: address: IP -> host; torchrun summaries; `tail`'s "==> file <==" section headers; a pasted shell prompt
#: "user@host:~$ cmd", whose host the command's output is — identity.PROMPT_KEYWORDS).
FACT_KEYWORDS: tuple[str, ...] = ("Init COMPLETE", "Init START", "local_rank:", "Bootstrap : Using", "NET/Socket : Using",
                                   "==> ", "$ ", "root@")


class RuleSet:
    """An ordered set of rules with the keyword prefilter compiled."""

    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = list(rules)
        kws = sorted({k for r in self.rules for k in r.keywords} | set(FACT_KEYWORDS), key=len, reverse=True)
        self.keywords = kws
        self._kw_file: str | None = None
        self.trigger = re.compile(b"|".join(re.escape(k.encode()) for k in kws)) if kws else re.compile(b"(?!)")
        self._by_kw: dict[str, list[Rule]] = {}
        for r in self.rules:
            for k in r.keywords:
                self._by_kw.setdefault(k, []).append(r)
        self._wrap_kw: dict[str, list[Rule]] = {}
        for r in self.rules:
            if r.wrap:
                for k in r.keywords:
                    self._wrap_kw.setdefault(k, []).append(r)

    def keywords_file(self) -> str:
        """A temporary file with one keyword per line (for ``grep -F -f``); removed at exit."""
        if self._kw_file is None or not Path(self._kw_file).exists():
            import atexit
            import os
            import tempfile

            fd, name = tempfile.mkstemp(prefix="titan-triage-kw-", suffix=".txt")
            with os.fdopen(fd, "wb") as f:
                f.write(b"\n".join(k.encode() for k in self.keywords) + b"\n")
            atexit.register(lambda: os.path.exists(name) and os.unlink(name))
            self._kw_file = name
        return self._kw_file

    def __getstate__(self) -> dict[str, Any]:
        return {"rules": self.rules}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["rules"])  # type: ignore[misc]

    def wraps(self, text: str) -> bool:
        """Whether ``text`` holds a keyword of a rule whose message is often wrapped over lines."""
        return any(kw in text for kw in self._wrap_kw)

    def classify(self, text: str, *, wrapped_only: bool = False,
                 exclude: frozenset[str] = frozenset()) -> tuple[Rule, dict[str, Any]] | None:
        """The highest-priority rule matching ``text`` (None if none does).

        ``wrapped_only``: try only the rules marked ``wrap`` (for a line joined with the next ones);
        ``exclude``: rule ids not to try (a rule whose context requirement failed).
        """
        best: tuple[Rule, dict[str, Any]] | None = None
        seen: set[str] = set()
        for kw, rules in (self._wrap_kw if wrapped_only else self._by_kw).items():
            if kw not in text:
                continue
            for r in rules:
                if r.id in seen or r.id in exclude:
                    continue
                seen.add(r.id)
                if best is not None and r.priority <= best[0].priority:
                    continue
                facts = r.match(text)
                if facts is not None:
                    best = (r, facts)
        return best


def _read_toml(data: str, origin: str) -> list[Rule]:
    try:
        obj = tomllib.loads(data)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"cannot parse rules file {origin}: {e}", "fix the TOML syntax") from None
    items = obj.get("rule", [])
    if not isinstance(items, list):
        raise UserError(f"{origin}: [[rule]] tables expected", "see titan/triage/rules.toml")
    return [_rule(x, origin) for x in items]


@functools.lru_cache(maxsize=1)
def builtin_rules() -> tuple[Rule, ...]:
    """The built-in rules, parsed and compiled once per process (rules are immutable)."""
    return tuple(_read_toml(resources.files("titan.triage").joinpath("rules.toml").read_text("utf-8"), "rules.toml"))


def load_rules(extra: Iterable[str | Path] = ()) -> RuleSet:
    """Built-in rules plus the users' rule files (a rule with an existing id replaces it).

    Raises ``UserError`` for a missing or malformed file.
    """
    rules = list(builtin_rules())
    by_id = {r.id: r for r in rules}
    for path in extra:
        from titan.inputs import read_text_file

        p = Path(path)
        text = read_text_file(p, "rules file", "pass a TOML file of [[rule]] tables")
        for r in _read_toml(text, str(p)):
            by_id[r.id] = r
    return RuleSet(list(by_id.values()))
