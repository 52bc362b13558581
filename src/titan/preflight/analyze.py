"""Turn every rank's fingerprint and self-test results into a verdict (pure; no I/O)."""

from __future__ import annotations

import collections
import statistics
from typing import Any, Mapping, Sequence

from titan.exitcodes import ExitCode
from titan.preflight.compare import compare_fingerprints
from titan.preflight.fingerprint import compute_group_key

__all__ = ["analyze", "section_verdicts", "SECTIONS", "GEMM_REL_TOL", "PAIR_SLOW_RATIO", "IO_SLOW_RATIO"]

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
    out = {
        "exit_code": int(code), "verdict": code.name.lower(),
        "members": sorted(by_member), "differences": [d.to_dict() for d in diffs], "flags": flags,
        "sweep": next((r["sweep"] for r in results if r.get("sweep")), []), "pairs": dict(pairs),
        "gemm": {m: r.get("gemm") for m, r in by_member.items()}, "io": io, "baseline": baseline is not None,
    }
    out["sections"] = section_verdicts(out)
    return out


#: The verdict's sections, in the order the CLI prints them: (key, title, flag test names).
SECTIONS = (("stack", "stack comparison", ()), ("sweep", "collective sweep", ("sweep",)),
            ("links", "links (pairwise send/recv)", ("link", "pairs")), ("gemm", "GEMM canary", ("gemm",)),
            ("io", "checkpoint disk I/O", ("io",)))


def _named(flags: Sequence[Mapping[str, Any]]) -> str:
    return "; ".join(f"{f['member']}: {f['why']}" for f in flags)


def section_verdicts(v: Mapping[str, Any]) -> list[dict[str, str]]:
    """One ``{section, title, status, detail}`` per section of a verdict (``analyze``'s, or an
    offline ``--compare`` one without self-test results). ``status`` is ``ok``, ``mismatch``,
    ``failed`` or ``not run``; ``detail`` says what was measured or why it did not run."""
    members = list(v.get("members") or [])
    n = len(members)
    flags = list(v.get("flags") or [])
    offline = not v.get("gemm") and not v.get("io") and not v.get("sweep")
    out = []
    for key, title, tests in SECTIONS:
        bad = [f for f in flags if f.get("test") in tests]
        status, detail = "ok", ""
        if key == "stack":
            diffs = v.get("differences") or []
            if diffs:
                keys = sorted({d["key"] for d in diffs})
                who = sorted({d["member"] for d in diffs})
                status = "mismatch"
                detail = (f"{len(keys)} setting(s) differ ({', '.join(keys[:4])}{'…' if len(keys) > 4 else ''}) "
                          f"on {', '.join(who[:4])}{'…' if len(who) > 4 else ''}")
                if n == 2 and not v.get("baseline"):
                    detail += "; with 2 members only --baseline can say which one is right"
            else:
                detail = f"{n} member(s) identical" + (" and equal to the baseline" if v.get("baseline") else "")
        elif bad:
            status, detail = "failed", _named(bad)
        elif offline:
            status, detail = "not run", "offline comparison of saved fingerprints (--compare)"
        elif key == "sweep":
            sweep = v.get("sweep") or []
            if not sweep:
                status, detail = "not run", "skipped"
            else:
                top = max(r["bytes"] for r in sweep)
                big = {r["op"]: r for r in sweep if r["bytes"] == top}
                detail = f"{len(sweep)} measurements; at {top:,} bytes bus bandwidth " + ", ".join(
                    f"{op} {r['busbw_GBps']:.3f} GB/s" for op, r in sorted(big.items()))
        elif key == "links":
            pairs = v.get("pairs") or {}
            if not pairs:
                status, detail = "not run", ("needs >= 3 members" if n < 3 else "skipped")
            else:
                bws = sorted(pairs.values())
                slow = min(pairs, key=lambda k: pairs[k])
                detail = (f"{len(pairs)} pairs, median {statistics.median(bws):.3f} GB/s, slowest {slow} "
                          f"{pairs[slow]:.3f} GB/s (flagged below {PAIR_SLOW_RATIO:g}x the others)")
        elif key == "gemm":
            g = {m: x for m, x in (v.get("gemm") or {}).items() if x}
            if not g:
                status, detail = "not run", "skipped"
            else:
                shas = collections.Counter(x["sha256"] for x in g.values())
                err = max(x["max_rel_err"] for x in g.values())
                detail = (f"{shas.most_common(1)[0][1]} of {len(g)} results bitwise identical; max rel err vs "
                          f"float64 {err:.1e} (limit {GEMM_REL_TOL:g})")
        elif key == "io":
            io = v.get("io") or {}
            if not io:
                status, detail = "not run", "skipped"
            else:
                w = [x["write_MBps"] for x in io.values()]
                detail = (f"write {min(w):.0f}-{max(w):.0f} MB/s, fsync <= "
                          f"{max(x.get('fsync_s', 0.0) for x in io.values()):.3f} s on {len(io)} rank(s)"
                          + ("" if len(io) >= 3 else "; outliers are judged with >= 3 ranks"))
        out.append({"section": key, "title": title, "status": status, "detail": detail})
    other = [f for f in flags if not any(f.get("test") in t for _, _, t in SECTIONS)]
    if other:
        out.append({"section": "other", "title": "other self-tests", "status": "failed", "detail": _named(other)})
    return out
