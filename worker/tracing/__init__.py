"""Traces, when the standard ``OTEL_*`` variables ask for them: ``spans.py`` (what a job
and the LLM adapter open, no-ops otherwise, loading nothing) and ``export.py`` (the
OpenTelemetry SDK, its OTLP/HTTP exporter and Celery's instrumentation, loaded only
then)."""
