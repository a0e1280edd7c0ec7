"""A job's long PostgreSQL statements stay within what psycopg caches: it converts a
statement's placeholders once for a text of at most ``MAX_CACHED_STATEMENT_LENGTH``
characters and ``MAX_CACHED_STATEMENT_PARAMS`` parameters, and on every execution for a
longer one (~0.4 ms of CPU a job for the snapshot and the swap)."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg import _queries
from sqlalchemy import ClauseElement
from sqlalchemy.dialects.postgresql import psycopg

from db import job_lease, job_snapshot, job_swap


@pytest.mark.parametrize("statement", [job_snapshot.SNAPSHOT_STATEMENT,
                                       *job_lease._LEASED_SNAPSHOT_STATEMENTS.values(),
                                       job_swap._CHECKED_SWAP],
                         ids=["snapshot", "lease_and_snapshot", "take_over_and_snapshot", "swap"])
def test_a_jobs_one_statement_reads_and_writes_are_cached_by_psycopg(
    statement: ClauseElement,
) -> None:
    dialect: Any = psycopg.dialect()  # type: ignore[no-untyped-call]  # SQLAlchemy: no hints
    compiled: Any = statement.compile(dialect=dialect)
    assert len(str(compiled)) <= _queries.MAX_CACHED_STATEMENT_LENGTH
    assert len(compiled.binds) <= _queries.MAX_CACHED_STATEMENT_PARAMS
