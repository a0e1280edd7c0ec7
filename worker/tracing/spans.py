"""The spans a job opens: the job, each step, each LLM call. No-ops until
``worker.tracing.export`` installs a tracer; this module imports nothing of OpenTelemetry,
so a process that never traces never loads it."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

# What OpenTelemetry takes as an attribute value.
AttributeValue = str | bool | int | float | Sequence[str] | Sequence[int] | Sequence[float]
Attributes = Mapping[str, AttributeValue]

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


class SpanNotes(Protocol):
    """What a caller writes on its open span."""

    def is_recording(self) -> bool: ...

    def note(self, attributes: Attributes) -> None:
        """Add attributes known only once the work is done."""

    def fail(self, error_type: str) -> None:
        """Mark the span failed, naming the error's kind (never its text)."""


class SpanOpener(Protocol):
    """Opens a span as the current one (its caller's span is its parent)."""

    def open(self, name: str, attributes: Attributes, *, client: bool,
             expected: tuple[type[BaseException], ...]
             ) -> AbstractContextManager[SpanNotes]: ...


class _NoSpan:
    """The span of a process that does not trace: one shared, stateless object."""

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def is_recording(self) -> bool:
        return False

    def note(self, attributes: Attributes) -> None:
        return None

    def fail(self, error_type: str) -> None:
        return None


_NO_SPAN = _NoSpan()
_opener: SpanOpener | None = None


def is_tracing_configured(environ: Mapping[str, str] = os.environ) -> bool:
    """True when an OTLP endpoint is set and the SDK is not disabled (the standard
    variables: ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``, ``OTEL_SDK_DISABLED``)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def install_opener(opener: SpanOpener | None) -> None:
    """Route the spans below to ``opener`` (None: back to no-ops)."""
    global _opener
    _opener = opener


def open_span(name: str, attributes: Attributes | None = None, *, client: bool = False,
              expected: tuple[type[BaseException], ...] = ()
              ) -> AbstractContextManager[SpanNotes]:
    """A span around a block, child of the current one; ``client`` for a call to another
    service. An exception leaving the block marks it failed unless it is ``expected``
    (an outcome, not a fault)."""
    if _opener is None:
        return _NO_SPAN
    return _opener.open(name, attributes or {}, client=client, expected=expected)
