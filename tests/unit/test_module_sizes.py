"""The house rule on module size (docs/STYLE.md: one concept per module, under 400 lines),
held for the database package, whose store and job statements were split by area and
step to keep it."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_MODULE_LINES = 400


def test_no_module_of_the_database_package_is_over_400_lines() -> None:
    sizes = {str(path.relative_to(REPO_ROOT)): len(path.read_text(encoding="utf-8").splitlines())
             for path in (REPO_ROOT / "db").rglob("*.py") if "versions" not in path.parts}

    assert len(sizes) > 20, "the package was not found"
    assert {module: lines for module, lines in sizes.items() if lines > MAX_MODULE_LINES} == {}
