"""Facts before history: at a summary update whose block is at its ceiling, the prior's
completed and resolved items are folded into grouped count lines that still quote their
identifiers, before any open item, decision, constraint or identifier is dropped; and a
span's bare numbers only a tool returned age out before the prior's values. Checked on
prior summaries a seeded grammar writes."""

from __future__ import annotations

import random
import re

import pytest

from tests.unit.session_strategies import shared_counter
from worker.compaction.history import GROUPED, fold_history
from worker.compaction.schema import LIST_SECTIONS, Summary, count_summary_tokens, empty_summary
from worker.compaction.summary_update import update_summary

SEEDS = range(40)
TOOLS = ("refund", "cancel_order", "modify_address", "exchange_items")
LOOKUPS = ("get_order_details", "get_user_details", "list_payments")
OUTCOMES = ("ok", "failed: E{code}-DECLINED", "unknown (status: pending)")


def filled(**sections: object) -> Summary:
    """A summary with the given sections and every other one empty."""
    return Summary.model_validate({**empty_summary().model_dump(), **sections})


class Grammar:
    """Identifiers and summary items drawn from a seed: every value is fresh and whole."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.values: list[str] = []

    def value(self) -> str:
        rng = self.rng
        shape = rng.choice(("#W{n}", "usr_{a}{n}", "{a}.{n}@mail.example.com",
                            "order_id {n}{n}{n}"))
        alpha = "".join(rng.choice("abcdefghjkmnpqrstuvwxyz") for _ in range(4))
        drawn = shape.format(n=rng.randint(1_000, 9_999), a=alpha)
        self.values.append(drawn)
        return drawn

    def history(self, count: int) -> tuple[list[str], list[str]]:
        """Completed actions (call and look-up lines, span lines) and resolved items."""
        rng, done, settled = self.rng, [], []
        for index in range(count):
            outcome = rng.choice(OUTCOMES).format(code=rng.randint(1_000, 9_999))
            done.append(f"called {rng.choice(TOOLS)}({self.value()}){' → '}{outcome}")
            if index % 4 == 0:
                done.append(f"looked up with {rng.choice(LOOKUPS)} \u00d7{rng.randint(1, 9)} "
                            f"({self.value()}, {self.value()})")
                done.append(f"Compacted seq {index * 10 + 1} to {index * 10 + 9}: "
                            f"3 user, 4 assistant, 2 tool messages")
            prefix = rng.choice(("Answered: ", "Acted on: ", "Fixed: "))
            settled.append(f"{prefix}Please check {self.value()} for me, thanks so much.")
        return done, settled

    def prior(self, history_items: int) -> Summary:
        done, settled = self.history(history_items)
        return filled(
            goal="User request: sort out the orders",
            constraints_and_preferences=[f"My account is {self.value()}." for _ in range(4)],
            completed_actions=done,
            key_decisions=[f"Confirmed: the refund goes to {self.value()}." for _ in range(6)],
            resolved=settled,
            pending=[f"Unanswered user request: where is {self.value()}?" for _ in range(3)],
            relevant_artifacts=[self.value() for _ in range(30)],
        )

    def span(self) -> Summary:
        done, settled = self.history(3)
        return filled(goal="", completed_actions=done, resolved=settled,
                      key_decisions=[f"We decided to keep {self.value()}."],
                      relevant_artifacts=[self.value() for _ in range(5)])


def tokens(summary: Summary) -> int:
    return count_summary_tokens(summary, shared_counter())


def kept_items(summary: Summary) -> str:
    return "\n".join([summary.goal, *(item for name in LIST_SECTIONS
                                      for item in summary.items_of(name))])


def folded_budget(prior: Summary, new: Summary) -> tuple[int, int]:
    """The tokens of the update with the prior's history folded, and without."""
    counter = shared_counter()
    whole = update_summary(prior, new, budget_tokens=1_000_000, counter=counter).summary
    earlier = {name: set(range(len(prior.items_of(name))))
               for name in ("completed_actions", "resolved")}
    folded, _ = fold_history(whole, earlier, counter)
    return tokens(folded), tokens(whole)


@pytest.mark.parametrize("seed", SEEDS)
def test_history_is_folded_before_any_open_item_decision_or_identifier_is_dropped(seed: int
                                                                                  ) -> None:
    grammar = Grammar(seed)
    prior, new = grammar.prior(grammar.rng.randint(20, 60)), grammar.span()
    folded_tokens, whole_tokens = folded_budget(prior, new)
    assert folded_tokens < whole_tokens
    # A ceiling the prose does not fit under, but the facts do.
    budget = (folded_tokens + whole_tokens) // 2
    updated = update_summary(prior, new, budget_tokens=budget, counter=shared_counter())
    block = kept_items(updated.summary)
    assert updated.fitted.tokens <= budget
    for name in ("constraints_and_preferences", "key_decisions", "pending"):
        assert [item for item in prior.items_of(name) if item not in block] == []
    assert [value for value in grammar.values if value not in block] == []


@pytest.mark.parametrize("seed", SEEDS[:10])
def test_a_block_under_its_budget_keeps_its_history_word_for_word(seed: int) -> None:
    grammar = Grammar(seed)
    prior, new = grammar.prior(10), grammar.span()
    updated = update_summary(prior, new, budget_tokens=1_000_000, counter=shared_counter())
    assert updated.summary.completed_actions[:len(prior.completed_actions)] == \
        prior.completed_actions
    assert not any(item.startswith(GROUPED) for item in updated.summary.resolved)


@pytest.mark.parametrize("seed", SEEDS[:10])
def test_grouped_lines_fold_again_keeping_every_count_and_value(seed: int) -> None:
    grammar = Grammar(seed)
    counter = shared_counter()
    done, settled = grammar.history(30)
    # A number the text gives no label: a grouped line cannot label it either.
    unlabelled = str(grammar.rng.randint(10**11, 10**12 - 1))
    settled.append(f"Answered: is {unlabelled} right?")
    summary = filled(goal="", completed_actions=done, resolved=settled)
    earlier = {"completed_actions": set(range(len(done))), "resolved": set(range(len(settled)))}
    once, indexes = fold_history(summary, earlier, counter)
    twice, _ = fold_history(once, indexes, counter)
    assert twice == once
    calls = sum(int(count.group(1)) for item in once.completed_actions
                if (count := re.search(r"calls to .*? \u00d7(\d+)", item)))
    assert calls == sum(item.startswith("called ") for item in done)
    assert [value for value in grammar.values if value not in kept_items(once)] == []
    assert unlabelled not in kept_items(once)
    # A grouped line names no tool right before an outcome (what the truth check reads).
    for item in once.completed_actions:
        assert not re.search(r"(?:" + "|".join(TOOLS) + r")\s*(?:\(|→|:)", item)


@pytest.mark.parametrize("seed", SEEDS[:10])
def test_a_spans_bare_numbers_only_a_tool_returned_age_out_before_the_priors_values(
        seed: int) -> None:
    grammar = Grammar(seed)
    prior = filled(goal="g", relevant_artifacts=[grammar.value() for _ in range(40)])
    catalogue = [str(grammar.rng.randint(10**9, 10**10 - 1)) for _ in range(40)]
    new = filled(goal="", relevant_artifacts=[grammar.value(), *catalogue])
    budget = tokens(prior) + 40
    updated = update_summary(prior, new, budget_tokens=budget, counter=shared_counter(),
                             identifiers=new.relevant_artifacts, tool_numbers=catalogue)
    listed = updated.summary.relevant_artifacts
    assert set(prior.relevant_artifacts) <= set(listed)
    assert new.relevant_artifacts[0] in listed
    assert any(number not in listed for number in catalogue)
