"""Spans per step, per phase and per DDP bucket, through the OpenTelemetry SDK.

The training loop reports transitions (``step_begin``/``phase_enter``/``phase_exit``/
``step_end``) — the beacon calls them when a tracer is installed, so one set of phase marks
serves the hang watchdog and tracing. Communication spans run from a DDP comm hook's call to
its future's completion, as children of ``backward`` (communication overlaps backward).

Cost when disabled or not sampled: one attribute check per transition. The SDK is an
optional extra (``pip install titan-resilience[otel]``); without it tracing reports itself unavailable.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from titan.settings.tracing import TracingConfig
    from titan.worker.context import WorkerContext

__all__ = ["StepTracer", "JsonFileSpanExporter", "tracing_unavailable_reason"]

log = logging.getLogger(__name__)


def tracing_unavailable_reason() -> str | None:
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as e:
        return f"OpenTelemetry SDK not installed ({e}); pip install 'titan-resilience[otel]'"
    return None


class JsonFileSpanExporter:
    """Writes finished spans as OTLP-JSON-like lines (one span per line) to a file."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()

    def export(self, spans: Any) -> Any:
        import json

        from opentelemetry.sdk.trace.export import SpanExportResult

        lines = []
        for s in spans:
            lines.append(json.dumps({
                "name": s.name, "trace_id": f"{s.context.trace_id:032x}", "span_id": f"{s.context.span_id:016x}",
                "parent_span_id": f"{s.parent.span_id:016x}" if s.parent else None,
                "start_unix_nano": s.start_time, "end_unix_nano": s.end_time,
                "attributes": dict(s.attributes or {}),
                "resource": dict(s.resource.attributes) if s.resource else {},
            }, default=str))
        with self._lock:
            os.write(self._fd, ("\n".join(lines) + "\n").encode())
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        os.close(self._fd)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


class StepTracer:
    """One per worker. ``enabled`` is False when off, unavailable, or misconfigured."""

    def __init__(self, ctx: "WorkerContext", cfg: "TracingConfig") -> None:
        self.enabled = False
        self._ctx = ctx
        self._step_span: Any = None
        self._phase_spans: list[Any] = []
        self._backward: Any = None
        if not cfg.enabled:
            return
        reason = tracing_unavailable_reason()
        if reason:
            ctx.events.emit("tracing.unavailable", reason, level="warning")
            return
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

        resource = Resource.create({"service.name": cfg.service_name, "titan.run": ctx.run_dir.run_id,
                                    "titan.node": ctx.node, "titan.rank": ctx.rank, "titan.attempt": ctx.attempt})
        self._provider = TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(cfg.sample_ratio)))
        if cfg.exporter == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter: Any = OTLPSpanExporter(endpoint=cfg.endpoint, timeout=5)
            where = cfg.endpoint
        else:
            path = ctx.run_dir.path / "traces" / f"{ctx.node}.rank{ctx.rank}.attempt{ctx.attempt}.jsonl"
            exporter = JsonFileSpanExporter(path)
            where = str(path)
        # Export off the training thread; a slow collector drops spans, never stalls a step.
        self._provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=1000))
        self._tracer = self._provider.get_tracer("titan.tracing")
        self._trace = trace
        self.enabled = True
        ctx.events.emit("tracing.started", f"tracing to {where} (sample ratio {cfg.sample_ratio:g})",
                        data={"exporter": cfg.exporter, "where": where, "sample_ratio": cfg.sample_ratio})

    def _attrs(self, step: int | None) -> dict[str, Any]:
        return {"titan.rank": self._ctx.rank, "titan.node": self._ctx.node, "titan.step": step if step is not None else -1,
                "titan.attempt": self._ctx.attempt}

    def step_begin(self, step: int) -> None:
        if not self.enabled:
            return
        self.step_end(step - 1)  # a step left open by a rollback or an exception
        self._step_span = self._tracer.start_span("step", attributes=self._attrs(step))
        self._step_no = step

    def step_end(self, step: int) -> None:
        if not self.enabled or self._step_span is None:
            return
        while self._phase_spans:
            self._phase_spans.pop().end()
        self._step_span.end()
        self._step_span = None
        self._backward = None

    def phase_enter(self, name: str) -> None:
        if not self.enabled or self._step_span is None or not self._step_span.is_recording():
            return
        parent = self._phase_spans[-1] if self._phase_spans else self._step_span
        span = self._tracer.start_span(name, context=self._trace.set_span_in_context(parent),
                                       attributes=self._attrs(self._step_no))
        self._phase_spans.append(span)
        if name == "backward":
            self._backward = span

    def phase_exit(self, name: str) -> None:
        if not self._phase_spans:
            return
        span = self._phase_spans.pop()
        span.end()

    def wrap_comm_hook(self, hook: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        """Wrap a DDP comm hook so each bucket's communication is a span under ``backward``."""
        if not self.enabled:
            return hook

        def traced(state: Any, bucket: Any) -> Any:
            parent = self._backward
            if parent is None or not parent.is_recording():
                return hook(state, bucket)
            span = self._tracer.start_span("comm.bucket", context=self._trace.set_span_in_context(parent),
                                           attributes={**self._attrs(self._step_no), "titan.bucket": bucket.index(),
                                                       "titan.bytes": bucket.buffer().numel() * bucket.buffer().element_size()})
            fut = hook(state, bucket)

            def done(f: Any) -> Any:
                span.end()
                return f.value()

            return fut.then(done)

        return traced

    def close(self) -> None:
        if not self.enabled:
            return
        self.step_end(-1)
        self._provider.shutdown()  # flushes the batch processor
        self.enabled = False
