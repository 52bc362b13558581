"""`--help`: the exit-code table once in `titan --help`, per verb only the codes it can return;
every flag has help text; README lists every exit code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from titan.cli.environment import Environment
from titan.cli.main import VERBS, build_parser, run
from titan.exitcodes import ExitCode

ROOT = Path(__file__).parents[2]


def _help(tmp_path: Path, *argv: str) -> str:
    env = Environment.captured(tmp_path)
    code = run([*argv, "--help"], env)
    assert code == ExitCode.SUCCEEDED, f"`titan {' '.join(argv)} --help` exited {code}: {env.stderr.getvalue()}"
    assert env.stderr.getvalue() == "", env.stderr.getvalue()
    return env.stdout.getvalue()


def _listed(text: str) -> list[int]:
    block = text.split("exit codes", 1)[1]
    return [int(m.group(1)) for m in re.finditer(r"^\s+(\d+)  \S", block, re.M)]


def test_titan_help_lists_the_whole_table_once(tmp_path: Path) -> None:
    out = _help(tmp_path)
    assert _listed(out) == [int(c) for c in ExitCode], out
    assert out.count("exit codes") == 1


@pytest.mark.parametrize("verb", VERBS)
def test_each_verb_lists_only_the_codes_it_can_return(tmp_path: Path, verb: str) -> None:
    import importlib

    mod = importlib.import_module(f"titan.cli.cmd_{verb}")
    out = _help(tmp_path, verb)
    assert _listed(out) == [int(c) for c in mod.EXIT_CODES], f"titan {verb} --help:\n{out}"
    assert ExitCode.USER_ERROR in mod.EXIT_CODES, f"every verb can refuse bad input (exit 2): {verb}"
    assert len(mod.EXIT_CODES) < len(ExitCode), f"titan {verb} --help repeats the whole table"


def test_every_flag_has_help_text() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "verb")
    bare = [f"titan {verb} {max(a.option_strings, key=len)}" for verb, p in sub.choices.items()
            for a in p._actions if a.option_strings and not a.help]
    assert not bare, f"flags without help text: {bare}"


def test_triage_is_for_any_job_not_only_failed_ones(tmp_path: Path) -> None:
    out = _help(tmp_path)
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("triage"))
    assert "diagnose a job" in line and "failed job" not in line, line


def test_readme_lists_every_exit_code() -> None:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    missing = [int(c) for c in ExitCode if not re.search(rf"(?<![\d/]){int(c)}(?![\d])", section)]
    assert not missing, f"README's exit-code list lacks {missing}"
