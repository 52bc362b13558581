"""Measure (6): the lines each system adds to (or changes in) the same training loop.

Every system's script is ``scripts/plain.py`` plus that system's wiring. Compared after
dropping the module docstring, comments, blank lines and the harness's ``# bench`` lines
(the same in every script), a line counts when the system's script has it and the plain
loop does not (``difflib``: inserted or replaced lines). The launcher command is reported
beside the count.
"""

from __future__ import annotations

import ast
import difflib
from pathlib import Path
from typing import Any

from peers.venvs import HERE, load_config

__all__ = ["code_lines", "lines_added", "LAUNCHERS"]

LAUNCHERS = {
    "plain": "torchrun --nproc-per-node N plain.py",
    "torchrun": "torchrun --max-restarts 3 --rdzv-backend c10d --rdzv-endpoint … train.py",
    "titan": "titan run --nproc-per-node N -- train.py",
    "torchft": "torchft_lighthouse … + one torchrun --nproc_per_node 1 --max_restarts 10 per replica group "
               "(REPLICA_GROUP_ID, NUM_REPLICA_GROUPS, TORCHFT_LIGHTHOUSE)",
    "nvrx": "ft_launcher --max-restarts 3 --ft-cfg-path cfg.yaml … train.py",
    "lm_resiliency": "torchrun --max-restarts 3 … train.py",
}


def code_lines(path: Path) -> list[str]:
    """The script's code lines: no docstring, comments, blank or ``# bench`` lines."""
    src = path.read_text()
    doc = ast.get_docstring(ast.parse(src), clean=False)
    if doc:
        src = src.replace(doc, "", 1)
    out = []
    for line in src.splitlines():
        if "# bench" in line:
            continue
        code = line.split("  #", 1)[0].rstrip()
        if not code.strip() or code.strip().startswith("#") or code.strip() in ('""""""', "''''''"):
            continue
        out.append(code)
    return out


def lines_added(system: str) -> dict[str, Any]:
    """``{"lines": n, "added": [...], "launcher": str}`` for one system's script."""
    script = HERE / load_config(system)["script"]
    base, mine = code_lines(HERE / "scripts" / "plain.py"), code_lines(script)
    added: list[str] = []
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(a=base, b=mine, autojunk=False).get_opcodes():
        if tag in ("insert", "replace"):
            added.extend(mine[j1:j2])
    return {"lines": len(added), "added": [a.strip() for a in added], "launcher": LAUNCHERS.get(system, ""),
            "script": str(script.relative_to(HERE.parents[1]))}
