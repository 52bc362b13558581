"""What the README promises is what the code does: every exit code, the demo's faults and
restarts, the distribution name, the torch release that is tested."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from titan.chaos.builtin_plans import builtin_plan
from titan.chaos.verdict import expect_for
from titan.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _pyproject() -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _section(text: str, title: str) -> str:
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 3)
    return text[start:end if end > 0 else None]


def test_readme_lists_every_exit_code():
    sec = _section(README, "Exit codes")
    missing = [int(c) for c in ExitCode if not re.search(rf"(?<![\d.]){int(c)}(?![\d.])", sec)]
    assert not missing, f"README's exit-code list lacks {missing}:\n{sec}"


def test_readme_demo_says_what_make_demo_injects():
    plan, steps, _ = builtin_plan("quick")  # `make demo` runs `titan drill`, whose default plan is quick
    demo = README[README.index("make demo"):README.index("make test")]
    restarts = sum(1 for f in plan.faults if expect_for(f).recovery in ("restart", "fallback"))
    assert f"{len(plan.faults)} faults" in demo and f"{restarts} restarts" in demo, demo
    assert f"for {steps} steps" in demo, demo
    for f in plan.faults:
        assert f"step {f.step}" in demo and f"rank {f.rank}" in demo, (f, demo)


def test_distribution_name_is_ours_and_extras_use_it():
    name = _pyproject()["project"]["name"]
    assert name != "titan", "the name `titan` on the package index is an unrelated project"
    assert f"pip install '{name}[" in README, f"README should show `pip install '{name}[...]'`"
    bad = []
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "src").rglob("*.py"))]
    for f in files:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if re.search(r"(?<![\w-])titan\[", line):
                bad.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not bad, f"extras must name the distribution {name!r}:\n" + "\n".join(bad)


def test_torch_floor_is_the_tested_release():
    deps = _pyproject()["project"]["dependencies"]
    (torch_dep,) = [d for d in deps if re.match(r"torch\b", d)]
    floor = re.search(r">=\s*([\d.]+)", torch_dep).group(1)
    tested = re.search(r"^TORCH_SPEC \?= torch==([\d.]+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert tested.split(".")[:2] == floor.split(".")[:2], f"pyproject claims torch>={floor}, make test installs {tested}"
    mm = ".".join(floor.split(".")[:2])
    assert f"Supported torch:\n**{mm}**" in README or f"Supported torch: **{mm}**" in README, \
        "README's 'Supported torch' must name the tested release"
