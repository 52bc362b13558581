"""SLA accounting: goodput and badput by named cause, RTO/RPO, job success, and ``titan plan``.

* ``account_run(run_dir)`` → ``Accounting`` (buckets partitioning wall time, incidents);
  ``run_figures(acc)`` → the headline figures the report and the drill both print.
* ``summarize_runs([...])`` → job success rate and uninterrupted-run lengths.
* ``plan(PlanInput(...))`` → interruptions/day, Young/Daly interval, expected goodput
  (closed form + Monte-Carlo).

Imports only the event spine (and numpy for the simulation).
"""

from __future__ import annotations

from titan.sla.accounting import BUCKET_DOC, BUCKETS, Accounting, account, account_run
from titan.sla.figures import RunFigures, incident_in_window, run_figures
from titan.sla.fleetdata import DEFAULT_FLEET, FLEETS, FleetData, fleet
from titan.sla.incidents import Incident
from titan.sla.measured import measured_costs
from titan.sla.plan import PlanInput, PlanResult, daly_interval, goodput_exact, plan, young_interval
from titan.sla.runs import summarize_runs, uninterrupted_stretches

__all__ = [
    "Accounting", "BUCKETS", "BUCKET_DOC", "DEFAULT_FLEET", "FLEETS", "FleetData", "Incident", "PlanInput",
    "PlanResult", "RunFigures", "account", "account_run", "daly_interval", "fleet", "goodput_exact",
    "incident_in_window", "measured_costs", "plan", "run_figures", "summarize_runs", "uninterrupted_stretches",
    "young_interval",
]
