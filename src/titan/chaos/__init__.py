"""Fault injection (``titan.chaos``): drills that break a run on purpose and check recovery.

One drill engine: ``run_plan_drill(PlanDrill(plan=Plan()…))`` injects every kind of fault
(in-process, OS-level, network between namespace nodes) and ``judge`` gives one verdict per
fault (docs/chaos.md). ``run_drill`` is its kill preset: one worker SIGKILLed by PID after a
checkpoint, and training resumes from it with exactly the lost steps recomputed.
"""

from __future__ import annotations

from titan.chaos.drill import DrillConfig, DrillReport, analyse, chaos_file, run_drill
from titan.chaos.drills import PlanDrill, PlanReport, run_plan_drill
from titan.chaos.plan import FaultSpec, Plan
from titan.events.tail import EventTail
from titan.chaos.verdict import FaultVerdict, judge

__all__ = ["DrillConfig", "DrillReport", "EventTail", "FaultSpec", "FaultVerdict", "Plan", "PlanDrill", "PlanReport",
           "analyse", "chaos_file", "judge", "run_drill", "run_plan_drill"]
