"""What LLM calls cost: the price table's entries, a job's calls priced, and how many of a
session's future requests a compaction takes to pay for itself.

Prices are US dollars per million tokens, as providers list them. A model missing from
the table has no price: its cost is unknown (None), never guessed.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

TOKENS_PER_PRICE_UNIT = 1_000_000
COST_DECIMALS = 9  # a billionth of a dollar: below every listed price of one token


class ModelPrice(BaseModel):
    """One model's prices (USD per million tokens) and its Batch API discount (share)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: float = Field(ge=0)
    cached_input: float = Field(ge=0)
    output: float = Field(ge=0)
    batch_discount: float = Field(0.0, ge=0, lt=1)


_TABLE = TypeAdapter(dict[str, ModelPrice])


def parse_price_table(text: str) -> dict[str, ModelPrice]:
    """Read a price table from its JSON text: ``{"model": {"input": ..., ...}, ...}``.

    Raises:
        ValueError: the text is no JSON object of model prices; the message names the
            first problem and where it is.
    """
    try:
        return _TABLE.validate_python(json.loads(text))
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg} at character {exc.pos}") from None
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "the table"
        raise ValueError(f"{where}: {first['msg']} (each model maps to input, cached_input, "
                         "output in USD per million tokens, and batch_discount)") from None


def dump_price_table(table: Mapping[str, ModelPrice]) -> str:
    """Write a price table as the JSON text ``parse_price_table`` reads."""
    return json.dumps({model: price.model_dump() for model, price in table.items()},
                      separators=(",", ":"))


def price_calls(price: ModelPrice, *, prompt_tokens: int, cached_tokens: int,
                completion_tokens: int, batch: bool = False) -> float:
    """Return what calls with these token totals cost (USD); ``batch``: at the Batch
    API's discount. Cached tokens are part of ``prompt_tokens``, billed at their price."""
    uncached = max(0, prompt_tokens - cached_tokens)
    units = (uncached * price.input + cached_tokens * price.cached_input
             + completion_tokens * price.output)
    share = 1 - price.batch_discount if batch else 1.0
    return round(units * share / TOKENS_PER_PRICE_UNIT, COST_DECIMALS)


def payback_requests(cost_usd: float, tokens_removed: int, price: ModelPrice) -> float | None:
    """Return how many of the session's future requests the compaction takes to pay for
    itself: each sends ``tokens_removed`` fewer input tokens (None: it removed none)."""
    saved_per_request = tokens_removed * price.input / TOKENS_PER_PRICE_UNIT
    if saved_per_request <= 0:
        return None
    return cost_usd / saved_per_request
