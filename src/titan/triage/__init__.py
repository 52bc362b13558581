"""``titan.triage``: from a failed job's logs to the first anomaly, its fault domain, class and action.

Entry point: ``triage(paths) -> Verdict``. Inputs are a Titan run directory and/or raw logs
of any job (torchrun, NCCL, tracebacks, kernel logs, nvidia-smi, Slurm, progress lines).
Rules are data (``rules.toml``; users add files with ``rule_files=``). Never imports torch.
See docs/triage.md for the method and the decision table.
"""

from titan.triage.pipeline import discover, triage
from titan.triage.model import ACTIONS, CLASSES, ROLES, SCOPES, Finding, Verdict
from titan.triage.rules import Rule, RuleSet, load_rules

__all__ = ["triage", "discover", "Verdict", "Finding", "Rule", "RuleSet", "load_rules", "CLASSES", "ACTIONS",
           "SCOPES", "ROLES"]
