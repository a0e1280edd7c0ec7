"""The inspection of raw queue items: each defect is named, a valid message passes with
the scheduling headers producers may not set dropped, the service's task names are
exactly the tasks the app registers."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.raw_producer import build_raw_message
from worker.broker.contract import MAX_HEADERS_CHARS, SERVICE_TASK_NAMES, job_kwargs
from worker.broker.queue_items import (
    MAX_NESTING_DEPTH,
    REENCODED_GROWTH,
    ItemLimits,
    ItemRejected,
    admit_item,
    admit_item_bytes,
    nesting_depth,
)
from worker.broker.transport import registered_task_names

LIMITS = ItemLimits(max_item_bytes=100_000, max_eta_s=60)
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def valid() -> dict[str, Any]:
    return build_raw_message(job_kwargs("s-1", "test"), queue="q", task_id="t-1")


def raw(message: Any) -> bytes:
    return json.dumps(message).encode()


def changed(**changes: Any) -> bytes:
    message = valid()
    message.update(changes)
    return raw(message)


def with_headers(**headers: Any) -> bytes:
    message = valid()
    message["headers"].update(headers)
    return raw(message)


def with_properties(**properties: Any) -> bytes:
    message = valid()
    message["properties"].update(properties)
    return raw(message)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(("item", "reason"), [
    (b"x" * 100_001, "oversized_item"),
    (b"\x00\xffgarbage", "unreadable_item"),
    (b"{not json", "unreadable_item"),
    (nested(40_000).encode(), "nested_too_deep"),
    (nested(MAX_NESTING_DEPTH + 1).encode(), "nested_too_deep"),
    (b"[1, 2, 3]", "not_an_envelope"),
    (b'{"hello": "world"}', "not_an_envelope"),
    (changed(headers=None), "invalid_headers"),
    (changed(headers="compactor.compact_session"), "invalid_headers"),
    (with_headers(id=None), "invalid_headers"),
    (with_headers(id="i" * 5_000), "oversized_header"),
    (with_headers(origin="o" * 50_000), "oversized_header"),
    (with_headers(retries="1"), "invalid_headers"),
    (with_headers(retries=True), "invalid_headers"),
    (with_headers(stamps=[]), "invalid_headers"),
    (with_properties(delivery_tag=None), "invalid_properties"),
    (with_properties(delivery_info="q"), "invalid_properties"),
    (with_properties(correlation_id="c" * 50_000), "oversized_header"),
    (with_headers(task="celery.accumulate"), "unknown_task"),
    (with_headers(task=None), "unknown_task"),
    (changed(**{"content-type": "application/x-python-serialize"}), "undecodable_message"),
    (changed(body=None), "bad_body"),
    (changed(body=12), "bad_body"),
    (changed(body="!!! not base64"), "bad_base64"),
    (changed(body=base64.b64encode(b'"just a string"').decode()), "bad_body"),
    (changed(body=base64.b64encode(b'[[], {}]').decode()), "bad_body"),
    (changed(body=base64.b64encode(b'[{}, [], null]').decode()), "bad_body"),
    (changed(body=base64.b64encode(b"not JSON {").decode()), "undecodable_message"),
    (changed(body=base64.b64encode(nested(10_000).encode()).decode()), "nested_too_deep"),
])
def test_each_defective_item_is_rejected_with_the_reason_naming_its_defect(
    item: bytes, reason: str,
) -> None:
    with pytest.raises(ItemRejected) as rejected:
        admit_item(item, LIMITS, NOW)
    assert rejected.value.reason == reason
    assert len(rejected.value.detail) <= 300


def test_an_oversized_id_is_never_reported_as_the_task_id() -> None:
    with pytest.raises(ItemRejected) as rejected:
        admit_item(with_headers(id="i" * 5_000), LIMITS, NOW)
    assert rejected.value.task_id is None


def test_a_valid_message_passes_with_producer_scheduling_headers_dropped() -> None:
    item = with_headers(eta=(NOW + timedelta(days=1)).isoformat(), countdown=5,
                        expires=NOW.isoformat(), timelimit=[1, 1])

    headers = admit_item(item, LIMITS, NOW)["headers"]

    assert (headers["eta"], headers["expires"], headers["timelimit"]) == \
        (None, None, [None, None])
    assert "countdown" not in headers and headers["id"] == "t-1"


@pytest.mark.parametrize(("retries", "ahead_s", "kept"), [
    (1, 30, True), (1, 60, True), (1, 61, False), (0, 30, False), (None, 30, False),
])
def test_only_a_retry_due_within_the_horizon_keeps_its_eta(
    retries: Any, ahead_s: int, kept: bool,
) -> None:
    eta = (NOW + timedelta(seconds=ahead_s)).isoformat()

    headers = admit_item(with_headers(eta=eta, retries=retries), LIMITS, NOW)["headers"]

    assert (headers["eta"] == eta) is kept


@pytest.mark.parametrize(("value", "depth"), [
    (1, 0), ([], 1), ({"a": [1, {"b": []}]}, 4), ([[1], [[2]]], 3),
])
def test_nesting_depth_counts_lists_and_objects(value: Any, depth: int) -> None:
    assert nesting_depth(value) == depth


def test_the_service_task_names_are_the_tasks_the_app_registers() -> None:
    from worker.broker.celery_app import app

    app.loader.import_default_modules()
    registered = {name for name in app.tasks if not name.startswith("celery.")}
    assert registered == SERVICE_TASK_NAMES
    # What the transport admits in a worker of this app: these and nothing else. The
    # answer is the current app's, cached per process (a worker has one app); another
    # test's app may have been current and asked first.
    app.set_current()
    registered_task_names.cache_clear()
    assert registered_task_names() == SERVICE_TASK_NAMES


def test_an_item_naming_a_task_outside_the_limits_names_is_refused() -> None:
    item = raw(valid())
    limits = ItemLimits(max_item_bytes=1_000_000, max_eta_s=600,
                        task_names=frozenset({"bench.noop"}))
    assert admit_item(item, LIMITS, NOW)  # the service's own task passes by default

    with pytest.raises(ItemRejected) as refused:
        admit_item(item, limits, NOW)
    assert refused.value.reason == "unknown_task"



def test_an_item_with_nothing_to_neutralize_passes_as_its_own_bytes() -> None:
    item = raw(valid())

    assert admit_item_bytes(item, LIMITS, NOW) is item


@pytest.mark.parametrize("item", [
    with_headers(countdown=5),
    with_headers(expires=NOW.isoformat()),
    with_headers(eta=(NOW + timedelta(days=1)).isoformat(), retries=1),
    raw(valid()).decode().encode("utf-16"),  # json.loads reads it; kombu would not
    json.dumps(valid(), ensure_ascii=False).replace('"t-1"', '"t-é"').encode(),
])
def test_an_item_neutralized_or_not_plain_ascii_passes_encoded_again(item: bytes) -> None:
    admitted = admit_item_bytes(item, LIMITS, NOW)

    assert admitted != item and admitted.isascii()
    assert json.loads(admitted) == admit_item(item, LIMITS, NOW)


JSON_VALUES = st.recursive(
    st.none() | st.integers() | st.text(alphabet="[]{}ab", max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner,
                                                               max_size=3),
    max_leaves=60)


@given(JSON_VALUES, st.integers(min_value=0, max_value=MAX_NESTING_DEPTH + 2))
def test_a_body_is_refused_exactly_when_it_nests_too_deep(value: Any, wrap: int) -> None:
    for _ in range(wrap):
        value = [value]
    message = valid()
    message["body"] = base64.b64encode(json.dumps([[], {"v": value}, None]).encode()).decode()

    try:
        admit_item(raw(message), LIMITS, NOW)
    except ItemRejected as rejected:
        assert rejected.reason == "nested_too_deep"
        assert nesting_depth([[], {"v": value}, None]) > MAX_NESTING_DEPTH
    else:
        assert nesting_depth([[], {"v": value}, None]) <= MAX_NESTING_DEPTH


# JSON text as producers may write it: any spacing, numbers in every form the grammar
# allows (exponents included), strings with raw UTF-8 and escapes of every kind.
_SPACE = st.sampled_from(["", " ", "\n\t "])
_NUMBER_TEXT = st.from_regex(r"-?(0|[1-9][0-9]{0,3})(\.[0-9]{1,3})?([eE][+-]?[0-9]{1,3})?",
                             fullmatch=True)
_STRING_TEXT = st.lists(st.one_of(
    st.characters(blacklist_categories=["Cs", "Cc"], blacklist_characters='"\\'),
    st.sampled_from(['\\"', "\\\\", "\\/", "\\n", "\\u00e9", "\\ud83d\\ude00", "\\u0001"]),
), max_size=6).map(lambda parts: '"' + "".join(parts) + '"')


def _json_text(leaves: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    def joined(items: list[str], opening: str, closing: str, space: str) -> str:
        return opening + space + f"{space},{space}".join(items) + space + closing

    return st.recursive(leaves, lambda inner: (
        st.builds(joined, st.lists(inner, max_size=4), st.just("["), st.just("]"), _SPACE)
        | st.builds(joined, st.lists(st.builds(lambda key, space, value: f"{key}{space}:{value}",
                                              _STRING_TEXT, _SPACE, inner), max_size=4),
                    st.just("{"), st.just("}"), _SPACE)), max_leaves=30)


JSON_TEXTS = _json_text(_NUMBER_TEXT | _STRING_TEXT | st.sampled_from(["true", "null"]))


@given(JSON_TEXTS, st.sampled_from(["utf-8", "utf-16"]))
def test_json_dumps_never_writes_a_parsed_value_more_than_the_growth_bound_longer(
        text: str, encoding: str) -> None:
    """What lets admission skip re-encoding the headers and properties of a small item."""
    item = text.encode(encoding)
    assert len(json.dumps(json.loads(item))) <= REENCODED_GROWTH * len(item)


@pytest.mark.parametrize("value", ["1e15", "1E15", "-1e15", "1e9", "1e400", '"\\u00e9"',
                                   '"é"', '"😀"', "[1,1,1]", '{"a":1e15}'])
def test_the_growth_bound_holds_for_the_texts_that_grow_most(value: str) -> None:
    item = value.encode()
    assert len(json.dumps(json.loads(item))) <= REENCODED_GROWTH * len(item)


@pytest.mark.parametrize("item", [with_headers(origin="o" * MAX_HEADERS_CHARS),
                                  with_properties(reply_to="r" * MAX_HEADERS_CHARS)])
def test_headers_or_properties_just_over_the_limit_are_refused(item: bytes) -> None:
    with pytest.raises(ItemRejected) as refused:
        admit_item(item, LIMITS, NOW)

    assert refused.value.reason == "oversized_header"
