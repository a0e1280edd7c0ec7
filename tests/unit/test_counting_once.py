"""The summary block is rendered and counted once per job: the update costs each line once
and counts the block once, validation carries that count (a re-render would show here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import tiktoken

from tests.unit.session_strategies import shared_counter
from tests.unit.test_schema import filled
from worker.compaction.schema import (
    HEADINGS,
    count_summary_tokens,
    empty_block_tokens,
    render_summary_block,
)
from worker.compaction.summary_update import (
    MIN_ARTIFACT_TOKENS,
    count_identifier_lines,
    update_summary,
)
from worker.compaction.tokens import TokenCounter
from worker.compaction.validation import validate_summary

BUDGET_TOKENS = 4_096


@dataclass
class CountingEncoding:
    """Wraps the real encoding and tallies what is encoded."""

    inner: tiktoken.Encoding
    calls: int = 0
    encoded_tokens: int = 0
    texts: list[str] = field(default_factory=list)

    def encode_ordinary(self, text: str) -> list[int]:
        tokens = self.inner.encode_ordinary(text)
        self.calls += 1
        self.encoded_tokens += len(tokens)
        self.texts.append(text)
        return tokens

    def decode_bytes(self, tokens: list[int]) -> bytes:
        return self.inner.decode_bytes(tokens)

    def decode_single_token_bytes(self, token: int) -> bytes:
        return self.inner.decode_single_token_bytes(token)

    @property
    def name(self) -> str:
        return self.inner.name


def test_one_update_and_validation_of_a_1k_token_summary_count_the_block_once() -> None:
    plain = shared_counter()
    prior = filled(
        goal="Keep the airline customer's bookings in order",
        completed_actions=[f"called cancel_reservation(R{n:05d}) → ok (status: cancelled)"
                           for n in range(20)],
        key_decisions=[f"User confirmed: yes, cancel R{n:05d}" for n in range(10)],
        relevant_artifacts=[f"gift_card_{n:07d}" for n in range(60)],
    )
    new = filled(completed_actions=["called update_reservation_flights(R99999) → ok"],
                 pending=["Unanswered user request: can you add a bag to R99999?"])
    block_tokens = count_summary_tokens(prior, plain)
    assert 900 <= block_tokens <= 1_300
    reply_tokens = count_summary_tokens(new, plain)
    empty_block_tokens(plain)  # the floor: counted once per encoding and process
    encoding = CountingEncoding(plain.encoding)
    counter = TokenCounter(cast(Any, encoding))

    updated = update_summary(prior, new, budget_tokens=BUDGET_TOKENS, counter=counter,
                             identifiers=["R99999", "E3283-SCHEMA"])
    validated = validate_summary(new, updated, span_tokens=5_000, budget_tokens=BUDGET_TOKENS,
                                 replaced_tokens=6_000, counter=counter)

    final_tokens = validated.fitted.tokens
    assert validated.fitted.text == render_summary_block(validated.summary)
    # A block's count encodes its goal line (its headings' counts are the process's).
    renders = sum(text.startswith(f"{HEADINGS['goal']}:") for text in encoding.texts)
    assert renders == 2  # the updated block and the span's reply
    # Lines once, the block once and the reply: no bisection re-renders.
    assert encoding.encoded_tokens <= 2 * final_tokens + reply_tokens + 100


def test_identifier_lines_counted_ahead_are_not_encoded_again_by_the_update() -> None:
    plain = shared_counter()
    identifiers = [f"  gift_card_{n:07d} " for n in range(300)] + ["", "R99999"]
    new = filled(goal="Keep the bookings in order",
                 relevant_artifacts=["R99999", "gift_card_0000007"])
    encoding = CountingEncoding(plain.encoding)
    counter = TokenCounter(cast(Any, encoding)).for_job()

    count_identifier_lines(identifiers, counter, budget_tokens=BUDGET_TOKENS)
    ahead = len(encoding.texts)
    updated = update_summary(None, new, budget_tokens=BUDGET_TOKENS, counter=counter,
                             identifiers=identifiers)

    update_texts = encoding.texts[ahead:]
    assert "gift_card_0000299" in updated.fitted.text  # the lines were costed
    # Each identifier is encoded once more, in the block's own (shared) lines only.
    encoded = sum(text.count("gift_card_") for text in update_texts)
    assert encoded <= updated.fitted.text.count("gift_card_"), update_texts
    fresh = update_summary(None, new, budget_tokens=BUDGET_TOKENS, counter=plain.for_job(),
                           identifiers=identifiers)
    assert updated == fresh


def test_identifier_lines_are_counted_ahead_only_as_far_as_the_budget_could_list() -> None:
    plain = shared_counter()
    identifiers = [f"gift_card_{n:07d}" for n in range(2_000)]
    encoding = CountingEncoding(plain.encoding)
    counter = TokenCounter(cast(Any, encoding)).for_job()

    count_identifier_lines(identifiers, counter, budget_tokens=BUDGET_TOKENS)

    counted = "".join(encoding.texts)
    listable = BUDGET_TOKENS // MIN_ARTIFACT_TOKENS  # what a 4k-token block could list
    assert counted.count("gift_card_") == listable
    assert f"gift_card_{listable - 1:07d}" in counted
    assert f"gift_card_{listable:07d}" not in counted
