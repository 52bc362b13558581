"""Shared setup of the checkpoint tests."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the _ckpt_* helpers


@pytest.fixture(autouse=True)
def _quiet_single_process_dcp():
    # Titan filters this DCP notice at import; pytest resets filters per test.
    warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled", category=UserWarning)
    yield
