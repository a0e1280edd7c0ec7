"""The test server's Files and Batch APIs (``/v1/files``, ``/v1/batches``), shaped as the
OpenAI SDK parses them (``openai.types.FileObject``, ``openai.types.Batch``).

A batch walks the real lifecycle: ``validating`` (the input file is read line by line;
a bad file fails the batch with its errors), ``in_progress``, ``finalizing``,
``completed``; or ``expired`` (the lines answered before the window ended are in the
output file, the rest in the error file as ``batch_expired``), ``cancelling`` then
``cancelled``, or ``failed``. Each line is answered by the server's own chat-completions
logic (the same replies, behaviour markers and usage as a synchronous call); a non-2xx
answer is that line's entry in the error file, so a batch fails partly.

The clock moves it: each read of a batch advances it as far as its knobs (read live,
so a test can hold batches in progress and then let them go) allow.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

from tests.support.openai_behaviours import Reply, error_reply

COMPLETION_WINDOW = "24h"
ENDPOINTS = ("/v1/chat/completions",)
LineAnswer = Callable[[dict[str, Any]], Reply]
EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."


@dataclass(frozen=True)
class BatchKnobs:
    """How batches behave, read each time a batch is advanced."""

    validating_s: float = 0.0
    in_progress_s: float = 0.0  # a slow batch: held in progress this long
    finalizing_s: float = 0.0
    expire: bool = False  # the window ends while in progress
    answered_before_expiry: int = 0  # lines answered before it does
    fail_every: int = 0  # every Nth line of a batch answered with a 500 (0: none)
    fail_validation: bool = False  # the batch fails validation whatever its file


@dataclass
class _File:
    id: str
    filename: str
    purpose: str
    data: bytes
    created_at: int

    def shape(self) -> dict[str, Any]:
        return {"id": self.id, "object": "file", "bytes": len(self.data),
                "created_at": self.created_at, "filename": self.filename,
                "purpose": self.purpose, "status": "processed", "expires_at": None,
                "status_details": None}


@dataclass
class _Batch:
    id: str
    input_file_id: str
    endpoint: str
    metadata: dict[str, str] | None
    created_at: float
    status: str = "validating"
    stamps: dict[str, int] = field(default_factory=dict)
    since: float = 0.0  # when the current status began
    lines: list[dict[str, Any]] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    errors_out: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    usage: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("input", "cached", "output"), 0))


class BatchApi:
    """Files and batches held in memory; every method answers an HTTP reply."""

    def __init__(self, answer_line: LineAnswer, clock: Callable[[], float] = time.time) -> None:
        self._answer_line = answer_line
        self._clock = clock
        self._lock = threading.RLock()
        self._files: dict[str, _File] = {}
        self._batches: dict[str, _Batch] = {}
        self._ids = 0
        self.knobs = BatchKnobs()

    def route(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> Reply | None:
        """The reply to a Files or Batch API request; None when ``path`` is neither's."""
        parts = path.strip("/").split("/")[1:]  # after "v1"
        if not parts or parts[0] not in ("files", "batches"):
            return None
        with self._lock:
            if parts[0] == "files":
                return self._route_files(method, parts[1:], headers, raw)
            return self._route_batches(method, parts[1:], raw)

    def batch_ids(self) -> list[str]:
        with self._lock:
            return list(self._batches)

    def _next_id(self, prefix: str) -> str:
        self._ids += 1
        return f"{prefix}-test-{self._ids:06d}"

    def _route_files(self, method: str, rest: list[str], headers: dict[str, str],
                     raw: bytes) -> Reply:
        if method == "POST" and not rest:
            return self._upload(headers.get("content-type", ""), raw)
        file = self._files.get(rest[0]) if rest and method == "GET" else None
        if file is None:
            return error_reply(404, f"No such File object: {'/'.join(rest)}",
                               "invalid_request_error", param="id")
        if rest[1:] == ["content"]:
            return Reply(200, None, body=file.data, content_type="application/octet-stream")
        return Reply(200, file.shape())

    def _upload(self, content_type: str, raw: bytes) -> Reply:
        fields = _multipart_fields(content_type, raw)
        if "file" not in fields or fields.get("purpose", (b"", ""))[0] != b"batch":
            return error_reply(400, "Upload a 'file' with purpose 'batch'.",
                               "invalid_request_error", param="purpose")
        data, filename = fields["file"]
        return Reply(200, self._store_file(filename or "upload.jsonl", "batch", data).shape())

    def _store_file(self, filename: str, purpose: str, data: bytes) -> _File:
        file = _File(self._next_id("file"), filename, purpose, data, int(self._clock()))
        self._files[file.id] = file
        return file

    def _route_batches(self, method: str, rest: list[str], raw: bytes) -> Reply:
        if not rest:
            return self._create(raw) if method == "POST" else self._list()
        batch = self._batches.get(rest[0])
        if batch is None:
            return error_reply(404, f"No batch found with id '{rest[0]}'.",
                               "invalid_request_error", param="batch_id")
        if method == "POST" and rest[1:] == ["cancel"]:
            self._advance(batch)
            if batch.status in ("validating", "in_progress"):
                self._enter(batch, "cancelling")
        self._advance(batch)
        return Reply(200, _batch_shape(batch))

    def _create(self, raw: bytes) -> Reply:
        body = json.loads(raw or b"{}")
        window = body.get("completion_window")
        if body.get("endpoint") not in ENDPOINTS or window != COMPLETION_WINDOW:
            return error_reply(400, "Unsupported endpoint or completion window.",
                               "invalid_request_error", param="endpoint")
        if body.get("input_file_id") not in self._files:
            return error_reply(400, "Invalid 'input_file_id'.", "invalid_request_error",
                               param="input_file_id")
        now = self._clock()
        batch = _Batch(self._next_id("batch"), body["input_file_id"], body["endpoint"],
                       body.get("metadata"), now, since=now)
        self._batches[batch.id] = batch
        return Reply(200, _batch_shape(batch))

    def _list(self) -> Reply:
        for batch in self._batches.values():
            self._advance(batch)
        data = [_batch_shape(batch) for batch in reversed(self._batches.values())]
        return Reply(200, {"object": "list", "data": data, "has_more": False,
                           "first_id": data[0]["id"] if data else None,
                           "last_id": data[-1]["id"] if data else None})

    def _enter(self, batch: _Batch, status: str) -> None:
        batch.status, batch.since = status, self._clock()
        batch.stamps[f"{status}_at"] = int(batch.since)

    def _advance(self, batch: _Batch) -> None:
        """Move ``batch`` on as far as the clock and the knobs allow."""
        knobs = self.knobs
        if batch.status == "validating" and self._clock() >= batch.since + knobs.validating_s:
            self._validate(batch, knobs)
        if batch.status == "in_progress" and self._clock() >= batch.since + knobs.in_progress_s:
            expiring = knobs.expire
            self._answer(batch, knobs.answered_before_expiry if expiring else None, knobs)
            self._enter(batch, "expired" if expiring else "finalizing")
            if expiring:
                self._write_files(batch)
        if batch.status == "finalizing" and self._clock() >= batch.since + knobs.finalizing_s:
            self._write_files(batch)
            self._enter(batch, "completed")
        if batch.status == "cancelling":
            self._write_files(batch)
            self._enter(batch, "cancelled")

    def _validate(self, batch: _Batch, knobs: BatchKnobs) -> None:
        lines, errors = _read_lines(self._files[batch.input_file_id], batch.endpoint)
        if knobs.fail_validation and not errors:
            errors = [{"code": "invalid_request", "line": None, "param": None,
                       "message": "The batch failed validation (test knob)."}]
        if errors:
            batch.errors = errors
            self._enter(batch, "failed")
            return
        batch.lines = lines
        self._enter(batch, "in_progress")

    def _answer(self, batch: _Batch, limit: int | None, knobs: BatchKnobs) -> None:
        """Answer the batch's lines (the first ``limit`` of them; the rest expire)."""
        for index, line in enumerate(batch.lines):
            entry_id = f"batch_req_{batch.id}_{index}"
            if limit is not None and index >= limit:
                batch.errors_out.append({"id": entry_id, "custom_id": line["custom_id"],
                                         "response": None, "error": {
                                             "code": "batch_expired",
                                             "message": EXPIRED_MESSAGE}})
                continue
            failing = knobs.fail_every and (index + 1) % knobs.fail_every == 0
            reply = (error_reply(500, "The server had an error processing this line.",
                                 "server_error") if failing else self._answer_line(line["body"]))
            self._record(batch, entry_id, line["custom_id"], reply)

    def _record(self, batch: _Batch, entry_id: str, custom_id: str, reply: Reply) -> None:
        if reply.payload is None or reply.body is not None:  # hung or not JSON: a 500
            reply = error_reply(500, "The server had an error processing this line.",
                                "server_error")
        entry = {"id": entry_id, "custom_id": custom_id, "error": None,
                 "response": {"status_code": reply.status, "request_id": entry_id,
                              "body": reply.payload}}
        if 200 <= reply.status < 300:
            batch.outputs.append(entry)
            usage = (reply.payload or {}).get("usage") or {}
            details = usage.get("prompt_tokens_details") or {}
            batch.usage["input"] += usage.get("prompt_tokens", 0)
            batch.usage["cached"] += details.get("cached_tokens", 0)
            batch.usage["output"] += usage.get("completion_tokens", 0)
        else:
            batch.errors_out.append(entry)

    def _write_files(self, batch: _Batch) -> None:
        if batch.outputs and batch.output_file_id is None:
            batch.output_file_id = self._store_file(
                f"{batch.id}_output.jsonl", "batch_output", _jsonl(batch.outputs)).id
        if batch.errors_out and batch.error_file_id is None:
            batch.error_file_id = self._store_file(
                f"{batch.id}_error.jsonl", "batch_output", _jsonl(batch.errors_out)).id


def _batch_shape(batch: _Batch) -> dict[str, Any]:
    usage = batch.usage
    done = len(batch.outputs)
    return {
        "id": batch.id, "object": "batch", "endpoint": batch.endpoint,
        "input_file_id": batch.input_file_id, "completion_window": COMPLETION_WINDOW,
        "status": batch.status, "created_at": int(batch.created_at),
        "expires_at": int(batch.created_at) + 86_400, "metadata": batch.metadata,
        "output_file_id": batch.output_file_id, "error_file_id": batch.error_file_id,
        "errors": {"object": "list", "data": batch.errors} if batch.errors else None,
        "request_counts": {"total": len(batch.lines), "completed": done,
                           "failed": len(batch.errors_out)},
        "usage": {"input_tokens": usage["input"],
                  "input_tokens_details": {"cached_tokens": usage["cached"]},
                  "output_tokens": usage["output"],
                  "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": usage["input"] + usage["output"]},
        **batch.stamps,
    }


def _read_lines(file: _File, endpoint: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The file's request lines, or the errors validation reports (one per bad line)."""
    lines: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, text in enumerate(file.data.decode("utf-8", "replace").splitlines(), 1):
        if not text.strip():
            continue
        problem = _line_problem(text, endpoint, seen)
        if isinstance(problem, str):
            errors.append({"code": "invalid_request", "line": number, "param": None,
                           "message": problem})
        else:
            seen.add(problem["custom_id"])
            lines.append(problem)
    if not lines and not errors:
        errors.append({"code": "empty_file", "line": None, "param": None,
                       "message": "The input file has no requests."})
    return lines, errors


def _line_problem(text: str, endpoint: str, seen: set[str]) -> dict[str, Any] | str:
    """The parsed line, or what is wrong with it."""
    try:
        line = json.loads(text)
    except ValueError:
        return "The line is not valid JSON."
    if not isinstance(line, dict) or not isinstance(line.get("body"), dict):
        return "The line has no request 'body'."
    if line.get("method") != "POST" or line.get("url") != endpoint:
        return f"The line's method and url must be POST {endpoint}."
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or custom_id in seen:
        return "Each line needs a unique 'custom_id'."
    return line


def _jsonl(entries: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(entry).encode() + b"\n" for entry in entries)


def _multipart_fields(content_type: str, raw: bytes) -> dict[str, tuple[bytes, str | None]]:
    """A multipart/form-data body's fields: name -> (bytes, filename)."""
    head = f"Content-Type: {content_type}\r\n\r\n".encode()
    message = BytesParser(policy=HTTP).parsebytes(head + raw)
    fields: dict[str, tuple[bytes, str | None]] = {}
    if not message.is_multipart():
        return fields
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        if isinstance(name, str) and isinstance(payload, bytes):
            fields[name] = (payload, part.get_filename())
    return fields
