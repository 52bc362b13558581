"""The public corpus (real failure logs from public threads): well-formed, mixed, split, scored.

Scores are printed for both splits (the set-aside split as aggregates only, so that rule
writing never sees its cases). Goals from issue 17 on the set-aside split: class ≥ 85 %,
culprit ≥ 70 % (of cases whose logs name one), action ≥ 80 %.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

import public_corpus as pc

CASES = pc.load()
DOCS = Path(__file__).resolve().parents[2] / "docs" / "triage.md"


def test_every_public_case_is_well_formed_and_its_first_anomaly_is_a_verbatim_log_line() -> None:
    bad = {c.name: p for c in CASES if (p := pc.validate(c))}
    assert not bad, "malformed public cases:\n" + "\n".join(f"  {k}: {v}" for k, v in bad.items())


def test_the_corpus_has_the_mix_the_issue_asks_for() -> None:
    n = len(CASES)
    per_class = Counter(c.truth["class"] for c in CASES)
    multi = sum(bool(c.truth["multi_file"]) for c in CASES)
    misleading = sum(bool(c.truth["misleading_last_error"]) for c in CASES)
    assert n >= 100, f"expected ≥ 100 public cases, found {n}"
    thin = {k: per_class.get(k, 0) for k in pc.CLASSES if per_class.get(k, 0) < 8}
    assert not thin, f"classes with fewer than 8 cases: {thin}"
    assert multi >= 15, f"expected ≥ 15 multi-file cases, found {multi}"
    assert misleading / n >= 0.25, f"expected ≥ 25 % cases with a misleading last error, found {misleading}/{n}"
    sources = Counter(c.truth["source"] for c in CASES)
    dup = {s: k for s, k in sources.items() if k > 2}
    assert not dup, f"a thread gives at most two cases: {dup}"


def test_split_json_is_the_keyed_hash_split_of_every_case() -> None:
    want = pc.make_split(pc.case_names())
    got = pc.split()
    assert got["dev"] == want["dev"] and got["holdout"] == want["holdout"], (
        "corpus/public/SPLIT.json is stale: run `python tests/triage/public_corpus.py --split`")
    assert 0.2 <= len(got["holdout"]) / len(CASES) <= 0.4, f"{len(got['holdout'])} of {len(CASES)} set aside"


def test_docs_sources_table_lists_every_case_with_its_thread() -> None:
    text = DOCS.read_text()
    m = re.search(r"<!-- sources:begin -->\n(.*?)\n<!-- sources:end -->", text, re.S)
    assert m, "docs/triage.md lacks the <!-- sources:begin/end --> SOURCES table"
    assert m.group(1).strip() == pc.sources_table(CASES).strip(), (
        "docs/triage.md SOURCES table is stale: `python tests/triage/public_corpus.py --sources`")


@pytest.fixture(scope="module")
def scores() -> tuple[pc.Score, pc.Score]:
    sp = pc.split()
    return (pc.score(pc.load(sp["dev"]), pc._verdict),
            pc.score(pc.load(sp["holdout"]), pc._verdict, keep_misses=False))


@pytest.mark.timeout(300)
def test_development_split_meets_the_goal(scores: tuple[pc.Score, pc.Score], capsys: pytest.CaptureFixture[str]) -> None:
    dev, _ = scores
    with capsys.disabled():
        print("\n" + dev.line("public corpus, development split"))
    assert dev.cls >= 0.90 and dev.cul >= 0.80 and dev.act >= 0.85, dev.line("dev") + "\n" + "\n".join(dev.misses)


@pytest.mark.timeout(300)
def test_set_aside_split_meets_the_goal(scores: tuple[pc.Score, pc.Score], capsys: pytest.CaptureFixture[str]) -> None:
    # Met since the fourth batch (docs/triage.md): the rules were written without looking at
    # the set-aside cases; the margin is thin (action 34/42, the 38 older cases alone 30/38).
    _, held = scores
    with capsys.disabled():
        print("\n" + held.line("public corpus, set-aside split"))
    assert held.cls >= 0.85 and held.cul >= 0.70 and held.act >= 0.80, held.line("set-aside")
