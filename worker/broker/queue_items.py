"""The inspection of one raw queue item before kombu or Celery reads it: every defect a
producer can put on the list ends as a named ``ItemRejected`` (the transport dead-letters
it), and the scheduling headers producers may not set are neutralized.

Plain data in, plain data out: the transport (``worker/broker/transport.py``) and
``compactor dead retry`` both call ``admit_item``.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from worker.broker.contract import MAX_HEADERS_CHARS, MAX_TASK_ID_CHARS, SERVICE_TASK_NAMES
from worker.settings.config import Settings

MAX_NESTING_DEPTH = 32  # a task message nests 4 deep; Celery's decoder recurses per level
# How many times longer ``json.dumps`` writes a value than the JSON text it was parsed
# from, at most: a two-byte UTF-8 character becomes a six-character escape, ``1e15``
# becomes ``1000000000000000.0``, a separator gains a space.
REENCODED_GROWTH = 5
JSON_CONTENT_TYPE = "application/json"


class _EnvelopeFields(BaseModel):
    """Fields of the envelope with the types kombu and Celery assume when they read them
    (null always allowed; other fields pass as they are). Another type raises inside the
    consumer, where an AttributeError or KeyError reads as a lost connection and the
    message goes back on the queue for ever."""

    model_config = ConfigDict(extra="allow", strict=True)


class TaskHeaders(_EnvelopeFields):
    """The headers Celery reads from a task message, besides its id and task name (each
    checked on its own)."""

    lang: str | None = None
    shadow: str | None = None
    group: str | None = None
    group_index: int | None = None
    retries: int | None = None
    root_id: str | None = None
    parent_id: str | None = None
    argsrepr: str | None = None
    kwargsrepr: str | None = None
    origin: str | None = None
    ignore_result: bool | None = None
    replaced_task_nesting: int | None = None
    stamped_headers: list[Any] | None = None
    stamps: dict[str, Any] | None = None


class EnvelopeProperties(_EnvelopeFields):
    """The properties kombu reads: the delivery tag it acknowledges by, and the rest."""

    delivery_tag: str = Field(min_length=1, max_length=MAX_TASK_ID_CHARS)
    correlation_id: str | None = None
    reply_to: str | None = None
    delivery_mode: int | None = None
    delivery_info: dict[str, Any] | None = None
    priority: int | None = None
    body_encoding: str | None = None


@dataclass(frozen=True)
class ItemLimits:
    """What a queue item may be: its size (bytes), how far ahead a retry's ``eta`` may
    lie (s; further, and the visibility timeout would deliver it twice), and the tasks it
    may name (a worker passes the tasks its app registered)."""

    max_item_bytes: int
    max_eta_s: int
    task_names: frozenset[str] = SERVICE_TASK_NAMES


def item_limits(settings: Settings) -> ItemLimits:
    """The deployment's limits: a retry never waits past ``retry_backoff_max_s``."""
    return ItemLimits(max_item_bytes=settings.max_queue_item_bytes,
                      max_eta_s=settings.retry_backoff_max_s)


class ItemRejected(Exception):
    """Raised when a queue item cannot become a job; ``reason`` names the defect and
    ``task_id`` is the item's id when it has a readable one."""

    def __init__(self, reason: str, detail: str, task_id: str | None = None) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.task_id = task_id


def admit_item(raw: bytes, limits: ItemLimits, now: datetime) -> dict[str, Any]:
    """Return the item's envelope, its producer-set scheduling headers neutralized.

    Raises:
        ItemRejected: the item is oversized, not JSON, nested too deep, not an envelope,
            names a task this service does not run, or carries a body that does not decode.
    """
    envelope = _inspect_item(raw, limits)
    envelope["headers"] = neutralize_headers(envelope["headers"], limits, now)
    return envelope


def admit_item_bytes(raw: bytes, limits: ItemLimits, now: datetime) -> bytes:
    """The admitted item as kombu reads it: ``raw`` itself when neutralizing changed
    nothing and kombu decodes it as ``admit_item`` did, else its envelope encoded again.

    Raises:
        ItemRejected: as ``admit_item``.
    """
    envelope = _inspect_item(raw, limits)
    headers = envelope["headers"]
    neutral = neutralize_headers(headers, limits, now)
    # json.loads detects UTF-16 and UTF-32 from NUL bytes and skips a byte-order mark;
    # kombu decodes every item as UTF-8: only ASCII without NUL reads the same in both.
    if neutral == headers and raw.isascii() and b"\0" not in raw:
        return raw
    return json.dumps({**envelope, "headers": neutral}).encode()


def _inspect_item(raw: bytes, limits: ItemLimits) -> dict[str, Any]:
    """The item's envelope, once every check has passed (``admit_item``'s)."""
    if len(raw) > limits.max_item_bytes:
        raise ItemRejected("oversized_item",
                           f"{len(raw)} bytes, over the {limits.max_item_bytes}-byte limit")
    envelope = _load_json(raw, "unreadable_item", "the item")
    if not isinstance(envelope, dict) or not isinstance(envelope.get("properties"), dict):
        raise ItemRejected("not_an_envelope", "the item is not a task message envelope")
    headers = envelope.get("headers")
    if not isinstance(headers, dict):
        raise ItemRejected("invalid_headers", f"headers are a {type(headers).__name__}, "
                           "not an object")
    task_id = _read_task_id(headers)
    # Neither object can outgrow its limit as JSON when the whole item is this small.
    check_sizes = len(raw) * REENCODED_GROWTH > MAX_HEADERS_CHARS
    if check_sizes:
        _check_json_size(headers, "headers", task_id)
    _check_fields(TaskHeaders, headers, "invalid_headers", task_id)
    _check_fields(EnvelopeProperties, envelope["properties"], "invalid_properties", task_id)
    if check_sizes:
        _check_json_size(envelope["properties"], "properties", task_id)
    _check_task_name(headers, task_id, limits.task_names)
    _check_body(envelope, task_id)
    return envelope


def neutralize_headers(headers: dict[str, Any], limits: ItemLimits,
                       now: datetime) -> dict[str, Any]:
    """Drop what producers may not set (docs/TRIGGER.md): ``expires``, ``timelimit`` and
    ``countdown`` always; ``eta`` except on a retry due within ``max_eta_s``."""
    cleared = {**headers, "expires": None, "timelimit": [None, None]}
    cleared.pop("countdown", None)
    if not _is_retry_eta(headers, limits, now):
        cleared["eta"] = None
    return cleared


def _is_retry_eta(headers: dict[str, Any], limits: ItemLimits, now: datetime) -> bool:
    eta, retries = headers.get("eta"), headers.get("retries")
    if not isinstance(eta, str) or not isinstance(retries, int) or retries < 1:
        return False
    try:
        due = datetime.fromisoformat(eta)
    except ValueError:
        return False
    due = due if due.tzinfo else due.replace(tzinfo=UTC)
    return due <= now + timedelta(seconds=limits.max_eta_s)


def _read_task_id(headers: dict[str, Any]) -> str:
    task_id = headers.get("id")
    if not isinstance(task_id, str) or not task_id:
        raise ItemRejected("invalid_headers", "the id header is missing or not a string")
    if len(task_id) > MAX_TASK_ID_CHARS:
        raise ItemRejected("oversized_header", f"the id header is {len(task_id)} characters, "
                           f"over {MAX_TASK_ID_CHARS}")
    return task_id


def _check_json_size(fields: dict[str, Any], what: str, task_id: str) -> None:
    size = len(json.dumps(fields))
    if size > MAX_HEADERS_CHARS:
        raise ItemRejected("oversized_header", f"the {what} are {size} characters of "
                           f"JSON, over {MAX_HEADERS_CHARS}", task_id)


def _check_fields(model: type[_EnvelopeFields], fields: dict[str, Any], reason: str,
                  task_id: str) -> None:
    try:
        model.model_validate(fields)
    except ValidationError as exc:
        error = exc.errors()[0]  # the first, in the order the model lists the fields
        name = ".".join(str(part) for part in error["loc"])
        raise ItemRejected(reason, f"{name}: {error['msg']}"[:300], task_id) from None


def _check_task_name(headers: dict[str, Any], task_id: str, task_names: frozenset[str]
                     ) -> None:
    name = headers.get("task")
    if name not in task_names:
        shown = name[:80] if isinstance(name, str) else type(name).__name__
        raise ItemRejected("unknown_task", f"task {shown!r} does not run on this queue",
                           task_id)


def _check_body(envelope: dict[str, Any], task_id: str) -> None:
    content_type = envelope.get("content-type")
    if content_type != JSON_CONTENT_TYPE:
        shown = content_type[:80] if isinstance(content_type, str) else content_type
        raise ItemRejected("undecodable_message",
                           f"refused {shown!r} content: only JSON is accepted", task_id)
    body = envelope.get("body")
    if not isinstance(body, str):
        raise ItemRejected("bad_body", f"the body is a {type(body).__name__}, not a string",
                           task_id)
    if envelope["properties"].get("body_encoding") != "base64":
        raise ItemRejected("bad_body", "the body is not base64-encoded", task_id)
    try:
        decoded = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ItemRejected("bad_base64", f"the body is not base64 ({exc})", task_id) from exc
    args_kwargs_embed = _load_json(decoded, "undecodable_message", "the JSON body", task_id)
    if not _is_task_body(args_kwargs_embed):
        # Celery unpacks it in the pool child, where a failure leaves no outcome event.
        raise ItemRejected("bad_body", "the body is not [args, kwargs, embed]", task_id)


def _is_task_body(body: Any) -> bool:
    return (isinstance(body, list) and len(body) == 3 and isinstance(body[0], list)
            and isinstance(body[1], dict) and isinstance(body[2], dict | None))


def _load_json(raw: bytes, reason: str, what: str, task_id: str | None = None) -> Any:
    try:
        value = json.loads(raw)
    except RecursionError as exc:
        raise ItemRejected("nested_too_deep", f"{what} nests too deep to parse",
                           task_id) from exc
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise ItemRejected(reason, f"{what} does not decode as JSON ({exc})"[:300],
                           task_id) from exc
    # Each level opens with a bracket of its own: a text with few brackets is shallow.
    if raw.count(b"[") + raw.count(b"{") <= MAX_NESTING_DEPTH:
        return value
    depth = nesting_depth(value)
    if depth > MAX_NESTING_DEPTH:
        raise ItemRejected("nested_too_deep", f"{what} nests {depth} deep, over "
                           f"{MAX_NESTING_DEPTH}", task_id)
    return value


def nesting_depth(value: Any) -> int:
    """How deep lists and objects nest in a parsed JSON value (a scalar is 0), without
    recursion; it stops counting past ``MAX_NESTING_DEPTH``."""
    deepest, level = 0, [value]
    while level and deepest <= MAX_NESTING_DEPTH:
        children: list[Any] = []
        for item in level:
            if isinstance(item, dict):
                children.extend(item.values())
            elif isinstance(item, list):
                children.extend(item)
        if not children and not any(isinstance(i, dict | list) for i in level):
            break
        deepest += 1
        level = children
    return deepest
