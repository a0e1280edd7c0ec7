"""What the LLM adapter reads of a chat completion, read from the reply's bytes.

The SDK's ``parse`` builds its ``ChatCompletion`` without validating it: a 200 that is no
completion (an HTML page, a gateway's text, ``null``, a message that is a string) comes
back as a string, ``None`` or a half-built model, and fails later as an
``AttributeError``; undecodable or cut JSON raises ``JSONDecodeError`` out of it. Read
here instead, every such body is one ``pydantic.ValidationError``, translated once into
``ProviderError`` (``invalid_response``): the endpoint's fault, retried, counted on the
provider breaker. Only the fields the adapter uses are held to a type; the rest of the
body may be anything, as it may from OpenAI-compatible servers.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from worker.errors import ProviderError


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class ReplyMessage(_Part):
    content: str | None = None
    refusal: str | None = None


class ReplyChoice(_Part):
    message: ReplyMessage
    finish_reason: str | None = None


class PromptTokensDetails(_Part):
    cached_tokens: int | None = None


class ReplyUsage(_Part):
    prompt_tokens: int
    completion_tokens: int
    # Servers without a prompt cache leave the details out, or their count null.
    prompt_tokens_details: PromptTokensDetails | None = None

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the provider served from its prompt cache (0 when unreported)."""
        details = self.prompt_tokens_details
        return (details.cached_tokens or 0) if details is not None else 0


class CompletionReply(_Part):
    """A chat completion as far as the adapter reads it: at least one choice."""

    choices: list[ReplyChoice] = Field(min_length=1)
    usage: ReplyUsage | None = None
    id: str | None = None
    model: str | None = None  # the model that answered (a deployment may name another)


def read_completion(body: bytes, content_type: str) -> CompletionReply:
    """Read a 2xx reply's body as a chat completion, whatever its content type says.

    Raises:
        ProviderError: ``reason="invalid_response"`` when it is none; the message names
            the content type, the size and the first problem, never the body's text.
    """
    try:
        return CompletionReply.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_context=False, include_input=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise ProviderError(
            f"the LLM endpoint's reply is not a chat completion ({content_type or 'no type'}, "
            f"{len(body)} bytes): {first['type']} at {where}",
            reason="invalid_response",
        ) from None  # the validation error quotes the body, which may quote the prompt
