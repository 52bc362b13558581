"""SLA accounting: goodput and badput by named cause, RTO/RPO, job success, and ``titan plan``.

* ``account_run(run_dir)`` → ``Accounting`` (buckets partitioning wall time, incidents).
* ``summarize_runs([...])`` → job success rate and uninterrupted-run lengths.
* ``plan(PlanInput(...))`` → interruptions/day, Young/Daly interval, expected goodput
  (closed form + Monte-Carlo).

Imports only the event spine (and numpy for the simulation).
"""

from __future__ import annotations

from titan.sla.accounting import BUCKET_DOC, BUCKETS, Accounting, account, account_run
from titan.sla.fleetdata import DEFAULT_FLEET, FLEETS, FleetData, fleet
from titan.sla.incidents import Incident
from titan.sla.measured import measured_costs
from titan.sla.plan import PlanInput, PlanResult, daly_interval, goodput_exact, plan, young_interval
from titan.sla.runs import summarize_runs, uninterrupted_stretches

__all__ = [
    "Accounting", "BUCKETS", "BUCKET_DOC", "DEFAULT_FLEET", "FLEETS", "FleetData", "Incident", "PlanInput",
    "PlanResult", "account", "account_run", "daly_interval", "fleet", "goodput_exact", "measured_costs", "plan",
    "summarize_runs", "uninterrupted_stretches", "young_interval",
]
