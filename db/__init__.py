"""The durable session store: tables, migrations, and the store API.

This module is the package's public face: code outside ``db/`` imports from ``db`` only
(``from db import Store, NewMessage``), never from its modules; a test walks the imports.
"""

from db.engine import create_db_engine
from db.errors import (
    LeaseLost,
    MessagePinned,
    RevisionConflict,
    RevisionNotFound,
    SchemaMissing,
    SessionExists,
    SessionLeased,
    SessionNotFound,
    StoreError,
    StoreUnavailable,
)
from db.lifecycle import SESSION_TABLES, DeletedSession, GcBatch, GcPolicy
from db.migrate import (
    check_schema,
    current_revision,
    downgrade_database,
    head_revision,
    upgrade_database,
)
from db.queue import MarkResult, MarkStatus, QueueMarkers
from db.records import (
    BreakerUpdate,
    MessageRecord,
    NewMessage,
    NewRevision,
    NewRun,
    RevisionRecord,
    RunRecord,
    SessionState,
    Snapshot,
)
from db.scan import DueCriteria, DueCursor, DuePage, DueRow, DueWhy
from db.store import Store

__all__ = [
    "SESSION_TABLES",
    "BreakerUpdate",
    "DeletedSession",
    "DueCriteria",
    "DueCursor",
    "DuePage",
    "DueRow",
    "DueWhy",
    "GcBatch",
    "GcPolicy",
    "LeaseLost",
    "MarkResult",
    "MarkStatus",
    "MessagePinned",
    "MessageRecord",
    "NewMessage",
    "NewRevision",
    "NewRun",
    "QueueMarkers",
    "RevisionConflict",
    "RevisionNotFound",
    "RevisionRecord",
    "RunRecord",
    "SchemaMissing",
    "SessionExists",
    "SessionLeased",
    "SessionNotFound",
    "SessionState",
    "Snapshot",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "check_schema",
    "create_db_engine",
    "current_revision",
    "downgrade_database",
    "head_revision",
    "upgrade_database",
]
