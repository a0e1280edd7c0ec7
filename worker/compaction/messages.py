"""The chat message model: OpenAI chat-completions messages as platforms store them.

Unknown fields are kept (``extra="allow"``) and ``dump_message`` returns exactly the keys
that were given, so a stored message round-trips unchanged. Reasoning and refusal fields
are opaque extras. Content parts are kept as plain dicts: only their text is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict


class Role(StrEnum):
    SYSTEM = "system"
    DEVELOPER = "developer"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


INSTRUCTION_ROLES = frozenset({Role.SYSTEM, Role.DEVELOPER})


class FunctionCall(BaseModel):
    """A tool call's function; ``arguments`` is kept verbatim even when not valid JSON."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str
    arguments: str


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    id: str
    type: str = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """One chat-completions message; fields not named here are preserved as extras."""

    model_config = ConfigDict(extra="allow", frozen=True)

    role: Role
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @property
    def text(self) -> str:
        """The message's text: the string content, or its text parts joined by newlines."""
        return content_text(self.content)

    @property
    def tool_call_ids(self) -> list[str]:
        return [call.id for call in self.tool_calls or ()]


def content_text(content: str | list[dict[str, Any]] | None) -> str:
    """Return the text of a content value (parts without text contribute nothing)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = [part.get("text") for part in content if isinstance(part, dict)]
    return "\n".join(text for text in texts if isinstance(text, str))


def parse_message(data: dict[str, Any]) -> ChatMessage:
    """Parse one message dict (raises ``pydantic.ValidationError`` on a bad shape)."""
    return ChatMessage.model_validate(data)


def parse_message_json(text: str) -> ChatMessage:
    """Parse one message from its JSON text, with no dict tree in between; its models
    share their bookkeeping with every other message's (:func:`share_bookkeeping`)."""
    message = ChatMessage.model_validate_json(text)
    share_bookkeeping(message)
    for call in message.tool_calls or ():
        share_bookkeeping(call)
        share_bookkeeping(call.function)
    return message


# One set per distinct combination of given field names (a few), and one empty extras dict.
_SHARED_FIELD_SETS: dict[frozenset[str], set[str]] = {}
_NO_EXTRAS: dict[str, Any] = {}


def share_bookkeeping(model: BaseModel) -> None:
    """Point a frozen model's set of the fields it was given, and its extras when it has
    none, at one shared object each. pydantic gives every instance a set and a dict of
    its own: with a tool call's two models, most of a stored message's memory besides
    its strings (bench.memory_bench measures a long job's peak). Safe for frozen
    models only: nothing changes them in place (``model_copy`` and ``copy`` copy both
    before an update; setting or deleting an attribute is refused)."""
    fields_set = model.__pydantic_fields_set__
    shared = _SHARED_FIELD_SETS.setdefault(frozenset(fields_set), fields_set)
    object.__setattr__(model, "__pydantic_fields_set__", shared)
    if not model.__pydantic_extra__:
        object.__setattr__(model, "__pydantic_extra__", _NO_EXTRAS)


M = TypeVar("M", bound=BaseModel)


def build_model(cls: type[M], values: dict[str, Any], fields_set: set[str] | None = None) -> M:
    """Build a frozen model of trusted values (every field given, defaults included)
    without pydantic's validation or its per-instance bookkeeping: the values come from
    checked data, and ``model_construct`` would cost a neutral view most of its time.
    ``fields_set``: the given fields' shared set (:func:`shared_fields`) when the caller
    knows it, which spares finding it per model."""
    model = object.__new__(cls)
    object.__setattr__(model, "__dict__", values)
    if fields_set is None:
        fields_set = shared_fields(*[name for name, value in values.items()
                                     if value is not None])
    object.__setattr__(model, "__pydantic_fields_set__", fields_set)
    object.__setattr__(model, "__pydantic_extra__", _NO_EXTRAS)
    object.__setattr__(model, "__pydantic_private__", None)
    return model


def shared_fields(*names: str) -> set[str]:
    """The one set of given field names every model given exactly ``names`` shares."""
    given = frozenset(names)
    shared = _SHARED_FIELD_SETS.get(given)
    if shared is None:
        shared = _SHARED_FIELD_SETS[given] = set(given)
    return shared


def dump_message(message: ChatMessage) -> dict[str, Any]:
    """Return the message as the dict it was given (unset fields stay absent)."""
    return message.model_dump(mode="json", exclude_unset=True)


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A message at its position in a session, with its token count cached at append.

    ``reasoning``: the reasoning or thinking text the message's text ends with (an item's
    view reads it after the reply): summarized, but never what the agent said.
    """

    seq: int
    message: ChatMessage
    tokens: int
    reasoning: str = ""

    @property
    def said_text(self) -> str:
        """The message's text without its reasoning: what its author said."""
        text = self.message.text
        if not self.reasoning:
            return text
        return text[:len(text) - len(self.reasoning)].removesuffix("\n")
