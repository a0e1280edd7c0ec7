"""The chat API's rule on tool calls, as a check for tests: a projection, a composed span
or a pruned one must be a message list the API accepts."""

from __future__ import annotations

from collections.abc import Iterable

from worker.compaction.messages import ChatMessage, Role


def find_chat_violations(
    messages: Iterable[ChatMessage], *, allow_pending_tail: bool = True
) -> list[str]:
    """Return why this message list would be refused by the chat API (empty when valid).

    Every assistant tool call needs exactly one result before the next non-tool message,
    and every tool result must answer such a call. With ``allow_pending_tail`` a final
    exchange still waiting for results is accepted: the agent will append them.
    """
    problems: list[str] = []
    waiting: set[str] = set()
    for index, message in enumerate(messages):
        if message.role is Role.TOOL:
            if message.tool_call_id in waiting:
                waiting.discard(message.tool_call_id)
            else:
                problems.append(f"message {index}: tool result {message.tool_call_id!r} "
                                "answers no open call")
            continue
        if waiting:
            problems.append(f"message {index}: calls {sorted(waiting)} have no result")
            waiting.clear()
        if message.role is Role.ASSISTANT:
            waiting.update(message.tool_call_ids)
    if waiting and not allow_pending_tail:
        problems.append(f"end: calls {sorted(waiting)} have no result")
    return problems
