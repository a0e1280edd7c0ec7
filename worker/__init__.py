"""The worker, by role: ``compaction/`` (the pure core), ``job/`` (one job over its ports),
``summarizers/`` (extractive and LLM, with the OpenAI client), ``platform/`` (what an agent
platform calls), ``shared_state/`` (what the fleet keeps in Redis), ``broker/`` (the Celery
entrypoints), ``settings/``, ``tokenizer/`` (tiktoken loaded offline), ``tracing/``
(OpenTelemetry spans, loaded only when configured); at the root, the
process-wide pieces: the error tree, logging, secret scrubbing, metrics, the allocator,
start checks and the runtime that builds a process's dependencies.

``__all__`` names the parts other packages (the scheduler, the command line) may import;
``tests/unit/test_import_boundaries.py`` holds that and which part may import which.
Importing this package loads none of them: the Celery app is built only by
``worker.broker.celery_app``.
"""

__all__ = [
    "broker",
    "checks",
    "compaction",
    "errors",
    "job",
    "logging",
    "platform",
    "runtime",
    "scrub",
    "settings",
    "shared_state",
    "summarizers",
    "tokenizer",
]
