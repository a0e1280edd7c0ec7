"""Every Redis key the service writes, built from one table of prefixes.

All keys sit under the deployment's ``redis_key_prefix`` (settings), so two deployments,
or two test runs, can share one Redis without colliding.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RedisKeys:
    """Key builder for one deployment prefix (e.g. ``compactor:``)."""

    prefix: str

    def deliveries(self, task_id: str, retries: int) -> str:
        """Counter of deliveries of one task attempt (retries get their own counter)."""
        return f"{self.prefix}deliveries:{task_id}:{retries}"

    def attempts(self, task_id: str) -> str:
        """Counter of a task's deliveries across its retries: each one's attempt number."""
        return f"{self.prefix}attempts:{task_id}"

    def first_attempt(self, task_id: str) -> str:
        """When a task's first attempt began: its retries end with ``retry_window_s``."""
        return f"{self.prefix}first-attempt:{task_id}"

    def rate_window(self, window: int) -> str:
        """Fleet-wide count of LLM calls in one rate-limit window."""
        return f"{self.prefix}llm-rate:{window}"

    def provider_breaker(self) -> str:
        """The provider-wide breaker state (JSON)."""
        return f"{self.prefix}provider-breaker"

    def scan_lock(self) -> str:
        """Held while a scan runs, so two beat processes never enqueue twice."""
        return f"{self.prefix}scan-lock"

    def dead_letters(self) -> str:
        """The dead-letter list: queue items the worker refused, newest first."""
        return f"{self.prefix}dead"

    def unrecorded_runs(self) -> str:
        """Run rows a job could not write (the database was down), newest first, until the
        reconciler writes them."""
        return f"{self.prefix}unrecorded-runs"

    def pending_events(self) -> str:
        """Hash of the attempts running now (task id: JSON), removed once their
        ``compaction.job`` event is out; what a kill leaves the reconciler reports."""
        return f"{self.prefix}pending-events"
