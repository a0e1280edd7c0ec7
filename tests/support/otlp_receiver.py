"""A real loopback OTLP/HTTP trace receiver: what a collector's ``otlp`` receiver serves
on ``POST /v1/traces`` (protobuf ``ExportTraceServiceRequest``, gzip or not), decoded with
the protocol's own messages and kept as plain spans for tests to read."""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

TRACES_PATH = "/v1/traces"


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span: ids as hex, attributes as Python values."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    status_code: int
    resource: dict[str, Any]
    scope: str


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def decode_spans(body: bytes) -> list[ReceivedSpan]:
    """Every span of one ``ExportTraceServiceRequest``."""
    request = ExportTraceServiceRequest.FromString(body)
    return [ReceivedSpan(span.name, span.trace_id.hex(), span.span_id.hex(),
                         span.parent_span_id.hex(), span.kind, _attributes(span.attributes),
                         span.status.code, _attributes(resource_spans.resource.attributes),
                         scope_spans.scope.name)
            for resource_spans in request.resource_spans
            for scope_spans in resource_spans.scope_spans
            for span in scope_spans.spans]


class OTLPReceiver:
    """Serves ``POST /v1/traces`` on 127.0.0.1; ``endpoint`` is the base URL the
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` variable takes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self.requests = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def wait_for_spans(self, name: str, count: int, timeout_s: float) -> list[ReceivedSpan]:
        """The spans received so far once ``count`` of them are called ``name``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            spans = self.spans
            if sum(span.name == name for span in spans) >= count:
                return spans
            time.sleep(0.1)
        raise TimeoutError(f"fewer than {count} {name!r} spans after {timeout_s}s: "
                           f"{sorted({span.name for span in self.spans})}")

    def _receive(self, body: bytes) -> None:
        spans = decode_spans(body)
        with self._lock:
            self.requests += 1
            self._spans.extend(spans)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != TRACES_PATH:
                    self.send_error(404)
                    return
                receiver._receive(body)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        return Handler

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()
