"""``make``'s install steps are quiet: the optional native chaos extra, when it cannot
build (no libnetfilter-queue-dev), prints one line with the reason, not the compiler's
output; a required step that fails still shows what went wrong."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(300)


def _broken_native_package(root: Path) -> Path:
    """A real C extension that cannot compile: a missing header, then 40 more errors."""
    pkg = root / "brokenext"
    pkg.mkdir()
    (pkg / "setup.py").write_text(
        "from setuptools import Extension, setup\n"
        "setup(name='brokenext', version='0.0', ext_modules=[Extension('brokenext', ['b.c'])])\n")
    body = "\n".join(f"int f{i}(void) {{ return undeclared_{i}; }}" for i in range(40))
    (pkg / "b.c").write_text("#include <titan_test_missing/nfq.h>\n" + body + "\n")
    return pkg


def test_make_chaos_extra_prints_one_line_with_the_reason(tmp_path):
    pkg = _broken_native_package(tmp_path)
    venv = ROOT / ".venv" if (ROOT / ".venv" / "bin" / "pip").exists() else Path(sys.prefix)
    log = venv / "install-chaos.log"
    before = log.read_text() if log.exists() else None
    try:
        p = subprocess.run(["make", "-s", "--no-print-directory", "chaos-extra", f"VENV={venv}",
                            f"CHAOS_EXTRA=--no-build-isolation --no-deps {pkg}"],
                           cwd=ROOT, capture_output=True, text=True, timeout=240,
                           env={**os.environ, "MAKEFLAGS": ""})
        out = (p.stdout + p.stderr).strip().splitlines()
        assert p.returncode == 0, f"an optional extra must not fail make; exit {p.returncode}: {out[-20:]}"
        assert len(out) == 1, f"expected one line, seen {len(out)}:\n" + "\n".join(out[:60])
        assert "titan_test_missing/nfq.h: No such file or directory" in out[0], out[0]
        assert "chaos extra" in out[0] and str(log) in out[0], out[0]
        assert "fatal error" in log.read_text(), "the compiler's output belongs in the log"
    finally:
        if before is not None:
            log.write_text(before)
        elif log.exists():
            log.unlink()


def test_quiet_required_step_fails_loudly_with_the_log_tail(tmp_path):
    log = tmp_path / "x.log"
    p = subprocess.run(["sh", str(ROOT / "scripts" / "quiet_install.sh"), str(log), "required", "thing", "--",
                        "sh", "-c", "echo working; echo 'ERROR: no matching distribution' >&2; exit 3"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 3, f"a required step's failure must fail make, seen exit {p.returncode}"
    assert "installing thing failed (exit 3)" in p.stderr and "ERROR: no matching distribution" in p.stderr, p.stderr


def test_quiet_step_prints_nothing_when_it_works(tmp_path):
    p = subprocess.run(["sh", str(ROOT / "scripts" / "quiet_install.sh"), str(tmp_path / "ok.log"), "optional",
                        "thing", "--", "sh", "-c", "echo lots of pip chatter; echo WARNING: x >&2"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stdout == "" and p.stderr == "", (p.stdout, p.stderr)
    assert "lots of pip chatter" in (tmp_path / "ok.log").read_text()
