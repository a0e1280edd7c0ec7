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
    ArtifactRecord,
    BreakerUpdate,
    IndexedMessage,
    MessageRecord,
    NewMessage,
    NewRevision,
    NewRun,
    RecallHit,
    RevisionRecord,
    RunRecord,
    SessionState,
    Snapshot,
    StoredMention,
    ToolCallState,
)
from db.scan import DueCriteria, DueCursor, DuePage, DueRow, DueWhy
from db.store import Store

__all__ = [
    "SESSION_TABLES",
    "ArtifactRecord",
    "BreakerUpdate",
    "DeletedSession",
    "DueCriteria",
    "DueCursor",
    "DuePage",
    "DueRow",
    "DueWhy",
    "GcBatch",
    "GcPolicy",
    "IndexedMessage",
    "LeaseLost",
    "MarkResult",
    "MarkStatus",
    "MessagePinned",
    "MessageRecord",
    "NewMessage",
    "NewRevision",
    "NewRun",
    "QueueMarkers",
    "RecallHit",
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
    "StoredMention",
    "ToolCallState",
    "check_schema",
    "create_db_engine",
    "current_revision",
    "downgrade_database",
    "head_revision",
    "upgrade_database",
]
