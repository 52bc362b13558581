"""``titan run``: a thin layer over ``torch.distributed.run`` (torchelastic).

Creates the run directory and ``run.json``, hands workers their Titan context, records
launcher events (``launcher.*``, ``worker.failed``) and maps the outcome onto
``titan.exitcodes.ExitCode``. ``request_abort`` is the one way for any component to stop
a job without a restart (see ``titan.events.abort``).
"""

from __future__ import annotations

from titan.events.abort import abort_file, read_abort, request_abort
from titan.launch.options import Entrypoint, LaunchOptions, parse_entrypoint
from titan.launch.runner import LaunchResult, launch, prepare

__all__ = [
    "Entrypoint", "LaunchOptions", "LaunchResult", "abort_file", "launch", "parse_entrypoint", "prepare",
    "read_abort", "request_abort",
]
