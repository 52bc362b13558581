"""The public triage corpus: real failure logs from public threads, with their truth.

Layout and labelling conventions: docs/triage.md ("The public corpus"). Cases live in
``corpus/public/<case>/`` (``logs/`` verbatim, ``expected.json``); ``corpus/public/SPLIT.json``
sets a random 30 % aside (fixed seed) that rule writing never looks at. This module loads
cases, scores verdicts against the truth and renders the SOURCES table of docs/triage.md.
It is imported by the tests and runnable: ``python tests/triage/public_corpus.py [--sources]``.
"""

from __future__ import annotations

import dataclasses
import json
import hashlib
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable, Iterable

PUBLIC = Path(__file__).parent / "corpus" / "public"
SPLIT_FILE = PUBLIC / "SPLIT.json"
SPLIT_SEED = 20261201
HOLDOUT_FRACTION = 0.30
CLASSES = ("gpu_hardware", "numerical", "hang", "comm_error", "network", "storage", "oom", "launcher", "user_code")
ACTIONS = ("skip_step", "restart_from_checkpoint", "exclude_node_and_restart", "fix_code_or_config", "retry")
REQUIRED = ("class", "culprit", "action", "source", "source_repo", "first_anomaly", "first_anomaly_file",
            "truth_basis", "truth_quote", "confidence", "misleading_last_error", "multi_file", "note")


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    path: Path
    truth: dict[str, Any]

    @property
    def logs(self) -> Path:
        return self.path / "logs"


def case_names() -> list[str]:
    return sorted(p.name for p in PUBLIC.iterdir() if (p / "expected.json").is_file()) if PUBLIC.is_dir() else []


def load(names: Iterable[str] | None = None) -> list[Case]:
    names = case_names() if names is None else names
    return [Case(n, PUBLIC / n, json.loads((PUBLIC / n / "expected.json").read_text())) for n in names]


def is_held_out(name: str, seed: int = SPLIT_SEED, fraction: float = HOLDOUT_FRACTION) -> bool:
    """Whether a case is set aside: a keyed hash of its name, so adding cases never moves old ones."""
    h = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64 < fraction


def make_split(names: list[str], seed: int = SPLIT_SEED, fraction: float = HOLDOUT_FRACTION) -> dict[str, Any]:
    """The split of ``names``: each case set aside with probability ``fraction`` (see ``is_held_out``)."""
    names = sorted(names)
    return {"seed": seed, "fraction": fraction, "rule": "sha256(f'{seed}:{name}')[:8] / 2**64 < fraction",
            "dev": [n for n in names if not is_held_out(n, seed, fraction)],
            "holdout": [n for n in names if is_held_out(n, seed, fraction)]}


def split() -> dict[str, Any]:
    return json.loads(SPLIT_FILE.read_text())


def validate(c: Case) -> list[str]:
    """Problems with one case's files (empty when it is well-formed)."""
    t, bad = c.truth, []
    missing = [k for k in REQUIRED if k not in t]
    if missing:
        bad.append(f"missing fields {missing}")
    if t.get("class") not in CLASSES:
        bad.append(f"class {t.get('class')!r} not in {CLASSES}")
    if t.get("action") not in ACTIONS:
        bad.append(f"action {t.get('action')!r} not in {ACTIONS}")
    if not isinstance(t.get("culprit"), dict) or set(t.get("culprit", {})) - {"rank", "node", "gpu"}:
        bad.append(f"culprit must be a dict of rank/node/gpu, got {t.get('culprit')!r}")
    if t.get("confidence") not in ("high", "medium"):
        bad.append(f"confidence {t.get('confidence')!r} must be high or medium")
    files = [p for p in c.logs.rglob("*") if p.is_file()] if c.logs.is_dir() else []
    if not files:
        bad.append("logs/ is empty or missing")
    f = c.path / str(t.get("first_anomaly_file", ""))
    if not f.is_file():
        bad.append(f"first_anomaly_file {t.get('first_anomaly_file')!r} does not exist")
    elif str(t.get("first_anomaly", "")).strip() not in f.read_text(errors="replace"):
        bad.append("first_anomaly does not occur verbatim in first_anomaly_file")
    if bool(t.get("multi_file")) != (len(files) > 1):
        bad.append(f"multi_file={t.get('multi_file')} but logs/ has {len(files)} file(s)")
    return bad


@dataclasses.dataclass
class Score:
    n: int = 0
    cls_ok: int = 0
    act_ok: int = 0
    cul_n: int = 0
    cul_ok: int = 0
    per_class: dict[str, list[int]] = dataclasses.field(default_factory=lambda: defaultdict(lambda: [0, 0, 0, 0, 0, 0]))
    bands: dict[str, list[int]] = dataclasses.field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    misses: list[str] = dataclasses.field(default_factory=list)

    def pct(self, a: int, b: int) -> float:
        return a / b if b else 1.0

    @property
    def cls(self) -> float:
        return self.pct(self.cls_ok, self.n)

    @property
    def act(self) -> float:
        return self.pct(self.act_ok, self.n)

    @property
    def cul(self) -> float:
        return self.pct(self.cul_ok, self.cul_n)

    def line(self, label: str) -> str:
        return (f"{label}: n={self.n} class {self.cls_ok}/{self.n} = {self.cls:.0%}, culprit {self.cul_ok}/"
                f"{self.cul_n} = {self.cul:.0%} (of cases whose logs name one), action {self.act_ok}/{self.n} = "
                f"{self.act:.0%}")

    def table(self) -> str:
        rows = ["| class | n | class ok | culprit ok (named) | action ok |", "|---|---|---|---|---|"]
        for k in CLASSES:
            n, c, cn, co, a, _ = self.per_class.get(k, [0] * 6)
            if n:
                rows.append(f"| {k} | {n} | {c}/{n} | {co}/{cn} | {a}/{n} |")
        return "\n".join(rows)


def culprit_ok(exp: dict[str, Any], got: dict[str, Any]) -> bool:
    """Every key the truth states must match; a node matches case-insensitively up to a domain suffix."""
    for k, v in exp.items():
        g = got.get(k)
        if k == "node" and isinstance(v, str) and isinstance(g, str):
            if g.lower().split(".")[0] != v.lower().split(".")[0]:
                return False
        elif g != v:
            return False
    return True


def band(conf: float | None) -> str:
    if conf is None:
        return "none"
    return "≥0.8" if conf >= 0.8 else "0.6–0.8" if conf >= 0.6 else "<0.6"


def score(cases: list[Case], verdict_of: Callable[[Case], dict[str, Any]], *, keep_misses: bool = True) -> Score:
    s = Score()
    for c in cases:
        e, v = c.truth, verdict_of(c)
        s.n += 1
        pc = s.per_class[e["class"]]
        pc[0] += 1
        ok_c = v.get("class") == e["class"]
        ok_a = v.get("action") == e["action"]
        s.cls_ok += ok_c
        s.act_ok += ok_a
        pc[1] += ok_c
        pc[4] += ok_a
        ok_u = True
        if e["culprit"]:
            ok_u = culprit_ok(e["culprit"], v.get("culprit") or {})
            s.cul_n += 1
            s.cul_ok += ok_u
            pc[2] += 1
            pc[3] += ok_u
        b = s.bands[band(v.get("confidence"))]
        b[0] += 1
        b[1] += ok_c and ok_a and ok_u
        if keep_misses and not (ok_c and ok_a and ok_u):
            s.misses.append(f"  {c.name}: expected {e['class']}/{e['culprit']}/{e['action']} got "
                            f"{v.get('class')}/{v.get('culprit')}/{v.get('action')}")
    return s


def merged(a: Score, b: Score) -> Score:
    """Two splits' scores together (the full corpus), per class and per band; no misses kept."""
    out = Score(n=a.n + b.n, cls_ok=a.cls_ok + b.cls_ok, act_ok=a.act_ok + b.act_ok, cul_n=a.cul_n + b.cul_n,
                cul_ok=a.cul_ok + b.cul_ok)
    for s in (a, b):
        for k, v in s.per_class.items():
            out.per_class[k] = [x + y for x, y in zip(out.per_class[k], v)]
        for k, v in s.bands.items():
            out.bands[k] = [x + y for x, y in zip(out.bands[k], v)]
    return out


def calibration(s: Score) -> str:
    """Accuracy (class, culprit and action all right) per confidence band."""
    rows = ["| confidence | verdicts | all right | accuracy |", "|---|---|---|---|"]
    for b in ("≥0.8", "0.6–0.8", "<0.6", "none"):
        n, ok = s.bands.get(b, [0, 0])
        if n:
            rows.append(f"| {b} | {n} | {ok} | {ok / n:.0%} |")
    return "\n".join(rows)


def sources_table(cases: list[Case]) -> str:
    rows = ["| case | class | source |", "|---|---|---|"]
    for c in cases:
        rows.append(f"| `{c.name}` | {c.truth['class']} | {c.truth['source']} |")
    return "\n".join(rows)


def _verdict(c: Case) -> dict[str, Any]:
    from titan.triage import triage

    return triage([c.logs]).to_dict()


def main(argv: list[str]) -> int:
    if "--sources" in argv:
        print(sources_table(load()))
        return 0
    if "--split" in argv:
        SPLIT_FILE.write_text(json.dumps(make_split(case_names()), indent=1) + "\n")
        return 0
    sp = split()
    dev = score(load(sp["dev"]), _verdict)
    held = score(load(sp["holdout"]), _verdict, keep_misses=False)
    print(dev.line("development split"))
    print(dev.table())
    print(held.line("set-aside split"))
    print(held.table())
    if "--misses" in argv:
        print("development misses:\n" + "\n".join(dev.misses))
    if "--report" in argv:  # the tables of docs/triage.md (set-aside: aggregates only)
        full = merged(dev, held)
        for label, sc in (("development", dev), ("set aside", held), ("full corpus", full)):
            print(f"\n### {label}: " + sc.line(label).split(": ", 1)[1] + "\n\n" + sc.table() + "\n\n"
                  + calibration(sc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
