"""Sessions the tests generate themselves (never the corpus): exchanges of a user ask, a
tool call with its result and the agent's answer, each with identifiers unique to a tag.
No service, no Celery: the unit suite imports this."""

from __future__ import annotations

from typing import Any


def generated_turns(tag: str, count: int) -> list[dict[str, Any]]:
    """``count`` exchanges of user ask, tool call with its result, and answer, each
    carrying identifiers unique to ``tag`` (reservation ``{tag}R{i}``)."""
    messages: list[dict[str, Any]] = []
    for i in range(count):
        reservation, call_id = f"{tag}R{i}", f"call_{tag}_{i}"
        arguments = f'{{"reservation_id": "{reservation}"}}'
        messages += [
            {"role": "user", "content": f"Please check reservation {reservation} and tell me "
             f"whether flight HAT{100 + i} on 2024-05-{10 + i % 20} still has seats."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call_id, "type": "function", "function": {
                    "name": "get_reservation_details", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": call_id, "content": (
                f'{{"reservation_id": "{reservation}", "flight": "HAT{100 + i}", '
                f'"seats_left": {i % 7}, "cabin": "economy", "status": "confirmed"}}')},
            {"role": "assistant", "content": f"Reservation {reservation} is confirmed on "
             f"HAT{100 + i}; {i % 7} economy seats are left. I have noted your request."},
        ]
    return messages


def generated_session(session_id: str, turns: int) -> dict[str, Any]:
    """A session record: a system prompt and ``turns`` generated exchanges."""
    system = {"role": "system", "content": "You are an airline agent. Follow the policy."}
    return {"session_id": session_id, "messages": [system, *generated_turns(session_id, turns)]}
