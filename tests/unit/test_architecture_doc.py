"""docs/ARCHITECTURE.md's module table stays true to the tree: every module of the
service is named there (by its path, a folder row or a glob), and every path it names
exists."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DOC = REPO_ROOT / "docs" / "ARCHITECTURE.md"
PACKAGES = ("worker", "scheduler", "db")
PATH_IN_BACKTICKS = re.compile(r"`((?:worker|scheduler|db|deploy)/[^`\s]*)`")


def table_paths() -> set[str]:
    """The paths the module table's first column names."""
    rows = [line for line in DOC.read_text(encoding="utf-8").splitlines()
            if line.startswith("| `")]
    return {path for row in rows for path in PATH_IN_BACKTICKS.findall(row.split(" | ")[0])}


def service_modules() -> list[str]:
    return sorted(str(path.relative_to(REPO_ROOT)) for package in PACKAGES
                  for path in (REPO_ROOT / package).rglob("*.py")
                  if path.name != "__init__.py" and "versions" not in path.parts)


def is_named(module: str, named: set[str]) -> bool:
    return any(module == path or (path.endswith("/") and module.startswith(path))
               or fnmatch.fnmatch(module, path) for path in named)


def test_every_module_of_the_service_has_a_row_in_the_architecture_table() -> None:
    named = table_paths()

    assert len(named) > 40, "the table was not found"
    assert [module for module in service_modules() if not is_named(module, named)] == []


def test_every_path_the_architecture_table_names_exists() -> None:
    missing = [path for path in table_paths()
               if not any(REPO_ROOT.glob(path.rstrip("/")))]

    assert missing == []
