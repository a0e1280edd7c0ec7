"""The durable session store: tables, migrations, and the store API.

This module is the package's public face: code outside ``db/`` imports from ``db`` only
(``from db import Store, NewMessage``), never from its modules; a test walks the imports.

The error tree and the plain records load with the package; the names that need
SQLAlchemy or alembic (the store, the engine, migrations, the queries' row types) load on
first use (PEP 562 ``__getattr__``), so a process that only names a store error, or a
`compactor --help`, does not import them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from db.errors import (
    LeaseLost,
    MessagePinned,
    PoolerRefusedStartup,
    RevisionConflict,
    RevisionNotFound,
    SchemaLockTimeout,
    SchemaMissing,
    SessionExists,
    SessionLeased,
    SessionNotFound,
    StoreError,
    StoreUnavailable,
)
from db.records import (
    NO_GATE,
    ArtifactRecord,
    BreakerUpdate,
    DeletedSession,
    GcBatch,
    GcPolicy,
    IndexedMessage,
    JobSnapshot,
    MessageRecord,
    MessageText,
    NewMessage,
    NewRevision,
    NewRun,
    RecallHit,
    RevisionRecord,
    RevisionSizes,
    RunRecord,
    SessionState,
    SnapshotGate,
    StoredMention,
    ToolCallState,
    decode_mention_lists,
)

if TYPE_CHECKING:
    from db.engine import create_db_engine, with_postgres_timeouts
    from db.lifecycle import SESSION_TABLES
    from db.migrate import (
        check_schema,
        current_revision,
        downgrade_database,
        head_revision,
        known_revisions,
        upgrade_database,
    )
    from db.queue import (
        MarkResult,
        MarkStatus,
        QueueMarkers,
    )
    from db.reconcile import HeldSession
    from db.scan import (
        DueCriteria,
        DueCursor,
        DuePage,
        DueRow,
        DueWhy,
        Exclusion,
    )
    from db.store import Store

_LAZY_MODULES = {
    "create_db_engine": "db.engine",
    "with_postgres_timeouts": "db.engine",
    "HeldSession": "db.reconcile",
    "SESSION_TABLES": "db.lifecycle",
    "check_schema": "db.migrate",
    "current_revision": "db.migrate",
    "downgrade_database": "db.migrate",
    "head_revision": "db.migrate",
    "known_revisions": "db.migrate",
    "upgrade_database": "db.migrate",
    "MarkResult": "db.queue",
    "MarkStatus": "db.queue",
    "QueueMarkers": "db.queue",
    "DueCriteria": "db.scan",
    "DueCursor": "db.scan",
    "DuePage": "db.scan",
    "DueRow": "db.scan",
    "DueWhy": "db.scan",
    "Exclusion": "db.scan",
    "Store": "db.store",
}


def __getattr__(name: str) -> Any:
    module = _LAZY_MODULES.get(name)
    if module is None:
        raise AttributeError(f"module 'db' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is an ordinary global
    return value


__all__ = [
    "NO_GATE",
    "SESSION_TABLES",
    "ArtifactRecord",
    "BreakerUpdate",
    "DeletedSession",
    "DueCriteria",
    "DueCursor",
    "DuePage",
    "DueRow",
    "DueWhy",
    "Exclusion",
    "GcBatch",
    "GcPolicy",
    "HeldSession",
    "IndexedMessage",
    "JobSnapshot",
    "LeaseLost",
    "MarkResult",
    "MarkStatus",
    "MessagePinned",
    "MessageRecord",
    "MessageText",
    "NewMessage",
    "NewRevision",
    "NewRun",
    "PoolerRefusedStartup",
    "QueueMarkers",
    "RecallHit",
    "RevisionConflict",
    "RevisionNotFound",
    "RevisionRecord",
    "RevisionSizes",
    "RunRecord",
    "SchemaLockTimeout",
    "SchemaMissing",
    "SessionExists",
    "SessionLeased",
    "SessionNotFound",
    "SessionState",
    "SnapshotGate",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "StoredMention",
    "ToolCallState",
    "check_schema",
    "create_db_engine",
    "current_revision",
    "decode_mention_lists",
    "downgrade_database",
    "head_revision",
    "known_revisions",
    "upgrade_database",
    "with_postgres_timeouts",
]
