"""Validation and repair of a session's incoming messages, with a report of every problem.

Pure: plain data in, plain data out. A message that needs no repair comes out as the same
dict it came in as (``dump_message`` of it equals the input), so stored sessions
round-trip exactly; only repaired messages change, and each change is reported.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import ValidationError

from worker.compaction.limits import MAX_MESSAGES, MAX_NESTING_DEPTH, measure_depth
from worker.compaction.messages import ChatMessage, Role, dump_message, parse_message

MISSING_RESULT_CONTENT = "[no result recorded]"
_KNOWN_ROLES = frozenset(role.value for role in Role)


class ProblemKind(StrEnum):
    """What is wrong with a message (stored and reported as the value)."""

    MALFORMED_SESSION = "malformed_session"  # the record itself: no id, messages not a list
    MALFORMED_MESSAGE = "malformed_message"
    UNKNOWN_ROLE = "unknown_role"
    LEGACY_FUNCTION_CALL = "legacy_function_call"
    ORPHAN_TOOL_RESULT = "orphan_tool_result"
    MISSING_TOOL_RESULT = "missing_tool_result"
    DUPLICATE_TOOL_CALL_ID = "duplicate_tool_call_id"
    INVALID_TEXT = "invalid_text"
    EMPTY_SESSION = "empty_session"
    TOO_LARGE = "too_large"  # over a nesting, size or count limit (``limits.py``)
    FORMAT_MISMATCH = "format_mismatch"  # another wire format's record, item or field
    STORE_REFUSED = "store_refused"  # the database refused the record; nothing stored


class Action(StrEnum):
    """What intake did about a problem."""

    REJECT = "reject"
    REPAIR = "repair"


# The repair of each kind (the others cannot be repaired and always reject):
#   legacy_function_call   function_call -> tool_calls with id legacy_<index>; role function -> tool
#   orphan_tool_result     drop the tool message (its call is unknown; lossy, so off by default)
#   missing_tool_result    insert {"role": "tool", "content": "[no result recorded]"} after
#                          the call's group: keeps the call, which a dropped call would not
#   duplicate_tool_call_id rename the later call and its results to <id>_dup<N>
#   invalid_text           lone surrogates -> U+FFFD, NUL bytes removed
REPAIRABLE_KINDS = frozenset({
    ProblemKind.LEGACY_FUNCTION_CALL,
    ProblemKind.ORPHAN_TOOL_RESULT,
    ProblemKind.MISSING_TOOL_RESULT,
    ProblemKind.DUPLICATE_TOOL_CALL_ID,
    ProblemKind.INVALID_TEXT,
})


@dataclass(frozen=True)
class IntakePolicy:
    """Reject or repair, per repairable kind; every other kind always rejects."""

    legacy_function_call: Action = Action.REPAIR
    orphan_tool_result: Action = Action.REJECT
    missing_tool_result: Action = Action.REPAIR
    duplicate_tool_call_id: Action = Action.REPAIR
    invalid_text: Action = Action.REPAIR

    def action_for(self, kind: ProblemKind) -> Action:
        if kind not in REPAIRABLE_KINDS:
            return Action.REJECT
        return Action(getattr(self, kind.value))

    @classmethod
    def strict(cls) -> IntakePolicy:
        """Reject every problem."""
        return cls(**{kind.value: Action.REJECT for kind in REPAIRABLE_KINDS})

    @classmethod
    def lenient(cls) -> IntakePolicy:
        """Repair every problem that has a repair."""
        return cls(**{kind.value: Action.REPAIR for kind in REPAIRABLE_KINDS})


@dataclass(frozen=True)
class Problem:
    """One problem; ``index`` is the message's position in the input (None: the session)."""

    kind: ProblemKind
    index: int | None
    detail: str
    action: Action


@dataclass(frozen=True)
class IntakeResult:
    """The messages to store (empty when rejected) and every problem found."""

    messages: tuple[ChatMessage, ...]
    problems: tuple[Problem, ...]
    rejected: bool

    @property
    def repaired(self) -> bool:
        return bool(self.problems) and not self.rejected


@dataclass(frozen=True)
class _OpenCall:
    id: str  # as stored (after a duplicate rename)
    original_id: str  # as given: what its results refer to
    index: int | None  # message that made the call; None when it came from the context
    is_legacy: bool = False
    name: str | None = None


def check_session(
    raw_messages: Sequence[Any],
    policy: IntakePolicy,
    *,
    open_tool_call_ids: Collection[str] = frozenset(),
    seen_tool_call_ids: Collection[str] = frozenset(),
    is_append: bool = False,
) -> IntakeResult:
    """Validate ``raw_messages`` and repair what ``policy`` allows.

    Args:
        open_tool_call_ids: calls of the stored session still waiting for a result, in
            call order (an append may answer them first).
        seen_tool_call_ids: every tool call id the stored session already used.
        is_append: the messages extend a stored session (an empty list is then no problem).
    """
    intake = _Intake(policy, open_tool_call_ids, seen_tool_call_ids)
    if len(raw_messages) > MAX_MESSAGES:
        intake.report(ProblemKind.TOO_LARGE, None,
                      f"{len(raw_messages):,} messages; at most {MAX_MESSAGES:,} at once")
        return IntakeResult((), tuple(intake.problems), rejected=True)
    for index, raw in enumerate(raw_messages):
        intake.take(index, raw)
    # Calls still open at the very end are an agent waiting for results: not a problem.
    rejected = any(problem.action is Action.REJECT for problem in intake.problems)
    if not intake.out and not is_append and not rejected:
        detail = "no message is left after repair" if raw_messages else "no messages"
        intake.report(ProblemKind.EMPTY_SESSION, None, detail)
        rejected = True
    return IntakeResult(
        messages=() if rejected else tuple(intake.out),
        problems=tuple(intake.problems),
        rejected=rejected,
    )


def find_open_tool_calls(messages: Sequence[ChatMessage]) -> tuple[str, ...]:
    """Return the ids of the last tool-call group's calls that have no result yet."""
    answered: set[str] = set()
    for message in reversed(messages):
        if message.role is not Role.TOOL:
            return tuple(i for i in message.tool_call_ids if i not in answered)
        if message.tool_call_id is not None:
            answered.add(message.tool_call_id)
    return ()


class _Intake:
    """The running state of one check: output so far, open calls, ids used."""

    def __init__(
        self, policy: IntakePolicy, open_ids: Collection[str], seen_ids: Collection[str]
    ) -> None:
        self.policy = policy
        self.out: list[ChatMessage] = []
        self.problems: list[Problem] = []
        self.open_calls = [_OpenCall(id=i, original_id=i, index=None) for i in open_ids]
        self.seen_ids = set(seen_ids) | set(open_ids)

    def report(
        self, kind: ProblemKind, index: int | None, detail: str, action: Action | None = None
    ) -> None:
        """Record a problem; ``action`` overrides the policy where no repair is possible."""
        self.problems.append(Problem(kind, index, detail, action or self.policy.action_for(kind)))

    def take(self, index: int, raw: Any) -> None:
        """Check one message; repaired or not, processing goes on so every problem shows."""
        if not isinstance(raw, dict):
            self.report(ProblemKind.MALFORMED_MESSAGE, index, f"not an object ({_kind_of(raw)})")
            return
        if measure_depth(raw) > MAX_NESTING_DEPTH:
            # Checked before anything recursive (cleaning, validation) walks the message.
            self.report(ProblemKind.TOO_LARGE, index,
                        f"objects and arrays nested deeper than {MAX_NESTING_DEPTH} levels")
            return
        data, changed = clean_text(raw)
        if changed:
            self.report(ProblemKind.INVALID_TEXT, index, "NUL byte or lone surrogate in a string")
        message = self._parse(index, data)
        if message is None:
            return
        if message.role is Role.TOOL:
            self._take_result(index, message)
            return
        self._close_group(index)
        if message.tool_calls:
            message = self._open_group(index, message, is_legacy="function_call" in data)
        self.out.append(message)

    def _parse(self, index: int, data: dict[str, Any]) -> ChatMessage | None:
        role = data.get("role")
        if role == "function":
            converted = self._convert_function_result(index, data)
            if converted is None:
                return None
            data = converted
        elif role == "assistant" and "function_call" in data:
            data = self._convert_function_call(index, data)
        elif not isinstance(role, str):
            self.report(ProblemKind.MALFORMED_MESSAGE, index, "role missing or not a string")
            return None
        elif role not in _KNOWN_ROLES:
            self.report(ProblemKind.UNKNOWN_ROLE, index, f"unknown role {role[:40]!r}")
            return None
        if data.get("tool_calls") and role != "assistant":
            self.report(ProblemKind.MALFORMED_MESSAGE, index, f"tool_calls on a {role} message")
            return None
        try:
            return parse_message(data)
        except ValidationError as exc:
            self.report(ProblemKind.MALFORMED_MESSAGE, index, _describe(exc))
            return None

    def _convert_function_call(self, index: int, data: dict[str, Any]) -> dict[str, Any]:
        call_id = f"legacy_{index}"
        self.report(
            ProblemKind.LEGACY_FUNCTION_CALL, index,
            f"assistant function_call converted to tool call {call_id!r}",
            Action.REJECT if data.get("tool_calls") else None,
        )
        converted = {key: value for key, value in data.items() if key != "function_call"}
        converted["tool_calls"] = [{"id": call_id, "type": "function",
                                    "function": data["function_call"]}]
        return converted

    def _convert_function_result(self, index: int, data: dict[str, Any]) -> dict[str, Any] | None:
        name = data.get("name")
        call = next((c for c in self.open_calls if c.is_legacy and name in (None, c.name)), None)
        if call is None:
            self.report(
                ProblemKind.LEGACY_FUNCTION_CALL, index,
                "function message answers no open function_call", Action.REJECT,
            )
            return None
        self.report(
            ProblemKind.LEGACY_FUNCTION_CALL, index,
            f"function message converted to the tool result of {call.id!r}",
        )
        return {**data, "role": "tool", "tool_call_id": call.id}

    def _open_group(self, index: int, message: ChatMessage, *, is_legacy: bool) -> ChatMessage:
        stored_ids: list[str] = []
        for call in message.tool_calls or ():
            stored_id = call.id
            if call.id in self.seen_ids:
                stored_id = self._unused_id(call.id)
                self.report(
                    ProblemKind.DUPLICATE_TOOL_CALL_ID, index,
                    f"tool call id {call.id!r} already used; renamed {stored_id!r}",
                )
            self.seen_ids.add(stored_id)
            stored_ids.append(stored_id)
            self.open_calls.append(_OpenCall(
                id=stored_id, original_id=call.id, index=index,
                is_legacy=is_legacy, name=call.function.name,
            ))
        if stored_ids == message.tool_call_ids:
            return message
        body = dump_message(message)
        for call_body, stored_id in zip(body["tool_calls"], stored_ids, strict=True):
            call_body["id"] = stored_id
        return parse_message(body)

    def _unused_id(self, call_id: str) -> str:
        n = 1
        while f"{call_id}_dup{n}" in self.seen_ids:
            n += 1
        return f"{call_id}_dup{n}"

    def _take_result(self, index: int, message: ChatMessage) -> None:
        result_id = message.tool_call_id
        call = next((c for c in self.open_calls if c.id == result_id), None) or next(
            (c for c in self.open_calls if c.original_id == result_id), None
        )
        if call is None:
            self.report(
                ProblemKind.ORPHAN_TOOL_RESULT, index,
                f"tool result for {result_id!r} answers no open tool call (dropped on repair)",
            )
            return
        self.open_calls.remove(call)
        if call.id != result_id:
            # The call was renamed as a duplicate; its result follows it (reported at the call).
            message = parse_message({**dump_message(message), "tool_call_id": call.id})
        self.out.append(message)

    def _close_group(self, index: int) -> None:
        """A non-tool message ends the group: every call still open misses its result."""
        for call in self.open_calls:
            self.report(
                ProblemKind.MISSING_TOOL_RESULT, index if call.index is None else call.index,
                f"tool call {call.id!r} has no result before message {index}",
            )
            self.out.append(parse_message(
                {"role": "tool", "tool_call_id": call.id, "content": MISSING_RESULT_CONTENT}
            ))
        self.open_calls.clear()


def clean_text(value: Any) -> tuple[Any, bool]:
    """Return ``value`` with every string storable (keys too: lone surrogates become
    U+FFFD, NUL bytes go), and whether anything changed."""
    if isinstance(value, str):
        cleaned = _clean_string(value)
        return cleaned, cleaned != value
    if isinstance(value, dict):
        pairs = [(clean_text(k), clean_text(v)) for k, v in value.items()]
        changed = any(k[1] or v[1] for k, v in pairs)
        return ({k[0]: v[0] for k, v in pairs} if changed else value), changed
    if isinstance(value, list):
        items = [clean_text(item) for item in value]
        changed = any(item[1] for item in items)
        return ([item[0] for item in items] if changed else value), changed
    return value, False


def _clean_string(text: str) -> str:
    if "\x00" not in text and text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates (from JSON escapes like "\ud800") cannot be stored as UTF-8;
        # a round trip through UTF-16 keeps valid pairs and turns the rest into U+FFFD.
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text.replace("\x00", "")


def _describe(exc: ValidationError) -> str:
    """Summarize a validation error by field and reason, without the offending values."""
    errors = exc.errors(include_url=False, include_input=False)
    parts = [f"{'.'.join(str(loc) for loc in e['loc']) or 'message'}: {e['msg']}" for e in errors]
    return "; ".join(parts)[:300]


def _kind_of(value: Any) -> str:
    return "null" if value is None else type(value).__name__
