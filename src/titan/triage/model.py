"""The data triage works on: findings (one interesting line each) and the verdict."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["CLASSES", "ACTIONS", "SCOPES", "ROLES", "Finding", "Verdict", "DEFAULT_ACTION", "DEFAULT_SCOPE"]

#: Failure classes (fixed by the issue; boundaries in docs/triage.md).
CLASSES: tuple[str, ...] = ("gpu_hardware", "numerical", "hang", "comm_error", "network", "storage", "oom",
                            "launcher", "user_code")
#: Recovery actions.
ACTIONS: tuple[str, ...] = ("skip_step", "restart_from_checkpoint", "exclude_node_and_restart",
                            "fix_code_or_config", "retry")
#: Impact scopes.
SCOPES: tuple[str, ...] = ("process", "node", "job")
#: What a finding means for the method:
#:  cause     – can be the first anomaly that explains a failure (an Xid, a CUDA OOM, ENOSPC…)
#:  timeout   – a collective/watchdog timeout: the job is stuck; the culprit is whoever is absent
#:  symptom   – a consequence of a failure elsewhere (peer closed the connection, SIGTERM from the agent)
#:  exit      – a process ended (exit code or signal); dates the failure
#:  precursor – a warning sign (throughput drop, loss spike, correctable errors); evidence only
#:  lifecycle – a sign that a job ran (init, a rank announcing itself) or finished normally
ROLES: tuple[str, ...] = ("cause", "timeout", "symptom", "exit", "precursor", "lifecycle")

#: the action when the evidence says nothing more specific (labelling conventions, docs/triage.md):
#: a hang, a communication-library error, a launcher error and a failed write are code- or
#: config-level until the evidence shows them transient; hardware is excluded; one numerical
#: glitch is skipped.
DEFAULT_ACTION: dict[str, str] = {
    "gpu_hardware": "exclude_node_and_restart",
    "numerical": "skip_step",
    "hang": "fix_code_or_config",
    "comm_error": "fix_code_or_config",
    "network": "exclude_node_and_restart",
    "storage": "fix_code_or_config",
    "oom": "fix_code_or_config",
    "launcher": "fix_code_or_config",
    "user_code": "fix_code_or_config",
}
DEFAULT_SCOPE: dict[str, str] = {
    "gpu_hardware": "node", "numerical": "job", "hang": "job", "comm_error": "job", "network": "node",
    "storage": "node", "oom": "process", "launcher": "job", "user_code": "job",
}


@dataclasses.dataclass(slots=True)
class Finding:
    """One line (or event) that a rule recognised.

    ``t`` is UNIX time after clock correction, or ``None`` when the source has no usable
    time; ``t_inherited`` marks a time taken from the nearest earlier timestamped line of
    the same file (a lower bound). ``order`` is (file index, line) and breaks ties.
    """

    rule: str
    role: str
    cls: str | None
    file: str
    line: int
    text: str
    t: float | None = None
    t_inherited: bool = False
    rank: int | None = None
    node: str | None = None
    gpu: str | None = None
    pid: int | None = None
    action: str | None = None
    scope: str | None = None
    priority: int = 50
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    order: tuple[int, int] = (0, 0)

    def ref(self) -> dict[str, Any]:
        """The JSON form used for ``first_anomaly`` and ``evidence``."""
        from titan.events import utc_iso

        return {"file": self.file, "line": self.line, "text": self.text[:500],
                "time": utc_iso(self.t) if self.t is not None else None, "rule": self.rule,
                "role": self.role, "class": self.cls, "rank": self.rank, "node": self.node, "gpu": self.gpu}


@dataclasses.dataclass
class Verdict:
    """The outcome of triage. ``cls`` is ``None`` when nothing explains the failure."""

    cls: str | None
    culprit: dict[str, Any]
    scope: str | None
    action: str | None
    first_anomaly: Finding | None
    evidence: list[Finding]
    confidence: float
    reason: str
    failure_time: float | None = None
    window_s: float = 30.0
    inputs: dict[str, Any] = dataclasses.field(default_factory=dict)
    problems: list[str] = dataclasses.field(default_factory=list)
    #: the reasoning, one line per step: first anomaly → domain → scope → action
    steps: list[str] = dataclasses.field(default_factory=list)
    #: other explanations the evidence allows (for "no diagnosis": the nearest candidates)
    candidates: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: "failed" (a failure to explain) or "succeeded" (a Titan run whose run.json says it succeeded)
    outcome: str = "failed"
    #: a succeeded run: the incidents it went through and handled, costliest first
    incidents: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def diagnosed(self) -> bool:
        return self.cls is not None

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON shape (``titan triage --json``)."""
        from titan.events import utc_iso

        return {
            "diagnosed": self.diagnosed, "class": self.cls, "culprit": self.culprit, "scope": self.scope,
            "action": self.action, "confidence": round(self.confidence, 2), "reason": self.reason,
            "first_anomaly": self.first_anomaly.ref() if self.first_anomaly else None,
            "evidence": [f.ref() for f in self.evidence],
            "failure_time": utc_iso(self.failure_time) if self.failure_time is not None else None,
            "window_s": self.window_s, "steps": self.steps, "candidates": self.candidates,
            "outcome": self.outcome, "incidents": self.incidents,
            "inputs": self.inputs, "problems": self.problems,
        }
