"""User mistakes in tinygpt's flags: one line plus a hint, exit 2, no traceback, no run started."""

from __future__ import annotations

from pathlib import Path

import pytest

from titan.workloads.tinygpt.train import main


@pytest.mark.parametrize("argv,expected", [
    (["--width", "100", "--heads", "3"], "invalid model shape: d_model (100) must be divisible by n_head (3)"),
    (["--set", "nope.x=1"], "unknown settings section 'nope'"),
    (["--set", "dist"], "--set expects SECTION.FIELD=VALUE"),
    (["--dropout", "1.5"], "--dropout must be within [0, 1)"),
])
def test_bad_flags_exit_2_with_one_line(argv: list[str], expected: str, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TITAN_RUN_DIR", str(tmp_path / "run"))
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    assert code == 2, f"expected exit 2, got {code}: {err}"
    assert expected in err and "Traceback" not in err, f"expected {expected!r} in one line, saw:\n{err}"
    assert not (tmp_path / "run").exists(), "a rejected command must not create the run directory"
