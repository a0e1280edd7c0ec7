"""The house rule on module size (docs/STYLE.md: one concept per module, around 300 lines,
400 at most), held for every module of the service: the worker, the scheduler and the
database package."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_MODULE_LINES = 400
PACKAGES = ("worker", "scheduler", "db")


def test_no_module_of_the_service_is_over_400_lines() -> None:
    sizes = {str(path.relative_to(REPO_ROOT)): len(path.read_text(encoding="utf-8").splitlines())
             for package in PACKAGES for path in (REPO_ROOT / package).rglob("*.py")
             if "versions" not in path.parts}

    assert len(sizes) > 100, "the packages were not found"
    assert {module: lines for module, lines in sizes.items() if lines > MAX_MODULE_LINES} == {}
