"""The corpus: ≥ 40 failure scenarios with expected class, culprit and action.

Prints the confusion table and per-field accuracy; asserts ≥ 90 % class, ≥ 80 % culprit and
≥ 85 % action accuracy, and that the corpus covers every class and action, has real
captures, and has many-rank scenarios.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from titan.triage import ACTIONS, CLASSES, load_rules, triage

CORPUS = Path(__file__).parent / "corpus"
SCENARIOS = sorted(p for p in CORPUS.iterdir() if (p / "expected.json").is_file())


def _expected(d: Path) -> dict:
    return json.loads((d / "expected.json").read_text())


def _culprit_ok(exp: dict, got: dict) -> bool:
    """Every key the scenario states (rank, node, gpu) must match; unstated keys are not judged."""
    return all(got.get(k) == v for k, v in exp.items())


@pytest.mark.timeout(120)
def test_corpus_accuracy_meets_the_bar_and_prints_the_confusion_table(capsys: pytest.CaptureFixture[str]) -> None:
    rows = []
    for d in SCENARIOS:
        e = _expected(d)
        v = triage([d / "logs"]).to_dict()
        rows.append((d.name, e, v))
    labels = [*CLASSES, None]
    conf: Counter[tuple[str | None, str | None]] = Counter((e["class"], v["class"]) for _, e, v in rows)
    name = lambda c: "none" if c is None else c  # noqa: E731
    lines = ["expected \\ predicted".ljust(22) + " ".join(f"{name(c)[:9]:>9}" for c in labels)]
    for a in labels:
        lines.append(f"{name(a):22}" + " ".join(f"{conf[(a, b)] or '.':>9}" for b in labels))
    n = len(rows)
    cls_ok = sum(e["class"] == v["class"] for _, e, v in rows)
    cul_ok = sum(_culprit_ok(e["culprit"], v["culprit"]) for _, e, v in rows)
    act_ok = sum(e["action"] == v["action"] for _, e, v in rows)
    misses = [f"  {nm}: expected {e['class']}/{e['culprit']}/{e['action']} got {v['class']}/{v['culprit']}/{v['action']}"
              for nm, e, v in rows if not (e["class"] == v["class"] and _culprit_ok(e["culprit"], v["culprit"])
                                           and e["action"] == v["action"])]
    with capsys.disabled():
        print("\ntriage corpus confusion table (class):")
        print("\n".join(lines))
        print(f"class {cls_ok}/{n} = {cls_ok / n:.0%}, culprit {cul_ok}/{n} = {cul_ok / n:.0%}, "
              f"action {act_ok}/{n} = {act_ok / n:.0%}")
        if misses:
            print("misses:\n" + "\n".join(misses))
    assert cls_ok / n >= 0.90, f"class accuracy {cls_ok}/{n} below 90 %:\n" + "\n".join(misses)
    assert cul_ok / n >= 0.80, f"culprit accuracy {cul_ok}/{n} below 80 %:\n" + "\n".join(misses)
    assert act_ok / n >= 0.85, f"action accuracy {act_ok}/{n} below 85 %:\n" + "\n".join(misses)


def test_corpus_covers_every_class_and_action_with_real_captures_and_many_ranks() -> None:
    exp = [_expected(d) for d in SCENARIOS]
    assert len(SCENARIOS) >= 40, f"expected ≥ 40 scenarios, found {len(SCENARIOS)}"
    missing_cls = set(CLASSES) - {e["class"] for e in exp}
    missing_act = set(ACTIONS) - {e["action"] for e in exp}
    assert not missing_cls, f"classes without a scenario: {missing_cls}"
    assert not missing_act, f"actions without a scenario: {missing_act}"
    real = [d for d, e in zip(SCENARIOS, exp) if e["source"].startswith("captured from a real run")]
    assert len(real) >= 10, f"expected ≥ 10 captured scenarios, found {len(real)}"
    for d in real:
        assert (d / "COMMAND").is_file(), f"{d.name}: captured scenario without the COMMAND that produced it"
    for d, e in zip(SCENARIOS, exp):
        assert e.get("source"), f"{d.name}: expected.json must say how the logs were produced"
        assert (d / "logs").is_dir(), f"{d.name}: logs/ missing"
    many = [d for d in SCENARIOS if len({p.name for p in (d / "logs").rglob("*rank*")} |
                                        {p.parent.name for p in (d / "logs").rglob("stderr.log")}) >= 8]
    assert len(many) >= 3, f"expected ≥ 3 scenarios with ≥ 8 ranks, found {[d.name for d in many]}"


def test_no_rule_matches_scenario_specific_strings() -> None:
    """Hostnames, PIDs and paths of the corpus must not appear in any rule."""
    rules = load_rules().rules
    text = "\n".join([r.pattern.pattern for r in rules] + [k for r in rules for k in r.keywords])
    hosts: set[str] = set()
    for d in SCENARIOS:
        node = _expected(d)["culprit"].get("node")
        if node:
            hosts.add(node)
        for p in (d / "logs").rglob("*"):
            hosts.update(part for part in p.relative_to(d / "logs").parts[:-1] if re.search(r"\d", part))
    hosts -= {"0", "1", "2", "3", "4", "5", "6", "7", "run1", "events"}
    leaked = sorted(h for h in hosts if h in text)
    assert not leaked, f"rules mention scenario hostnames: {leaked}"
    assert not re.search(r"/(?:work|tmp|home|opt|mnt)/", text), "a rule mentions a filesystem path"
    assert not re.search(r"(?<![\w{,])\d{4,}(?![\w}])", text.replace("0000", "")), "a rule mentions a PID-like number"
