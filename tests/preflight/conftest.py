"""Fixtures of the preflight tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def fake_package(tmp_path):
    """A folder that makes ``importlib.metadata`` report accelerate 9.9.9 (a faked version)."""
    d = tmp_path / "fakepkgs"
    info = d / "accelerate-9.9.9.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: accelerate\nVersion: 9.9.9\n")
    return d
