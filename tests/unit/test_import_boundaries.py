"""The scheduler and the worker reach the database through its public face only: they
import the names ``db.__all__`` lists, never a module of ``db`` (models, engine, queue)."""

from __future__ import annotations

import ast
from pathlib import Path

import db

REPO_ROOT = Path(__file__).resolve().parents[2]
OUTER_PACKAGES = ("scheduler", "worker")


def imports_around_the_face(source: str, public: set[str]) -> list[str]:
    """Every import in ``source`` that reaches into ``db`` past ``public``, by line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            # Even a bare `import db` lets `db.models.SessionRow` through as an attribute.
            found += [f"{node.lineno}: import {alias.name}" for alias in node.names
                      if alias.name == "db" or alias.name.startswith("db.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith("db."):
                found.append(f"{node.lineno}: from {node.module} import ...")
            elif node.module == "db":
                found += [f"{node.lineno}: from db import {alias.name}"
                          for alias in node.names if alias.name not in public]
    return found


def outer_modules() -> list[Path]:
    return sorted(path for package in OUTER_PACKAGES
                  for path in (REPO_ROOT / package).rglob("*.py"))


def test_scheduler_and_worker_import_from_db_only_the_names_of_its_public_face() -> None:
    modules = outer_modules()
    public = set(db.__all__)

    violations = [f"{path.relative_to(REPO_ROOT)}:{found}" for path in modules
                  for found in imports_around_the_face(path.read_text(encoding="utf-8"), public)]

    assert REPO_ROOT / "scheduler" / "cli" / "schedule.py" in modules
    assert REPO_ROOT / "worker" / "compaction" / "breaker.py" in modules
    assert violations == []


def test_every_name_of_the_public_face_resolves_once() -> None:
    assert len(db.__all__) == len(set(db.__all__))
    assert [name for name in db.__all__ if not hasattr(db, name)] == []


def test_the_walk_finds_every_way_past_the_face_in_functions_too() -> None:
    source = "\n".join([
        "import db",
        "import db.models",
        "from db.engine import create_db_engine",
        "from db import Store, translate_errors",
        "def later():",
        "    from db.queue import QueueMarkers",
        "from dbx import anything",
        "from . import db",
    ])

    found = imports_around_the_face(source, public={"Store"})

    assert found == [
        "1: import db", "2: import db.models", "3: from db.engine import ...",
        "4: from db import translate_errors", "6: from db.queue import ...",
    ]
