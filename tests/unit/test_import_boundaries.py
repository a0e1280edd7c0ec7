"""Packages meet at their public faces: code outside a faced package imports the names its
``__init__`` lists in ``__all__`` (or, for ``worker``, the modules it lists), never a
module behind the face. The database is reached only through ``db``, the core only
through ``worker.compaction``, the summarizers only through ``worker.summarizers``."""

from __future__ import annotations

import ast
import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pytest

import worker

REPO_ROOT = Path(__file__).resolve().parents[2]
OUTER_PACKAGES = ("scheduler", "worker")


@dataclass(frozen=True)
class Face:
    """A package, the names it exports, and the modules behind it that may still be named."""

    package: str
    allowed_modules: frozenset[str] = frozenset()

    @property
    def public(self) -> set[str]:
        return set(importlib.import_module(self.package).__all__)

    @property
    def folder(self) -> Path:
        return REPO_ROOT.joinpath(*self.package.split("."))


FACES = (
    Face("db"),
    Face("worker.compaction"),
    # The LLM summarizer loads the OpenAI SDK: it is imported by its module, and only
    # where it is configured.
    Face("worker.summarizers", frozenset({"worker.summarizers.llm",
                                          "worker.summarizers.openai_client",
                                          "worker.summarizers.openai_batch",
                                          "worker.summarizers.batch_replay"})),
)

# Which part of the worker may import which (``db`` is the database's face). A new arrow is
# a design decision: add it here on purpose, or move the code.
WORKER_PARTS_MAY_IMPORT: dict[str, set[str]] = {
    "compaction": set(),
    "logging": {"compaction", "scrub"},
    "memory": set(),
    "metrics": set(),
    "scrub": set(),
    "tracing": set(),
    "tokenizer": {"compaction"},
    "errors": {"compaction", "db", "job"},
    "settings": {"compaction", "db", "logging", "scrub"},
    "summarizers": {"compaction", "errors", "logging", "scrub", "shared_state", "tokenizer",
                    "tracing"},
    "shared_state": {"broker", "compaction", "db", "errors", "logging"},
    "job": {"compaction", "db", "errors", "logging", "metrics", "summarizers", "tracing"},
    "platform": {"broker", "compaction", "db", "errors", "logging", "settings", "tokenizer"},
    "checks": {"compaction", "db", "errors", "scrub", "settings", "shared_state", "summarizers",
               "tokenizer"},
    "metrics_state": {"db", "logging", "settings", "shared_state"},
    "runtime": {"compaction", "db", "job", "settings", "shared_state", "summarizers", "tokenizer"},
    "broker": {"checks", "compaction", "db", "errors", "job", "logging", "memory", "metrics",
               "metrics_state", "runtime", "settings", "shared_state", "tracing"},
}
MAX_WORKER_ROOT_MODULES = 8


def imports_around_the_face(source: str, face: Face, public: set[str]) -> list[str]:
    """Every import in ``source`` that reaches into ``face.package`` past ``public``."""
    package, found = face.package, []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            # Even a bare `import db` lets `db.models.SessionRow` through as an attribute.
            found += [f"{node.lineno}: import {alias.name}" for alias in node.names
                      if alias.name == package or alias.name.startswith(f"{package}.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if (node.module.startswith(f"{package}.")
                    and node.module not in face.allowed_modules):
                found.append(f"{node.lineno}: from {node.module} import ...")
            elif node.module == package:
                found += [f"{node.lineno}: from {package} import {alias.name}"
                          for alias in node.names if alias.name not in public]
    return found


def outer_modules() -> list[Path]:
    return sorted(path for package in OUTER_PACKAGES
                  for path in (REPO_ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("face", FACES, ids=lambda face: face.package)
def test_code_outside_a_package_imports_only_the_names_of_its_public_face(face: Face) -> None:
    modules = [path for path in outer_modules() if not path.is_relative_to(face.folder)]
    public = face.public

    violations = [f"{path.relative_to(REPO_ROOT)}:{found}" for path in modules
                  for found in imports_around_the_face(path.read_text(encoding="utf-8"),
                                                       face, public)]

    assert REPO_ROOT / "scheduler" / "cli" / "schedule.py" in modules
    assert violations == []


def test_the_scheduler_imports_only_the_modules_the_worker_lists() -> None:
    public = set(worker.__all__)
    used = {(path.relative_to(REPO_ROOT), node.module)
            for path in (REPO_ROOT / "scheduler").rglob("*.py")
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.ImportFrom) and node.module
            and node.module.startswith("worker.")}

    assert used, "the walk found no import of the worker at all"
    assert sorted((str(path), module) for path, module in used
                  if module.split(".")[1] not in public) == []


def worker_part(path: Path) -> str:
    """The part of the worker a file belongs to: its subpackage, or its root module."""
    return path.relative_to(REPO_ROOT / "worker").parts[0].removesuffix(".py")


def imported_parts(source: str) -> set[str]:
    """The parts of the worker (and ``db``) that ``source`` imports."""
    parts = set()
    for node in ast.walk(ast.parse(source)):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module] if isinstance(node, ast.ImportFrom) and node.module
                 and node.level == 0 else [])
        for name in names:
            head, _, rest = name.partition(".")
            if head == "db":
                parts.add("db")
            elif head == "worker" and rest:
                parts.add(rest.split(".")[0])
    return parts


def test_each_part_of_the_worker_imports_only_the_parts_it_may() -> None:
    found: dict[str, set[str]] = {}
    for path in (REPO_ROOT / "worker").rglob("*.py"):
        if path.parent == REPO_ROOT / "worker" and path.name == "__init__.py":
            continue
        part = worker_part(path)
        found.setdefault(part, set()).update(
            imported_parts(path.read_text(encoding="utf-8")) - {part})

    assert set(found) == set(WORKER_PARTS_MAY_IMPORT), "a part is missing from the table"
    assert {part: sorted(used - WORKER_PARTS_MAY_IMPORT[part])
            for part, used in found.items()
            if used - WORKER_PARTS_MAY_IMPORT[part]} == {}


def test_the_worker_root_holds_few_modules_and_roles_have_their_folders() -> None:
    root = REPO_ROOT / "worker"
    modules = sorted(p.name for p in root.glob("*.py") if p.name != "__init__.py")
    folders = {p.name for p in root.iterdir() if (p / "__init__.py").exists()}

    assert len(modules) <= MAX_WORKER_ROOT_MODULES, modules
    assert {"compaction", "job", "summarizers", "platform", "shared_state", "broker",
            "settings"} <= folders


@pytest.mark.parametrize("package", [face.package for face in FACES] + ["worker"])
def test_every_name_of_a_public_face_resolves_once(package: str) -> None:
    module = importlib.import_module(package)
    names = list(module.__all__)

    assert len(names) == len(set(names))
    unresolved = [name for name in names
                  if not hasattr(module, name)
                  and importlib.util.find_spec(f"{package}.{name}") is None]
    assert unresolved == []


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

    found = imports_around_the_face(source, Face("db"), public={"Store"})

    assert found == [
        "1: import db", "2: import db.models", "3: from db.engine import ...",
        "4: from db import translate_errors", "6: from db.queue import ...",
    ]


def test_the_walk_lets_a_named_module_behind_the_face_through() -> None:
    source = "\n".join(["from worker.summarizers.llm import LLMSummarizer",
                        "from worker.summarizers.base import X"])
    face = Face("worker.summarizers", frozenset({"worker.summarizers.llm"}))

    assert imports_around_the_face(source, face, public=set()) == [
        "2: from worker.summarizers.base import ..."]
