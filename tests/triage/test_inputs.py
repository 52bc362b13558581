"""Bad inputs give a clear message and no traceback; formats and prefixes are understood."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from titan.cli.environment import Environment
from titan.cli.main import run
from titan.exitcodes import ExitCode
from titan.triage import triage
from titan.triage.lineparse import line_rank, name_hints, parse_time

CORPUS = Path(__file__).parent / "corpus"
ROOT = Path(__file__).resolve().parents[2]


def _cli(tmp_path: Path, *argv: str) -> tuple[ExitCode, str, str]:
    env = Environment.captured(tmp_path)
    code = run(["triage", *argv], env)
    return code, env.stdout.getvalue(), env.stderr.getvalue()  # type: ignore[attr-defined]


def _garbage(tmp_path: Path) -> Path:
    d = tmp_path / "junk"
    d.mkdir()
    rnd = random.Random(7)
    (d / "random.bin").write_bytes(bytes(rnd.getrandbits(8) for _ in range(200_000)))
    (d / "nuls.log").write_bytes(b"\x00" * 5000 + b"RuntimeError: x\n")
    (d / "empty.log").write_bytes(b"")
    (d / "huge_line.log").write_bytes(b"x" * (20 << 20))  # one 20 MiB line without a newline
    (d / "mixed.log").write_bytes("caf\u00e9 ok\n".encode() + "caf\u00e9 latin\n".encode("latin-1") + b"\xff\xfe\x80 noise\n")
    (d / "text.log").write_text("hello\nnothing interesting here\n" * 100)
    return d


@pytest.mark.timeout(60)
def test_garbage_binary_empty_huge_line_and_mixed_encoding_give_a_clear_message_and_no_traceback(tmp_path: Path) -> None:
    d = _garbage(tmp_path)
    code, out, err = _cli(tmp_path, str(d))
    assert code == ExitCode.UNDIAGNOSED, f"expected UNDIAGNOSED, got {code!r}; stderr={err}"
    assert "no diagnosis" in out and "Traceback" not in out + err
    assert "binary content, skipped" in err and "empty file" in err, f"notes missing: {err}"
    code, out, err = _cli(tmp_path, str(d), "--json")
    v = json.loads(out)
    assert v["diagnosed"] is False and v["class"] is None and "no recognised failure" in v["reason"]


@pytest.mark.timeout(60)
def test_a_real_error_is_still_found_among_garbage_and_a_huge_line(tmp_path: Path) -> None:
    d = _garbage(tmp_path)
    (d / "huge_line.log").write_bytes(b"y" * (9 << 20) + b"\n[rank3]: OSError: [Errno 28] No space left on device\n")
    v = triage([d])
    assert (v.cls, v.culprit["rank"], v.action) == ("storage", 3, "fix_code_or_config"), v.to_dict()
    assert v.first_anomaly is not None and v.first_anomaly.line == 2


def test_an_empty_folder_is_no_diagnosis(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    code, out, err = _cli(tmp_path, str(tmp_path / "empty"))
    assert code == ExitCode.UNDIAGNOSED and "no readable log lines" in out and "Traceback" not in err


def test_missing_path_is_a_user_error_with_a_hint(tmp_path: Path) -> None:
    code, _, err = _cli(tmp_path, "does-not-exist")
    assert code == ExitCode.USER_ERROR
    assert err.startswith("titan: error: ") and "hint:" in err and "Traceback" not in err


def test_bad_rules_file_is_a_user_error(tmp_path: Path) -> None:
    bad = tmp_path / "r.toml"
    bad.write_text('[[rule]]\nid = "x"\nrole = "cause"\nclass = "bogus"\nkeywords = ["a"]\npattern = "a"\n')
    code, _, err = _cli(tmp_path, str(CORPUS / "real_raise_2" / "logs"), "--rules", str(bad))
    assert code == ExitCode.USER_ERROR and "class must be one of" in err


def test_users_extend_the_rules_with_their_own_file(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank2.log").write_text("2026-11-30 10:00:00,000 step 1 loss 2.0\n"
                                    "2026-11-30 10:00:01,000 MYAPP FATAL: shard index corrupt\n")
    before = triage([logs])  # no rule knows the line: at most the weak last-resort reading of its words
    assert not before.diagnosed or (before.confidence <= 0.2 and before.first_anomaly is not None
                                    and before.first_anomaly.rule == "lexical"), before.to_dict()
    rules = tmp_path / "mine.toml"
    rules.write_text('[[rule]]\nid = "myapp_shard"\nrole = "cause"\nclass = "storage"\npriority = 80\n'
                     'action = "restart_from_checkpoint"\nkeywords = ["MYAPP FATAL"]\n'
                     "pattern = 'MYAPP FATAL: shard index corrupt'\n")
    code, out, _ = _cli(tmp_path, str(logs), "--rules", str(rules), "--json")
    v = json.loads(out)
    assert code == ExitCode.DIAGNOSED and (v["class"], v["culprit"]["rank"], v["action"]) == (
        "storage", 2, "restart_from_checkpoint"), v
    assert v["first_anomaly"]["file"] == "rank2.log" and v["first_anomaly"]["line"] == 2


def test_json_output_carries_the_documented_fields(tmp_path: Path) -> None:
    code, out, _ = _cli(tmp_path, str(CORPUS / "real_hang_2" / "logs"), "--json")
    v = json.loads(out)
    assert code == ExitCode.DIAGNOSED
    for key in ("class", "culprit", "scope", "action", "first_anomaly", "evidence", "confidence"):
        assert key in v, f"missing {key}"
    assert set(v["culprit"]) >= {"rank", "node", "gpu"}
    fa = v["first_anomaly"]
    assert {"file", "line", "text", "time"} <= set(fa) and isinstance(fa["line"], int)
    assert (v["class"], v["culprit"]["rank"]) == ("hang", 1)


def test_run_directory_verdict_is_saved_into_its_report(tmp_path: Path) -> None:
    src = CORPUS / "syn_titan_run_guard_nonfinite" / "logs" / "run1"
    rd = tmp_path / "run1"
    shutil.copytree(src, rd)
    code, out, _ = _cli(tmp_path, str(rd))
    assert code == ExitCode.DIAGNOSED and "numerical" in out
    saved = json.loads((rd / "report" / "triage.json").read_text())
    assert saved["class"] == "numerical" and saved["culprit"]["rank"] == 1
    assert (rd / "report" / "triage.md").read_text().startswith("## Triage")


def test_window_excludes_errors_far_from_the_failure(tmp_path: Path) -> None:
    logs = tmp_path / "l"
    logs.mkdir()
    (logs / "rank0.log").write_text(
        "2026-11-30 10:00:00,000 [rank0] WARNING OSError: [Errno 5] Input/output error (retried, ok)\n"
        "2026-11-30 10:05:00,000 [rank0] INFO step 10 loss 2.0 step_time 0.1s\n"
        "2026-11-30 10:05:01,000 [rank0] ERROR KeyError: 'labels'\n")
    assert triage([logs], window_s=30).cls == "user_code"
    assert triage([logs], window_s=600).cls == "storage"  # with a 10 min window the old I/O error is earliest


@pytest.mark.timeout(60)
def test_parallel_scan_gives_the_same_verdict_as_serial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import titan.triage.pipeline as disc

    src = CORPUS / "syn_cuda_oom_64ranks_late_timeouts" / "logs"
    serial = triage([src]).to_dict()
    monkeypatch.setattr(disc, "PARALLEL_BYTES", 0)
    par = triage([src], jobs=2).to_dict()
    assert (par["class"], par["culprit"], par["action"]) == (serial["class"], serial["culprit"], serial["action"])


@pytest.mark.timeout(60)
def test_cli_subprocess_triages_without_importing_torch(tmp_path: Path) -> None:
    code = ("import sys; from titan.triage import triage; v = triage([sys.argv[1]]); "
            "assert 'torch' not in sys.modules, 'torch imported'; print(v.cls)")
    r = subprocess.run([sys.executable, "-c", code, str(CORPUS / "real_cgroup_oom_2" / "logs")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "oom", r.stderr
    titan = Path(sys.executable).with_name("titan")
    r = subprocess.run([str(titan), "triage", str(CORPUS / "real_nan_2" / "logs")], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "COLUMNS": "160"})
    assert r.returncode == int(ExitCode.DIAGNOSED), r.stderr
    assert "numerical" in r.stdout and "skip_step" in r.stdout


@pytest.mark.parametrize("line,expected", [
    ("[default1]:2026-11-30 13:25:55,667 [rank1] INFO step", "2026-11-30T13:25:55.667"),
    ("W1130 13:25:57.634000 7809 api.py:1] x", "2026-11-30T13:25:57.634"),
    ("[W1130 13:28:27.706465222 socket.cpp:764] [c10d] x", "2026-11-30T13:28:27.706"),
    ("Nov 30 13:25:57 node07 kernel: NVRM: Xid", "2026-11-30T13:25:57.000"),
    ("[Mon Nov 30 13:25:57 2026] NVRM: Xid", "2026-11-30T13:25:57.000"),
    ("2026-11-30T13:18:50,397940+00:00 kernel", "2026-11-30T13:18:50.397"),
    ("2026-11-30T14:18:50.5+01:00 x", "2026-11-30T13:18:50.500"),
    ("[  269.516977] NVRM: boot-relative", None),
    ("node1:123:456 [3] NCCL WARN x", None),
])
def test_timestamps_in_common_forms(line: str, expected: str | None) -> None:
    from titan.events import utc_iso

    t = parse_time(line, 2026)
    assert (utc_iso(t)[:23] if t is not None else None) == expected


def test_rank_and_host_hints() -> None:
    assert line_rank("[default1]:[rank5]: RuntimeError") == 5
    assert line_rank("3: Traceback") == 3
    assert line_rank("[Rank 7] Watchdog caught") == 7
    assert name_hints("node07/rank3.log") == (3, "node07")
    assert name_hints("x/attempt_0/4/stderr.log") == (4, None)
    assert name_hints("gpu-b07.dmesg.log") == (None, "gpu-b07")


def test_grep_prefilter_and_pure_python_scans_agree_on_the_corpus(monkeypatch: pytest.MonkeyPatch) -> None:
    import titan.triage.scan as scan

    dirs = sorted(p for p in CORPUS.iterdir() if (p / "expected.json").is_file())

    def key(v: dict) -> tuple:
        fa = v["first_anomaly"] or {}
        return (v["class"], v["culprit"], v["action"], fa.get("file"), fa.get("line"), fa.get("time"),
                [(e["file"], e["line"], e["time"]) for e in v["evidence"]])

    monkeypatch.setattr(scan, "GREP_MIN_BYTES", 1 << 60)
    py = {d.name: key(triage([d / "logs"]).to_dict()) for d in dirs}
    if scan._GREP is None:
        pytest.skip("no grep binary")
    monkeypatch.setattr(scan, "GREP_MIN_BYTES", 0)
    diff = [d.name for d in dirs if key(triage([d / "logs"]).to_dict()) != py[d.name]]
    assert not diff, f"grep and Python scans disagree on {diff}"


def _big_logs(root: Path, n: int) -> list[Path]:
    """``n`` text logs over the grep threshold, one with a traceback, names with a space and a colon."""
    import titan.triage.scan as scan

    filler = "".join(f"2026-11-30 08:00:{i % 60:02d},000 [rank{{r}}] INFO step {i} loss 2.{i % 10} NCCL INFO ok\n"
                     for i in range(scan.GREP_MIN_BYTES // 60 + 10))
    paths = []
    for r in range(n):
        p = root / (f"node 0{r}" if r % 2 else f"node:0{r}") / f"rank{r}.log"
        p.parent.mkdir(parents=True)
        tail = (f"[rank{r}]: Traceback (most recent call last):\n[rank{r}]:   File \"t.py\", line 1\n"
                f"[rank{r}]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.\n") if r == n - 2 else ""
        p.write_text(filler.replace("{r}", str(r)) + tail)
        paths.append(p)
    return paths


def test_one_grep_for_many_files_reads_what_a_grep_per_file_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The batched prefilter (grep -H -Z over many files, streamed per file) gives the per-file scan's findings."""
    import titan.triage.grepfilter as grepfilter
    import titan.triage.pipeline as pipeline

    if grepfilter.GREP is None:
        pytest.skip("no grep binary")
    _big_logs(tmp_path, 5)
    monkeypatch.setattr(grepfilter, "GREP_BATCH", 2)  # several batches, a file without hits at a batch edge
    batched = triage([tmp_path]).to_dict()
    monkeypatch.setattr(pipeline, "_grep_batchable", lambda p: False)  # every file its own grep
    single = triage([tmp_path]).to_dict()
    assert batched["culprit"]["rank"] == 3 and batched["class"] == "oom", batched["reason"]
    assert (batched["first_anomaly"], batched["evidence"], batched["inputs"]) == (
        single["first_anomaly"], single["evidence"], single["inputs"])


def test_a_batch_grep_that_fails_is_rescanned_file_by_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import titan.triage.grepfilter as grepfilter
    import titan.triage.pipeline as pipeline

    if grepfilter.GREP is None:
        pytest.skip("no grep binary")
    paths = _big_logs(tmp_path, 4)
    want = triage([tmp_path]).to_dict()
    # a file that vanishes after the batch was formed: grep reports it (exit 2) after the others' output
    rules = pipeline.load_rules()
    got = []
    with pytest.raises(grepfilter.GrepFailed) as ei:
        for i, hits in grepfilter.grep_many([paths[2], tmp_path / "gone.log", paths[1]], rules):
            got.append((i, len(list(hits))))
    assert [i for i, _ in got] == [0, 1, 2] and got[1][1] == 0 and got[0][1] > 0, got
    assert (ei.value.start, ei.value.end) == (0, 3)
    real = grepfilter.grep_many

    def failing(ps, rs):  # the first batch's grep fails after yielding everything
        yield from real(ps, rs)
        raise grepfilter.GrepFailed(0, len(ps))

    monkeypatch.setattr(pipeline, "grep_many", failing)
    again = triage([tmp_path]).to_dict()
    assert (again["first_anomaly"], again["evidence"], again["culprit"]) == (
        want["first_anomaly"], want["evidence"], want["culprit"])


@pytest.mark.parametrize("ending", ["hit_unterminated", "hit_then_lines", "no_hit", "hit_terminated"])
def test_the_grep_scan_counts_the_lines_the_python_scan_counts(ending: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The grep path counts only the lines after its last hit; the total must equal a full count."""
    import titan.triage.scan as scan
    from titan.triage.rules import load_rules

    if scan._GREP is None:
        pytest.skip("no grep binary")
    oom = "torch.OutOfMemoryError: CUDA out of memory."
    body = "".join(f"step {i} loss 2.0\n" for i in range(500))
    text = {"hit_unterminated": body + oom, "hit_then_lines": body + oom + "\n" + body + "last",
            "no_hit": body + "end", "hit_terminated": body + oom + "\n"}[ending]
    p = tmp_path / "a.log"
    p.write_text(text)
    rules = load_rules()
    counts = {}
    for label, threshold in (("python", 1 << 60), ("grep", 0)):
        monkeypatch.setattr(scan, "GREP_MIN_BYTES", threshold)
        r = scan.scan_text_file(p, "a.log", 0, rules, 2026)
        counts[label] = (r.lines, r.size, [(f.rule, f.line) for f in r.findings], [x.line for x in r.progress][-3:])
    assert counts["grep"] == counts["python"], counts
