"""The house rule "imports point down, no cycles" (docs/architecture.md), checked on the source.

Every ``import titan.X`` / ``from titan.X import …`` — at module level, inside functions and
under ``TYPE_CHECKING`` alike — is an arrow from the importing package to ``X``. Two packages
that reach each other through these arrows form a cycle, and the test names every arrow of it.
"""

from __future__ import annotations

import ast
import collections
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "titan"

#: Ground floor first: a package may import only packages listed before it on this list
#: (the spine and the in-worker layers that scripts import; the rest sit above them).
FLOORS = ["exitcodes", "errors", "inputs", "settings", "security", "events", "beacon", "worker"]


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "titan"


def _arrows() -> dict[str, set[tuple[str, str]]]:
    arrows: dict[str, set[tuple[str, str]]] = collections.defaultdict(set)
    for f in SRC.rglob("*.py"):
        rel = f.relative_to(SRC.parent).with_suffix("")
        src = _package(".".join(rel.parts))
        if f.parent == SRC:
            src = rel.parts[-1]  # top-level modules (errors.py, exitcodes.py) are floors of their own
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("titan.") and not node.level:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("titan.")]
            for n in names:
                tgt = _package(n)
                if tgt != src:
                    arrows[src].add((tgt, str(f.relative_to(SRC.parent))))
    return arrows


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_two_packages_import_each_other():
    arrows = _arrows()
    graph = {k: {t for t, _ in v} for k, v in arrows.items()}
    cycles = _cycles(graph)
    detail = [f"{a} -> {t} ({f})" for comp in cycles for a in comp for t, f in sorted(arrows[a]) if t in comp]
    assert not cycles, "import cycles between packages (expected none):\n  " + "\n  ".join(detail)


def test_the_ground_floors_import_only_what_lies_below_them():
    arrows = _arrows()
    up = [f"{src} -> {t} ({f})" for i, src in enumerate(FLOORS) for t, f in sorted(arrows.get(src, ()))
          if t not in FLOORS[:i]]
    assert not up, "a ground-floor package imports a package above it (expected none):\n  " + "\n  ".join(up)
