"""Preflight on real multi-rank gloo jobs: the odd node/rank is named, a clean run passes."""

from __future__ import annotations

import json

import pytest

from pfhelpers import run_nodes
from titan.cli.environment import Environment
from titan.cli.main import run
from titan.exitcodes import ExitCode

SMALL = ["--max-bytes=65536", "--io-bytes=1048576", "--pair-bytes=65536"]


def _titan(tmp_path, *argv, env_extra=None):
    import os

    env = Environment.captured(tmp_path, env=dict(os.environ, **(env_extra or {})))
    code = run(list(argv), env)
    return code, env.stdout.getvalue(), env.stderr.getvalue()


@pytest.mark.timeout(120)
def test_clean_local_run_exits_zero(tmp_path):
    code, out, err = _titan(tmp_path, "preflight", "--nproc", "3", "--max-bytes", "65536", "--io-bytes", "1048576",
                            "--json", "--set", f"run.runs_dir={tmp_path / 'runs'}")
    verdict = json.loads(out)
    assert code == ExitCode.SUCCEEDED, (verdict["differences"], verdict["flags"], err)
    assert len(verdict["members"]) == 3 and verdict["sweep"] and len(verdict["pairs"]) == 3
    assert {r["op"] for r in verdict["sweep"]} == {"all_reduce", "all_gather", "reduce_scatter"}


@pytest.mark.timeout(120)
def test_perturbed_gemm_rank_is_named(tmp_path):
    code, out, _ = _titan(tmp_path, "preflight", "--nproc", "3", "--max-bytes", "16384", "--io-bytes", "65536",
                          "--json", "--set", f"run.runs_dir={tmp_path / 'runs'}",
                          env_extra={"TITAN_INJECT_PREFLIGHT_GEMM_RANKS": "1"})
    verdict = json.loads(out)
    assert code == ExitCode.SELFTEST_FAILED, verdict["flags"]
    gemm = [f["member"].split("/")[1] for f in verdict["flags"] if f["test"] == "gemm"]
    assert gemm == ["rank1"], verdict["flags"]


@pytest.mark.multinode
@pytest.mark.timeout(180)
def test_node_with_other_env_var_and_node_with_other_package_are_named(tmp_path, fake_package):
    import os

    envs = [{}, {"NCCL_ALGO": "Tree"}, {"PYTHONPATH": f"{fake_package}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}]
    verdict = run_nodes(tmp_path, envs, SMALL + ["--skip=sweep,pairs"])
    diffs = {(d["member"], d["key"], d["reference"]) for d in verdict["differences"]}
    assert ("node1/rank1", "env.NCCL_ALGO", "majority") in diffs, diffs
    assert ("node2/rank2", "packages.accelerate", "majority") in diffs, diffs
    assert all(m.startswith(("node1/", "node2/")) for m, _, _ in diffs), diffs
    assert verdict["exit_code"] == ExitCode.MISMATCH


def test_two_members_need_a_baseline(tmp_path):
    from titan.preflight import compare_fingerprints

    a = {"torch": {"version": "2.13.0"}, "packages": {"numpy": "2.4"}}
    b = {"torch": {"version": "2.13.0"}, "packages": {"numpy": "2.3"}}
    no_base = compare_fingerprints({"A": a, "B": b})
    assert {(d.member, d.reference) for d in no_base} == {("A", "none"), ("B", "none")}
    with_base = compare_fingerprints({"A": a, "B": b}, baseline=a)
    assert [(d.member, d.key, d.expected) for d in with_base] == [("B", "packages.numpy", "2.4")]


def test_offline_compare_of_saved_fingerprints(tmp_path):
    code, _, _ = _titan(tmp_path, "preflight", "--save", "a.json")
    assert code == ExitCode.SUCCEEDED
    fp = json.loads((tmp_path / "a.json").read_text())
    fp["torch"]["version"] = "2.99.0"
    (tmp_path / "b.json").write_text(json.dumps(fp))
    (tmp_path / "c.json").write_text((tmp_path / "a.json").read_text())
    code, out, _ = _titan(tmp_path, "preflight", "--compare", "a.json", "b.json", "c.json", "--json")
    verdict = json.loads(out)
    assert code == ExitCode.MISMATCH
    assert [(d["member"], d["key"]) for d in verdict["differences"]] == [("b.json", "torch.version")]


@pytest.mark.parametrize("argv, match", [
    (["--nproc", "0"], "--nproc: 0 is out of range"),
    (["--compare", "missing.json"], "cannot read --compare file"),
    (["--baseline", "bad.json", "--compare", "bad.json"], "is not valid JSON"),
])
def test_bad_input_is_one_line(tmp_path, argv, match):
    (tmp_path / "bad.json").write_text("{")
    code, _, err = _titan(tmp_path, "preflight", *argv)
    assert code == ExitCode.USER_ERROR and match in err and "Traceback" not in err, err


@pytest.mark.timeout(120)
def test_human_output_gives_every_sections_verdict(tmp_path):
    """Without --json every section says its verdict: stack, sweep, links, GEMM and disk."""
    code, out, err = _titan(tmp_path, "preflight", "--nproc", "3", "--max-bytes", "16384", "--io-bytes", "65536",
                            "--set", f"run.runs_dir={tmp_path / 'runs'}",
                            env_extra={"TITAN_INJECT_PREFLIGHT_GEMM_RANKS": "1", "COLUMNS": "200"})
    assert code == ExitCode.SELFTEST_FAILED, f"expected exit 7 (perturbed GEMM), seen {code}: {err[-2000:]}"
    lines = {ln.split("  ")[0].strip(): ln for ln in out.splitlines() if ln.strip()}
    # Stack and GEMM are deterministic here; sweep, links and disk are timings on a loaded
    # machine (a slow rank may be flagged for real): each must state a verdict and its numbers.
    expect = {"stack comparison": ("ok", "3 member(s) identical"), "GEMM canary": ("failed", "rank1"),
              "collective sweep": ("ok|failed", "GB/s"), "links (pairwise send/recv)": ("ok|failed", "GB/s"),
              "checkpoint disk I/O": ("ok|failed", "MB/s")}
    for title, (status, detail) in expect.items():
        line = lines.get(title)
        assert line is not None, f"expected a verdict line for {title!r}, seen:\n{out}"
        seen = line.strip()[len(title):].split()[0]
        assert seen in status.split("|") and detail in line, f"expected {title!r} {status} with {detail!r}: {line}"


def test_offline_compare_says_which_sections_did_not_run(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps({"torch": {"version": "2.13.0"}}))
    b.write_text(json.dumps({"torch": {"version": "2.13.0"}}))
    code, out, err = _titan(tmp_path, "preflight", "--compare", str(a), str(b), env_extra={"COLUMNS": "200"})
    assert code == ExitCode.SUCCEEDED, err
    assert "stack comparison" in out and "2 member(s) identical" in out, out
    assert out.count("not run") == 4 and "offline comparison" in out, out
