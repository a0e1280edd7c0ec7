"""The worker: the Celery app and its thin task, the job pipeline over a store port, the
LLM adapter and summarizers, fleet state in Redis, and the pure core
(``worker.compaction``).

``__all__`` names the modules other packages (the scheduler, the command line) may
import; the rest are the worker's own, and a test walks the imports. Importing this
package loads none of them: the Celery app is built only by ``worker.celery_app``.
"""

__all__ = [
    "attempt_journal",
    "backfill",
    "celery_app",
    "checks",
    "compaction",
    "contract",
    "dead_letters",
    "errors",
    "figures",
    "ingest",
    "job",
    "keys",
    "lifecycle",
    "logging",
    "outcome",
    "preview",
    "queue_items",
    "recall_tool",
    "runtime",
    "scrub",
    "sessions",
    "settings",
    "settings_errors",
    "views",
]
