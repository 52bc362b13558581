"""The integrations' tests need the real frameworks. A developer without them gets a skip
with the reason; under ``CI=true`` a missing framework is a failure (``.ci/run`` installs
them with ``make frameworks FRAMEWORKS=required``)."""

from __future__ import annotations

import importlib
import os

import pytest

#: No download may happen: the models are built by the scripts, nothing comes from a hub.
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def need(module: str) -> None:
    """Import ``module`` or skip (fail under CI=true) saying how to install it."""
    try:
        importlib.import_module(module)
    except ImportError as e:
        msg = f"{module} is not installed ({e}); `make frameworks` installs the integrations' frameworks"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI=true: " + msg)
        pytest.skip(msg)
