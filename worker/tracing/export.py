"""OpenTelemetry for one process: a ``TracerProvider`` whose batch processor exports over
OTLP/HTTP, Celery's instrumentation (a task's span, continued from the producer's context
in the message headers, parents the job's), and the opener ``spans.py`` routes to.

Imported only when ``spans.is_tracing_configured``: in each pool child after the fork
(the processor's thread must be the child's own). The SDK and the exporter read the
other standard variables themselves (headers, timeout, compression, sampler, batch
delays, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from worker.tracing.spans import Attributes, SpanNotes, install_opener

DEFAULT_SERVICE_NAME = "compactor-worker"
TRACER_NAME = "compactor"

_provider: TracerProvider | None = None


class _Notes:
    """An SDK span as ``SpanNotes``."""

    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def is_recording(self) -> bool:
        return self._span.is_recording()

    def note(self, attributes: Attributes) -> None:
        self._span.set_attributes(attributes)

    def fail(self, error_type: str) -> None:
        self._span.set_attribute("error.type", error_type)
        self._span.set_status(trace.Status(trace.StatusCode.ERROR, error_type))


class _Opener:
    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    @contextmanager
    def open(self, name: str, attributes: Attributes, *, client: bool,
             expected: tuple[type[BaseException], ...]) -> Iterator[SpanNotes]:
        kind = trace.SpanKind.CLIENT if client else trace.SpanKind.INTERNAL
        # An exception's text may quote a provider's reply: only its class is recorded.
        with self._tracer.start_as_current_span(name, kind=kind, attributes=attributes,
                                                record_exception=False,
                                                set_status_on_exception=False) as span:
            notes = _Notes(span)
            try:
                yield notes
            except expected:
                raise
            except BaseException as exc:
                notes.fail(type(exc).__name__)
                raise


def service_resource() -> Resource:
    """The SDK's resource from the environment, named ``compactor-worker`` unless
    ``OTEL_SERVICE_NAME`` or ``OTEL_RESOURCE_ATTRIBUTES`` names it."""
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource


def start_tracing() -> None:
    """Set this process's tracer provider, instrument Celery and route the job's spans."""
    global _provider
    if _provider is not None:
        return
    _provider = TracerProvider(resource=service_resource())
    _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(_provider)
    # The instrumentation ships no types.
    CeleryInstrumentor().instrument(tracer_provider=_provider)  # type: ignore[no-untyped-call]
    install_opener(_Opener(_provider.get_tracer(TRACER_NAME)))


def stop_tracing() -> None:
    """Export what is still queued, then stop the processor (a pool child's exit skips
    ``atexit``, where the SDK would)."""
    global _provider
    if _provider is None:
        return
    install_opener(None)
    _provider.shutdown()  # flushes first
    _provider = None
