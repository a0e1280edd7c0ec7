"""An item's reasoning or thinking text is not what the agent said: ingest identifies
what an item says, calls and gets back, never its reasoning (a value the agent only
thought of, stored as said, outranked the values the tools returned in every extractive
summary; recall still finds it), and the extractive summary drafts no decision or
report of work from it."""

from __future__ import annotations

import random
import uuid
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.session_strategies import shared_counter
from worker.compaction import IntakePolicy, SessionFormat
from worker.compaction.fallback import fallback_summary
from worker.compaction.item_groups import group_items, read_item
from worker.platform.formats import check_items, item_rows

Items = list[dict[str, Any]]


def _value(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128)))


def _anthropic_reply(thought: str, said: str, called: str, rng: random.Random) -> Items:
    call_id = f"toolu_{rng.getrandbits(48):012x}"
    return [
        {"role": "user", "content": "Look the account up, please."},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": f"Maybe the account is {thought}.",
             "signature": f"sig{rng.getrandbits(64):016x}"},
            {"type": "text", "text": f"Checking account {said}."},
            {"type": "tool_use", "id": call_id, "name": "get_account",
             "input": {"account": called}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": call_id, "content": "found"}]},
    ]


def _responses_reply(thought: str, said: str, called: str, rng: random.Random) -> Items:
    call_id = f"call_{rng.getrandbits(48):012x}"
    return [
        {"type": "message", "role": "user",
         "content": [{"type": "input_text", "text": "Look the account up, please."}]},
        {"type": "reasoning", "id": f"rs_{rng.getrandbits(48):012x}",
         "summary": [{"type": "summary_text", "text": f"Maybe the account is {thought}."}],
         "encrypted_content": f"enc{rng.getrandbits(64):016x}"},
        {"type": "message", "role": "assistant", "id": f"msg_{rng.getrandbits(48):012x}",
         "status": "completed",
         "content": [{"type": "output_text", "text": f"Checking account {said}.",
                      "annotations": []}]},
        {"type": "function_call", "id": f"fc_{call_id}", "call_id": call_id,
         "name": "get_account", "arguments": f'{{"account": "{called}"}}',
         "status": "completed"},
        {"type": "function_call_output", "call_id": call_id, "output": "found"},
    ]


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_a_value_only_the_reasoning_names_is_searched_but_not_identified(seed: int) -> None:
    rng = random.Random(seed)
    for session_format, build in ((SessionFormat.ANTHROPIC, _anthropic_reply),
                                  (SessionFormat.RESPONSES, _responses_reply)):
        thought, said, called = _value(rng), _value(rng), _value(rng)
        checked = check_items(session_format, build(thought, said, called, rng),
                              IntakePolicy.strict())
        assert not checked.rejected, checked.problems
        rows = item_rows(session_format, checked, shared_counter())

        found = {(value, source) for row in rows
                 for value, _, source, *_ in row.identifiers or ()}
        assert (said, "assistant") in found
        assert (called, "tool_argument") in found
        assert thought not in {value for value, _ in found}
        assert any(thought in (row.search_text or "") for row in rows)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_the_extractive_summary_drafts_no_decision_from_reasoning(seed: int) -> None:
    rng = random.Random(seed)
    for session_format, build in ((SessionFormat.ANTHROPIC, _anthropic_reply),
                                  (SessionFormat.RESPONSES, _responses_reply)):
        thought, said, called = _value(rng), _value(rng), _value(rng)
        items = build(f"{thought}; confirmed: the refund goes to {thought}", said, called,
                      rng)
        for item in items:  # the reply's text states a decision too
            for part in item.get("content") or ():
                if isinstance(part, dict) and part.get("text", "").startswith("Checking"):
                    part["text"] += f" Confirmed: the refund goes to {said}."
        groups = group_items(session_format, [
            read_item(session_format, seq, 1, item) for seq, item in enumerate(items, 1)])
        summary = fallback_summary(groups, artifacts=[], budget_tokens=2_000,
                                   counter=shared_counter()).summary

        drafted = "\n".join(item for name in ("key_decisions", "completed_actions")
                            for item in summary.items_of(name))
        assert said in drafted
        assert thought not in drafted
