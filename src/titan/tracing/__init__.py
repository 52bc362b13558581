"""Step-phase tracing with OpenTelemetry (optional extra), and log-shipping mappings."""

from __future__ import annotations

from titan.tracing.shipping import to_elasticsearch, to_loki
from titan.tracing.tracer import JsonFileSpanExporter, StepTracer, tracing_unavailable_reason

__all__ = ["JsonFileSpanExporter", "StepTracer", "to_elasticsearch", "to_loki", "tracing_unavailable_reason"]
