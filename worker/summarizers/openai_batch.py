"""The Batch API adapter: summarizer requests written as one JSONL file, uploaded through
the Files API, run as one batch, and read back line by line.

A line carries the very body a synchronous call sends (``LLMClient.request_body``), so a
batch's answers are read, validated and priced as the synchronous replies are
(``LLMClient.read_batch_reply``). A line the batch did not answer (an error status, an
expired or cancelled batch) comes back as the job error the synchronous call would have
raised, translated by the same error map (``openai_errors.translate_error``): the
caller decides, by its setting, whether to call again synchronously or fall back.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, TypeVar

import httpx2
import openai
from openai.types import Batch

from worker.errors import CompactionError, ProviderError
from worker.summarizers.openai_client import LLMClient, LLMReply

T = TypeVar("T")
ENDPOINT: Literal["/v1/chat/completions"] = "/v1/chat/completions"
COMPLETION_WINDOW: Literal["24h"] = "24h"
# The SDK's error class for each status a line may carry, as it picks them for a call.
_STATUS_ERRORS: dict[int, type[openai.APIStatusError]] = {
    400: openai.BadRequestError, 401: openai.AuthenticationError,
    403: openai.PermissionDeniedError, 404: openai.NotFoundError, 409: openai.ConflictError,
    422: openai.UnprocessableEntityError, 429: openai.RateLimitError}


class BatchStatus(StrEnum):
    """The Batch API's statuses (``openai.types.Batch.status``)."""

    VALIDATING = "validating"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    FAILED = "failed"

    @property
    def is_final(self) -> bool:
        """True once the batch will change no more: its files can be read."""
        return self in (BatchStatus.COMPLETED, BatchStatus.EXPIRED, BatchStatus.CANCELLED,
                        BatchStatus.FAILED)


@dataclass(frozen=True)
class BatchState:
    """What the provider says of one batch."""

    batch_id: str
    status: BatchStatus
    total: int
    completed: int
    failed: int
    output_file_id: str | None
    error_file_id: str | None
    errors: tuple[str, ...] = ()  # why validation failed the whole batch


@dataclass(frozen=True)
class BatchRequest:
    """One summarizer request bound for a batch, under its caller's ``custom_id``."""

    custom_id: str
    messages: list[dict[str, Any]]
    schema: dict[str, Any]
    max_output_tokens: int


class LLMBatches:
    """Batches on the endpoint of ``client`` (its base URL, key, model and retries)."""

    def __init__(self, client: LLMClient) -> None:
        self._client = client

    def submit(self, requests: Sequence[BatchRequest], *,
               metadata: Mapping[str, str] | None = None) -> BatchState:
        """Upload the requests as one JSONL file and start a batch on it."""
        lines = b"".join(json.dumps(self._line(request)).encode() + b"\n"
                         for request in requests)
        return self._call(lambda sdk: _state(sdk.batches.create(
            input_file_id=sdk.files.create(file=("requests.jsonl", lines),
                                           purpose="batch").id,
            endpoint=ENDPOINT, completion_window=COMPLETION_WINDOW,
            metadata=dict(metadata) if metadata else None)))

    def state(self, batch_id: str) -> BatchState:
        return self._call(lambda sdk: _state(sdk.batches.retrieve(batch_id)))

    def lines(self, state: BatchState, custom_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """A final batch's output and error lines for ``custom_ids``, as the provider
        wrote them; a request neither file names (a batch that failed validation, or was
        cancelled before its turn) gets an error line naming the batch's status."""
        wanted = set(custom_ids)
        found: dict[str, dict[str, Any]] = {}
        for file_id in (state.output_file_id, state.error_file_id):
            if file_id is not None:
                for text in self._read_file(file_id).splitlines():
                    line = json.loads(text)
                    if line.get("custom_id") in wanted:
                        found[line["custom_id"]] = line
        for custom_id in wanted - found.keys():
            found[custom_id] = {"custom_id": custom_id, "response": None, "error": {
                "code": f"batch_{state.status.value}",
                "message": f"the batch {state.batch_id} ended {state.status.value} "
                           "without answering this request"}}
        return found

    def read_line(self, line: Mapping[str, Any], messages: list[dict[str, Any]]
                  ) -> LLMReply | CompactionError:
        """One line's reply, read as the synchronous call's; or the error the call would
        have raised."""
        response, error = line.get("response"), line.get("error")
        if isinstance(response, dict) and 200 <= response.get("status_code", 0) < 300:
            try:
                return self._client.read_batch_reply(
                    json.dumps(response.get("body")).encode(), messages)
            except CompactionError as exc:
                return exc
        return self._line_error(response, error)

    def _read_file(self, file_id: str) -> str:
        return self._call(lambda sdk: sdk.files.content(file_id).text)

    def _line(self, request: BatchRequest) -> dict[str, Any]:
        body = self._client.request_body(request.messages, request.schema,
                                         request.max_output_tokens)
        return {"custom_id": request.custom_id, "method": "POST", "url": ENDPOINT,
                "body": body}

    def _line_error(self, response: Any, error: Any) -> CompactionError:
        if isinstance(response, dict):  # the endpoint answered this line with an error
            status = int(response.get("status_code") or 500)
            body = response.get("body")
            sdk_error = _status_error(status, body if isinstance(body, dict) else {})
            return self._client.translate(sdk_error)
        code = error.get("code") if isinstance(error, dict) else None
        return ProviderError(f"the batch did not answer this request ({code or 'no code'})",
                             reason=str(code or "batch_line_failed"))

    def _call(self, operation: Callable[[openai.OpenAI], T]) -> T:
        try:
            return operation(self._client.sdk)
        except openai.OpenAIError as exc:
            raise self._client.translate(exc) from exc


def _status_error(status: int, body: dict[str, Any]) -> openai.APIStatusError:
    """The SDK's error for a line answered with ``status``, as a call would raise it."""
    error = body.get("error") if isinstance(body.get("error"), dict) else {}
    message = str((error or {}).get("message") or f"status {status}")
    request = httpx2.Request("POST", f"https://batch.invalid{ENDPOINT}")
    response = httpx2.Response(status, json=body, request=request)
    kind = _STATUS_ERRORS.get(status, openai.InternalServerError if status >= 500
                              else openai.APIStatusError)
    return kind(message, response=response, body=error)


def _state(batch: Batch) -> BatchState:
    counts = batch.request_counts
    found = (batch.errors.data if batch.errors else None) or []
    errors = tuple(f"line {error.line}: {error.message}" if error.line else str(error.message)
                   for error in found)
    return BatchState(batch.id, BatchStatus(batch.status),
                      counts.total if counts else 0, counts.completed if counts else 0,
                      counts.failed if counts else 0, batch.output_file_id,
                      batch.error_file_id, errors)
