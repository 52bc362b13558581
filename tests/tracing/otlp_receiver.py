"""A small OTLP/HTTP trace receiver for tests: decodes protobuf with opentelemetry-proto."""

from __future__ import annotations

import http.server
import threading
from typing import Any


class OTLPReceiver:
    """``with OTLPReceiver() as r: ... r.spans`` — every span received, as plain dicts."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.requests = 0
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
                    ExportTraceServiceRequest, ExportTraceServiceResponse)

                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                receiver.requests += 1
                for rs in req.resource_spans:
                    res = {a.key: _val(a.value) for a in rs.resource.attributes}
                    for ss in rs.scope_spans:
                        for sp in ss.spans:
                            receiver.spans.append({
                                "name": sp.name, "trace_id": sp.trace_id.hex(), "span_id": sp.span_id.hex(),
                                "parent_span_id": sp.parent_span_id.hex() or None,
                                "start": sp.start_time_unix_nano, "end": sp.end_time_unix_nano,
                                "attributes": {a.key: _val(a.value) for a in sp.attributes}, "resource": res})
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "OTLPReceiver":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def _val(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None
