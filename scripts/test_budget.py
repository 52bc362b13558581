"""Minutes per test area from a pytest JUnit XML (the CI time budget, docs/testing.md).

    make test PYTEST_ARGS="-m 'not slow' --junitxml=/tmp/junit.xml"
    python scripts/test_budget.py /tmp/junit.xml

An area is the test's folder under tests/ (``tests/chaos``, ``tests/sla``, …), with the
chaos acceptance drills (``tests/chaos/test_acceptance.py``) listed on their own. Prints a
Markdown table: tests, minutes (setup + call + teardown), share of the total.
"""

from __future__ import annotations

import collections
import sys
import xml.etree.ElementTree as ET


def area(classname: str, file: str | None) -> str:
    path = (file or classname.replace(".", "/")).replace("\\", "/")
    parts = path.split("/")
    if "tests" in parts:
        parts = parts[parts.index("tests"):]
    if len(parts) >= 3 and parts[1] == "chaos" and parts[2].startswith("test_acceptance"):
        return "tests/chaos (acceptance drills)"
    return "/".join(parts[:2]) if len(parts) > 2 else "tests (top level)"


def main(argv: list[str]) -> int:
    root = ET.parse(argv[1]).getroot()
    secs: dict[str, float] = collections.defaultdict(float)
    count: dict[str, int] = collections.defaultdict(int)
    for case in root.iter("testcase"):
        a = area(case.get("classname", ""), case.get("file"))
        secs[a] += float(case.get("time") or 0.0)
        count[a] += 1
    total = sum(secs.values())
    print("| area | tests | minutes | share |\n|---|---:|---:|---:|")
    for a, s in sorted(secs.items(), key=lambda kv: -kv[1]):
        print(f"| {a} | {count[a]} | {s / 60:.1f} | {s / total:.0%} |")
    print(f"| **all** | {sum(count.values())} | {total / 60:.1f} | 100 % |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
