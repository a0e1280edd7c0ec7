"""The durable session store: tables, migrations, and the store API.

This module is the package's public face: code outside ``db/`` imports from ``db`` only
(``from db import Store, NewMessage``), never from its modules; a test walks the imports.
"""

from db.engine import create_db_engine
from db.errors import (
    LeaseLost,
    RevisionConflict,
    RevisionNotFound,
    SchemaMissing,
    SessionExists,
    SessionNotFound,
    StoreError,
    StoreUnavailable,
)
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
    ToolCallState,
)
from db.scan import DueCriteria, DueCursor, DuePage, DueRow, DueWhy
from db.store import Store

__all__ = [
    "BreakerUpdate",
    "DueCriteria",
    "DueCursor",
    "DuePage",
    "DueRow",
    "DueWhy",
    "LeaseLost",
    "MarkResult",
    "MarkStatus",
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
    "SessionNotFound",
    "SessionState",
    "Snapshot",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "ToolCallState",
    "check_schema",
    "create_db_engine",
    "current_revision",
    "downgrade_database",
    "head_revision",
    "upgrade_database",
]
