"""Rules as data: ``rules.toml`` (built in) plus users' files, compiled for fast scanning.

A rule maps a pattern to a meaning (class, role, priority, action, scope). Scanning first
looks for any rule keyword in a whole chunk of bytes with one compiled alternation, and only
runs the rules' regexes on the few lines that contain a keyword; this is what keeps a 1 GB
job's logs within the benchmark budget.
"""

from __future__ import annotations

import dataclasses
import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Sequence

from titan.errors import UserError
from titan.triage.model import ACTIONS, CLASSES, ROLES, SCOPES

__all__ = ["Rule", "RuleSet", "load_rules"]

_GROUPS = ("rank", "gpu", "pci", "host", "pid", "pid2", "seq", "op", "timeout_ms", "xid", "exitcode", "signame",
           "signame2", "local_rank", "exc", "what", "why", "peer")


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
    except re.error as e:
        raise bad(f"bad regular expression: {e}") from None
    return Rule(id=str(obj["id"]), role=role, cls=cls, priority=int(obj.get("priority", 50)), keywords=tuple(kws),
                pattern=pattern, action=obj.get("action"), scope=obj.get("scope"), fields=fields,
                ref=str(obj.get("ref", "")), locates=bool(obj.get("locates", True)))


#: Lines the scanner reads for facts, not verdicts (NCCL init: pid/host -> rank; torchrun summaries).
FACT_KEYWORDS: tuple[str, ...] = ("Init COMPLETE", "local_rank:")


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

    def classify(self, text: str) -> tuple[Rule, dict[str, Any]] | None:
        """The highest-priority rule matching ``text`` (None if none does)."""
        best: tuple[Rule, dict[str, Any]] | None = None
        seen: set[str] = set()
        for kw, rules in self._by_kw.items():
            if kw not in text:
                continue
            for r in rules:
                if r.id in seen:
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


def load_rules(extra: Iterable[str | Path] = ()) -> RuleSet:
    """Built-in rules plus the users' rule files (a rule with an existing id replaces it).

    Raises ``UserError`` for a missing or malformed file.
    """
    rules = _read_toml(resources.files("titan.triage").joinpath("rules.toml").read_text("utf-8"), "rules.toml")
    by_id = {r.id: r for r in rules}
    for path in extra:
        p = Path(path)
        try:
            text = p.read_text("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"cannot read rules file {p}: {e}", "pass a TOML file of [[rule]] tables") from None
        for r in _read_toml(text, str(p)):
            by_id[r.id] = r
    return RuleSet(list(by_id.values()))
