"""The ``recall`` tool a platform can give its agents: an OpenAI function schema and its
handler. Whatever a summary leaves out of a compacted span is one call away."""

from __future__ import annotations

import json
from typing import Any, Protocol

from db import RecallHit, SessionNotFound

DEFAULT_LIMIT = 10
MAX_LIMIT = 50

RECALL_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "recall",
        "description": (
            "Find the earlier messages of this conversation where an exact value or phrase "
            "appears (a file path, error code, id, version, ticket or any words), including "
            "the part replaced by a summary. Returns each message's position, role and an "
            "excerpt."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 3,
                          "description": "The value or phrase, as written (any case)."},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT,
                          "description": f"Most messages to return (default {DEFAULT_LIMIT})."},
            },
            "required": ["query"],
            "additionalProperties": False,
        },
    },
}


class RecallStore(Protocol):
    def recall(self, session_id: str, query: str, *, limit: int = 20) -> list[RecallHit]: ...


def handle_recall(store: RecallStore, session_id: str, arguments: str) -> str:
    """Answer one ``recall`` call: its JSON arguments in, a compact JSON result out.

    Bad arguments and unknown sessions come back as ``{"error": kind, "detail": ...}``
    for the agent to read; nothing is raised.
    """
    try:
        parsed = json.loads(arguments)
        query, limit = parsed["query"], parsed.get("limit", DEFAULT_LIMIT)
        if not isinstance(query, str) or not isinstance(limit, int) or limit < 1:
            raise TypeError("query must be a string and limit a positive integer")
        hits = store.recall(session_id, query, limit=min(limit, MAX_LIMIT))
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        return _error("invalid_arguments", str(exc))
    except ValueError as exc:
        return _error("invalid_query", str(exc))
    except SessionNotFound:
        return _error("unknown_session", session_id)
    return json.dumps({"query": query, "hits": [
        {"seq": hit.seq, "role": hit.role, "excerpt": hit.excerpt} for hit in hits
    ]}, ensure_ascii=False)


def _error(kind: str, detail: str) -> str:
    return json.dumps({"error": kind, "detail": detail}, ensure_ascii=False)
