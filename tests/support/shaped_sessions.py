"""Generated sessions in the two shapes the summary must serve, with planted facts the
tests look for after compaction: a coding agent (test runs that fail with an error code,
pinned versions decided with a reason, files edited, a fix that makes the run pass) and a
customer-service agent (a customer's request, look-ups full of tool-only ids, a
confirmation, a change made). ``joined`` strings customer conversations end to end."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Planted:
    """What a generator planted, by kind: values a user or the assistant said, error codes
    that ended a call, decisions' pinned values, and requests the agent answered."""

    said: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    pins: list[str] = field(default_factory=list)
    answered: list[str] = field(default_factory=list)


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function",
         "function": {"name": name, "arguments": json.dumps(arguments)}}]}


def _result(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def coding_turns(tag: str, start: int, count: int, planted: Planted) -> list[dict[str, Any]]:
    """``count`` coding exchanges: ask, failing run, decision, edit, passing run, report."""
    messages: list[dict[str, Any]] = []
    for n in range(start, start + count):
        path, code = f"src/{tag.lower()}_mod{n}.py", f"ERR-{3000 + n}"
        pin, ticket = f"libpkg{n}=={n % 9}.{n % 7}.{n % 5}", f"OPS-{1000 + n}"
        ask = f"Please fix the failing check in {path} for ticket {ticket}."
        messages += [
            {"role": "user", "content": ask},
            _call(f"c{tag}{n}a", "run_tests", {"target": path}),
            _result(f"c{tag}{n}a", "collected 14 items\n" + "." * 13 + "F\n"
                    f"FAILED tests/test_{tag.lower()}_mod{n}.py::test_load - {code}: bad row\n"
                    "=== 1 failed, 13 passed in 0.4s ==="),
            {"role": "assistant", "content": f"Decision: pin {pin} because the newer "
             f"release breaks the loader in {path}."},
            _call(f"c{tag}{n}b", "edit_file", {"path": path, "pin": pin}),
            _result(f"c{tag}{n}b", f"wrote {path} (3 lines changed)"),
            _call(f"c{tag}{n}c", "run_tests", {"target": path}),
            _result(f"c{tag}{n}c", "collected 14 items\n=== 14 passed in 0.4s ==="),
            {"role": "assistant", "content": f"Fixed: {code} is gone and {ticket} is done."},
        ]
        planted.said += [path, ticket, pin]
        planted.errors.append(code)
        planted.pins.append(pin)
        planted.answered.append(ask)
    return messages


def service_turns(tag: str, start: int, count: int, planted: Planted) -> list[dict[str, Any]]:
    """``count`` customer-service exchanges: request, look-up, confirmation, change."""
    messages: list[dict[str, Any]] = []
    for n in range(start, start + count):
        reservation, user = f"{tag}{n:04d}X", f"user_{tag.lower()}_{n}"
        ask = f"Could you move reservation {reservation} to a later flight? I am {user}."
        flights = [{"flight_number": f"HAT{(n * 7 + k) % 900:03d}", "seats": k} for k in range(6)]
        messages += [
            {"role": "user", "content": ask},
            _call(f"s{tag}{n}a", "search_direct_flight", {"reservation_id": reservation}),
            _result(f"s{tag}{n}a", json.dumps(flights)),
            {"role": "assistant", "content": f"HAT{(n * 7 + 1) % 900:03d} has seats. Shall I "
             f"move {reservation} to it?"},
            {"role": "user", "content": "Yes, please go ahead."},
            _call(f"s{tag}{n}b", "update_reservation_flights", {"reservation_id": reservation}),
            _result(f"s{tag}{n}b", json.dumps({"reservation_id": reservation,
                                               "status": "updated"})),
            {"role": "assistant", "content": f"Done: {reservation} has been updated."},
        ]
        planted.said += [reservation, user]
        planted.answered.append(ask)
    return messages


def joined(conversations: range, turns: int, planted: Planted) -> list[dict[str, Any]]:
    """Customer conversations end to end, each opened by a boundary and a greeting."""
    messages: list[dict[str, Any]] = []
    for index in conversations:
        messages.append({"role": "user", "content": f"[SESSION BOUNDARY {index + 1}/"
                         f"{conversations.stop}] The previous customer conversation has ended."})
        messages.append({"role": "user", "content": f"Hello! Customer {index} here, I need "
                         f"help with booking C{index:03d}BOOK."})
        messages.append({"role": "assistant", "content": "Sure, I can help."})
        messages += service_turns(f"J{index}", 0, turns, planted)
    return messages
