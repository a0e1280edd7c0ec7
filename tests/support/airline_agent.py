"""The airline agent both Agents SDK end-to-end tests run (Chat Completions and
Responses models): its instructions and its one tool, whose long result makes a few
turns pass the job environment's trigger."""

from __future__ import annotations

import json

from agents import function_tool

INSTRUCTIONS = "You are an airline agent. Look reservations up before you answer."
NOTES = " ".join(f"Fare rule {i}: changes before departure cost 50 USD." for i in range(12))


@function_tool
def look_up_reservation(reservation_id: str) -> str:
    """Return the reservation's details."""
    return json.dumps({"reservation_id": reservation_id, "flight": f"HAT{len(reservation_id)}",
                       "status": "confirmed", "notes": NOTES})
