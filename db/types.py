"""Column types that behave the same on PostgreSQL and SQLite.

UTC datetimes, identifiers in byte order, ids that autoincrement on both, and the two
kinds of JSON column (verbatim documents, and indexable data).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Dialect, Integer, String, TypeDecorator
from sqlalchemy.dialects.postgresql import JSONB

# BIGINT ids on PostgreSQL; SQLite only autoincrements an INTEGER PRIMARY KEY.
IdType = BigInteger().with_variant(Integer(), "sqlite")

# External ids sort by code point on both (SQLite compares bytes; PostgreSQL would
# otherwise use the database's locale), so keyset pages come out the same everywhere.
KeyString = String().with_variant(String(collation="C"), "postgresql")

# A document read back and handed out as given (message bodies, summaries, metadata):
# PostgreSQL's ``json`` keeps the text verbatim, where ``jsonb`` would reorder keys,
# reject "\u0000" and renormalize numbers.
JsonDocument = JSON()

# Data that is only queried (figures, the identifier index): ``jsonb`` on PostgreSQL.
JsonData = JSON().with_variant(JSONB(), "postgresql")


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on both databases; naive values are refused.

    SQLite has no timezone type: values are stored as naive UTC text (which sorts and
    compares correctly because every value is UTC) and come back marked UTC.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware UTC datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise TypeError(f"expected a datetime from the database, got {type(value).__name__}")
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)
