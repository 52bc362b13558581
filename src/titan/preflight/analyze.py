"""Turn every rank's fingerprint and self-test results into a verdict (pure; no I/O)."""

from __future__ import annotations

import collections
import statistics
from typing import Any, Mapping, Sequence

from titan.exitcodes import ExitCode
from titan.preflight.compare import compare_fingerprints
from titan.preflight.fingerprint import compute_group_key

__all__ = ["analyze", "GEMM_REL_TOL", "PAIR_SLOW_RATIO", "IO_SLOW_RATIO"]

GEMM_REL_TOL = 1e-4     # float32 GEMM of 256×256 N(0,1) inputs: observed ~1e-7
PAIR_SLOW_RATIO = 0.25  # a member whose pairs run at < a quarter of the others' (best of 5 each)
IO_SLOW_RATIO = 1 / 3   # a rank writing at < a third of the median


def _member(r: Mapping[str, Any]) -> str:
    return f"{r['node']}/rank{r['rank']}"


def analyze(results: Sequence[Mapping[str, Any]], baseline: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``results``: one dict per rank (rank, node, fingerprint, gemm, io, …) → verdict dict."""
    by_member = {_member(r): r for r in results}
    diffs = compare_fingerprints({m: r["fingerprint"] for m, r in by_member.items()}, baseline)
    flags: list[dict[str, Any]] = []

    # GEMM canary: bitwise within groups of identical stacks, else float64 tolerance.
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for m, r in by_member.items():
        if r.get("gemm"):
            groups[compute_group_key(r["fingerprint"])].append(m)
    for members in groups.values():
        shas = collections.Counter(by_member[m]["gemm"]["sha256"] for m in members)
        top, n = shas.most_common(1)[0]
        majority = len(members) >= 3 and n * 2 > len(members)
        for m in members:
            g = by_member[m]["gemm"]
            if majority and g["sha256"] != top:
                flags.append({"test": "gemm", "member": m, "why": "result differs bitwise from identical peers "
                              f"(max rel err vs float64 {g['max_rel_err']:.2e}): possible silent data corruption"})
            elif not majority and g["max_rel_err"] > GEMM_REL_TOL:
                flags.append({"test": "gemm", "member": m, "why": f"max rel err vs float64 {g['max_rel_err']:.2e} "
                              f"> {GEMM_REL_TOL:g}: possible silent data corruption"})

    # Pairwise links: a member whose pairs are all slow compared with the pairs without it.
    pairs: Mapping[str, float] = next((r["pairs"] for r in results if r.get("pairs")), {})
    ranks = sorted(r["rank"] for r in results)
    if pairs and len(ranks) >= 3:
        for r in ranks:
            with_r = [bw for k, bw in pairs.items() if str(r) in k.split("-")]
            without = [bw for k, bw in pairs.items() if str(r) not in k.split("-")]
            if with_r and without and statistics.median(with_r) < PAIR_SLOW_RATIO * statistics.median(without):
                m = _member(next(x for x in results if x["rank"] == r))
                flags.append({"test": "link", "member": m, "why": f"send/recv with this member "
                              f"{statistics.median(with_r):.3f} GB/s vs {statistics.median(without):.3f} GB/s between the others"})

    # Concurrent checkpoint-folder I/O: outliers against the median of the others.
    io = {m: r["io"] for m, r in by_member.items() if r.get("io")}
    if len(io) >= 3:
        med = statistics.median(v["write_MBps"] for v in io.values())
        for m, v in io.items():
            if v["write_MBps"] < IO_SLOW_RATIO * med:
                flags.append({"test": "io", "member": m, "why": f"write {v['write_MBps']:.0f} MB/s vs median {med:.0f} MB/s"})

    errors = [{"test": r["error"]["test"], "member": _member(r), "why": r["error"]["message"]}
              for r in results if r.get("error")]
    flags += errors
    if diffs:
        code = ExitCode.MISMATCH
    elif flags:
        code = ExitCode.SELFTEST_FAILED
    else:
        code = ExitCode.SUCCEEDED
    return {
        "exit_code": int(code), "verdict": code.name.lower(),
        "members": sorted(by_member), "differences": [d.to_dict() for d in diffs], "flags": flags,
        "sweep": next((r["sweep"] for r in results if r.get("sweep")), []), "pairs": dict(pairs),
        "gemm": {m: r.get("gemm") for m, r in by_member.items()}, "io": io,
    }
