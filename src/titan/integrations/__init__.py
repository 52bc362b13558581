"""Titan inside the frameworks people already train with — each an optional extra of
``titan-resilience``:

* ``titan.integrations.transformers`` (``[transformers]``): ``TitanCallback`` for the
  Hugging Face ``Trainer``;
* ``titan.integrations.lightning`` (``[lightning]``): ``TitanCallback`` and
  ``TitanCheckpointIO`` for PyTorch Lightning;
* ``titan.integrations.accelerate`` (``[accelerate]``): ``TitanAccelerate`` for a loop over
  an ``Accelerator``.

Each gives the step guard before the all-reduce (culprit rank named, the step skipped on
every rank), progress beacons for hang detection, events in the run directory and verified
checkpoints with exact resume. Import the submodule you need (importing this package
imports no framework). What each covers and does not: ``docs/integrations.md``.
"""

__all__: list[str] = []
