"""Settings of step-phase tracing (OpenTelemetry) — off by default."""

from __future__ import annotations

import dataclasses

from titan.settings.core import register_section, require

__all__ = ["TracingConfig"]


@register_section("tracing")
@dataclasses.dataclass(frozen=True, kw_only=True)
class TracingConfig:
    """``exporter``: ``file`` (``RUN_DIR/traces/<node>.rank<k>.attempt<n>.jsonl``) or ``otlp``
    (OTLP/HTTP protobuf to ``endpoint``). ``sample_ratio`` is the share of steps traced
    (a step and all its phase and bucket spans are kept or dropped together)."""

    enabled: bool = False
    exporter: str = "file"
    endpoint: str = "http://127.0.0.1:4318/v1/traces"
    sample_ratio: float = 0.01
    service_name: str = "titan-training"

    def __post_init__(self) -> None:
        require(self.exporter in ("file", "otlp"), f"unknown tracing exporter {self.exporter!r}", "use file or otlp")
        require(0.0 <= self.sample_ratio <= 1.0, "tracing.sample_ratio must be within [0, 1]",
                "e.g. 0.01 traces one step in a hundred")
        require(self.endpoint.startswith(("http://", "https://")), "tracing.endpoint must be an http(s) URL",
                "e.g. http://collector:4318/v1/traces")
