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
)
from db.scan import DueCriteria, DueCursor, DuePage, DueRow, DueWhy
from db.store import Store

__all__ = [
    "ArtifactRecord",
    "BreakerUpdate",
    "DueCriteria",
    "DueCursor",
    "DuePage",
    "DueRow",
    "DueWhy",
    "IndexedMessage",
    "LeaseLost",
    "MarkResult",
    "MarkStatus",
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
    "SessionNotFound",
    "SessionState",
    "Snapshot",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "StoredMention",
    "check_schema",
    "create_db_engine",
    "current_revision",
    "downgrade_database",
    "head_revision",
    "upgrade_database",
]
