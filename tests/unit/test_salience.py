"""Salience: what the summary shows first. Errors that ended a call and featured values
lead, then values a user or the assistant said, then tool-only ones, tool names last;
within a tier an error code, then the newest, then the rarer value."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.unit.session_strategies import shared_counter, to_stored
from tests.unit.test_fallback import exchange
from worker.compaction.grouping import group_messages
from worker.compaction.identifiers import Artifact, extract_identifiers
from worker.compaction.outcomes import find_failures
from worker.compaction.salience import (
    failure_values,
    featured_values,
    rank_artifacts,
    rerank_featured,
)


def artifact(value: str, kind: str = "id", *, count: int = 1, seq: int = 1,
             sources: tuple[str, ...] = ("user",)) -> Artifact:
    return Artifact(value, kind, count, seq, seq, frozenset(sources))


def test_said_values_outrank_tool_only_ones_however_often_a_tool_repeats_them() -> None:
    listed = artifact("HAT001", count=50, seq=9, sources=("tool_output",))
    said = artifact("ZFA04Y", count=1, seq=2)
    tool = artifact("get_user_details", "tool", count=9, sources=("tool_argument",))
    assert rank_artifacts([tool, listed, said]) == (said, listed, tool)


def test_featured_values_lead_and_error_codes_lead_their_tier() -> None:
    said = artifact("mia_li_3668", seq=9)
    error = artifact("ERR-3001", "error", seq=3, sources=("tool_output",))
    pinned = artifact("sqlalchemy==2.0.1", "version", seq=1, sources=("assistant",))
    ranked = rank_artifacts([said, pinned, error], featured={"ERR-3001", "sqlalchemy==2.0.1"})
    assert ranked == (error, pinned, said)


def test_within_a_tier_the_newest_then_the_rarer_value_comes_first() -> None:
    old, new = artifact("OLD001", seq=1), artifact("NEW001", seq=8)
    common, rare = artifact("COMMON1", count=12, seq=5), artifact("RARE001", count=1, seq=5)
    assert rank_artifacts([old, common, rare, new]) == (new, rare, common, old)


def test_a_bare_number_only_a_tool_returned_follows_the_typed_values_of_its_tier() -> None:
    item = artifact("1326618788", seq=9, sources=("tool_output",))
    email = artifact("omar.garcia51@example.org", "email", seq=2, sources=("tool_output",))
    said_number = artifact("4410", seq=1, sources=("user",))
    assert rank_artifacts([item, email, said_number]) == (said_number, email, item)


_KINDS = st.sampled_from(["id", "error", "tool", "version"])
_SOURCES = st.sampled_from([("user",), ("tool_output",), ("tool_argument",),
                            ("assistant", "tool_output")])


@given(st.lists(st.tuples(st.sampled_from(["A1", "B22", "333", "ERR-9", "x.py", "run"]),
                          _KINDS, st.integers(1, 5), st.integers(1, 9), _SOURCES),
                unique_by=lambda spec: spec[0]),
       st.sets(st.sampled_from(["A1", "B22", "333", "ERR-9", "x.py", "run"])),
       st.sets(st.sampled_from(["A1", "B22", "333", "ERR-9", "x.py", "run"])))
def test_featuring_more_values_of_a_ranking_ranks_as_ranking_anew(
        specs: list[tuple[str, str, int, int, tuple[str, ...]]], first: set[str],
        more: set[str]) -> None:
    artifacts = [artifact(value, kind, count=count, seq=seq, sources=sources)
                 for value, kind, count, seq, sources in specs]
    ranked = rank_artifacts(artifacts, featured=first)
    featured = first | more
    assert rerank_featured(ranked, featured) == rank_artifacts(artifacts, featured=featured)


def test_the_error_codes_on_a_failed_calls_last_lines_are_its_failure_values() -> None:
    messages = exchange("c1", "run_tests", {"target": "src/db.py"},
                        "FAILED tests/test_db.py::test_up - ERR-3283: bad row\n"
                        "=== 1 failed, 2 passed ===")
    decided = ["Decision: pin sqlalchemy==2.0.1 for ticket OPS-12"]
    stored = to_stored([*messages, {"role": "assistant", "content": decided[0]}],
                       shared_counter())
    artifacts = extract_identifiers(stored)
    [failure] = find_failures(group_messages(stored))
    assert (failure.call_id, failure.tool) == ("c1", "run_tests")
    # The span's index says which values are error codes: the lines are not scanned again.
    assert failure_values([failure], artifacts) == {"ERR-3283"}
    assert {"ERR-3283", "OPS-12", "sqlalchemy==2.0.1"} <= featured_values(
        [failure], decided, artifacts)
    assert "src/db.py" not in featured_values([failure], decided, artifacts)
