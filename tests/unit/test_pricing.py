"""The price table and what calls cost: read from its JSON or refused with where it is
wrong, priced token kind by kind, the Batch API's discount, and the payback of a
compaction."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.compaction.pricing import (
    ModelPrice,
    dump_price_table,
    parse_price_table,
    payback_requests,
    price_calls,
)
from worker.settings.config import DEFAULT_PRICES, Settings

USD = st.floats(0, 100, allow_nan=False).map(lambda usd: round(usd, 4))
PRICES = st.builds(ModelPrice, input=USD, cached_input=USD, output=USD,
                   batch_discount=st.sampled_from([0.0, 0.25, 0.5]))
TOKENS = st.integers(0, 2_000_000)


@given(st.dictionaries(st.text(min_size=1, max_size=20), PRICES, max_size=5))
def test_a_price_table_reads_back_as_written(table: dict[str, ModelPrice]) -> None:
    assert parse_price_table(dump_price_table(table)) == table


@pytest.mark.parametrize(("text", "says"), [
    ("{gpt", "not JSON"),
    ('["gpt-4o-mini"]', "the table"),
    ('{"m": {"input": 1, "output": 2}}', "m.cached_input"),
    ('{"m": {"input": -1, "cached_input": 0, "output": 2}}', "m.input"),
    ('{"m": {"input": 1, "cached_input": 0, "output": 2, "batch_discount": 1}}',
     "m.batch_discount"),
    ('{"m": {"input": 1, "cached_input": 0, "output": 2, "per": "token"}}', "m.per"),
])
def test_a_malformed_price_table_is_refused_naming_where(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_price_table(text)
    with pytest.raises(ValueError, match="llm_prices"):
        Settings(llm_prices=text)


@given(PRICES, TOKENS, TOKENS, TOKENS)
def test_calls_cost_each_token_kind_at_its_price(
    price: ModelPrice, prompt: int, cached_share: int, completion: int
) -> None:
    cached = min(prompt, cached_share)
    cost = price_calls(price, prompt_tokens=prompt, cached_tokens=cached,
                       completion_tokens=completion)
    by_kind = ((prompt - cached) * price.input + cached * price.cached_input
               + completion * price.output) / 1_000_000
    assert cost == pytest.approx(by_kind, abs=1e-9)
    batch = price_calls(price, prompt_tokens=prompt, cached_tokens=cached,
                        completion_tokens=completion, batch=True)
    assert batch == pytest.approx(cost * (1 - price.batch_discount), abs=1e-9)


def test_a_compaction_pays_back_after_its_cost_over_the_input_it_saves_per_request() -> None:
    price = ModelPrice(input=2.0, cached_input=0.5, output=8.0)
    assert payback_requests(0.02, 5_000, price) == pytest.approx(2.0)
    assert payback_requests(0.02, 0, price) is None
    assert payback_requests(0.0, 5_000, price) == 0.0


def test_the_default_table_prices_the_default_model_and_reads_back() -> None:
    settings = Settings()
    assert settings.price_table == DEFAULT_PRICES
    assert settings.llm_model in settings.price_table
    assert json.loads(settings.llm_prices).keys() == DEFAULT_PRICES.keys()
