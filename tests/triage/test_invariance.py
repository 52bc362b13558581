"""Verdicts are invariant under rewrites that change no fact about the failure (a test against string-fitting).

Every public development case and every raw-log scenario is rewritten (``perturb.py``): unrelated
noise lines added, hosts and IPs renamed, ranks renumbered, timestamps moved to another year and
separator, files reordered, prefixes and level words coloured as a terminal capture keeps them, every
line behind a log collector's stamp (kubectl logs --timestamps) and grep -H's file-name prefix, CR LF
line ends — all at once — and, where every file is timed, all files pasted into
one behind ``tail``'s ``==> name <==`` headers. The verdict must stay the same, with the culprit
renamed the same way. On a failure the single rewrites are tried one by one and the message
names the one that changed the verdict. Set-aside cases are not read.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import perturb as pt  # noqa: E402
import public_corpus as pc  # noqa: E402
from test_corpus import SCENARIOS, _case_hosts  # noqa: E402

from titan.triage import triage  # noqa: E402


def _raw(d: Path) -> bool:
    return not any(d.rglob("run.json")) and not any(p.is_dir() for p in d.rglob("events"))


CASES = [(n, pc.PUBLIC / n / "logs") for n in pc.split()["dev"]] + [(d.name, d / "logs") for d in SCENARIOS if _raw(d / "logs")]

Mapping = tuple[dict[str, str], Callable[[int | None], int | None]]


def _files(logs: Path) -> pt.Files:
    return {str(p.relative_to(logs)): p.read_text(errors="replace") for p in sorted(logs.rglob("*")) if p.is_file()}


def _verdict(files: pt.Files, root: Path) -> tuple[Any, ...]:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    v = triage([root])
    return v.cls, v.action, v.culprit.get("rank"), v.culprit.get("node")


def _rewrites(files: pt.Files, logs: Path) -> list[tuple[str, Callable[[pt.Files], tuple[pt.Files, Mapping] | None]]]:
    ident: Callable[[int | None], int | None] = lambda r: r  # noqa: E731

    def hosts(f: pt.Files) -> tuple[pt.Files, Mapping] | None:
        h = pt.hosts(f, _case_hosts(logs))
        return (h[0], (h[1], ident)) if h else None

    def ranks(f: pt.Files) -> tuple[pt.Files, Mapping] | None:
        r = pt.ranks(f)
        return (r[0], ({}, r[1])) if r else None

    def plain(fn: Callable[[pt.Files], pt.Files | None]) -> Callable[[pt.Files], tuple[pt.Files, Mapping] | None]:
        return lambda f: (lambda out: (out, ({}, ident)) if out is not None else None)(fn(f))

    return [("noise", plain(lambda f: pt.noise(f, seed=len(f)))), ("hosts", hosts), ("ranks", ranks),
            ("times", plain(pt.times)), ("order", plain(pt.order)), ("colour", plain(pt.colour)),
            ("collector", plain(pt.collector)), ("grepped", plain(pt.grepped)), ("crlf", plain(pt.crlf))]


def _expect(base: tuple[Any, ...], maps: list[Mapping]) -> tuple[Any, ...]:
    cls, action, rank, node = base
    for hmap, rmap in maps:
        node = hmap.get(node, node) if node else node
        rank = rmap(rank)
    return cls, action, rank, node


@pytest.mark.timeout(240)
def test_verdicts_do_not_change_when_the_logs_are_rewritten_without_changing_a_fact(tmp_path: Path) -> None:
    changed: list[str] = []
    tried = 0
    for i, (name, logs) in enumerate(CASES):
        files = _files(logs)
        base = _verdict(files, tmp_path / f"{i}-base")
        steps = _rewrites(files, logs)
        cur, maps, applied = files, [], []
        for kind, fn in steps:
            out = fn(cur)
            if out is not None:
                cur, m = out
                maps.append(m)
                applied.append(kind)
        variants = [("+".join(applied), cur, maps)]
        m = pt.merged(files)
        if m is not None:
            variants.append(("merged", m, []))
        for label, vf, vm in variants:
            tried += 1
            got, want = _verdict(vf, tmp_path / f"{i}-{label}"), _expect(base, vm)
            if got == want:
                continue
            culprit = label
            if "+" in label:  # which single rewrite changes it
                for kind, fn in steps:
                    out = fn(files)
                    if out is not None and _verdict(out[0], tmp_path / f"{i}-{kind}") != _expect(base, [out[1]]):
                        culprit = kind
                        break
            changed.append(f"  {name} [{culprit}]: {base} -> {got} (expected {want})")
    assert tried >= 100, f"only {tried} rewritten variants"
    assert not changed, f"{len(changed)} of {tried} rewritten cases changed their verdict:\n" + "\n".join(changed)
