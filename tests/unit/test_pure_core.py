"""The compaction core stays pure: importing it loads no broker, database, LLM or logging,
and its modules import nothing that reaches files, the environment or the clock."""

from __future__ import annotations

import ast
import importlib.util
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import worker.compaction

FORBIDDEN = (
    "celery", "kombu", "redis", "sqlalchemy", "openai", "structlog", "httpx",
    "worker.settings.config",
)
PROBE = """
import importlib, json, pkgutil, sys
import worker.compaction
names = [info.name for info in pkgutil.iter_modules(worker.compaction.__path__,
                                                     "worker.compaction.")]
for name in names:
    importlib.import_module(name)
print(json.dumps({"imported": names, "loaded": sorted(sys.modules)}))
"""


def test_every_core_module_imports_without_side_effect_libraries() -> None:
    completed = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    report = json.loads(completed.stdout)
    expected = {info.name for info in pkgutil.iter_modules(worker.compaction.__path__)}
    assert {name.rsplit(".", 1)[1] for name in report["imported"]} == expected
    assert {"grouping", "plan", "pruning", "chunking", "strategies", "breaker"} <= expected
    leaked = [
        module for module in report["loaded"]
        if any(module == name or module.startswith(name + ".") for name in FORBIDDEN)
    ]
    assert leaked == []


# The standard library's doors to files, the environment, processes and the clock.
IO_MODULES = ("os", "pathlib", "io", "tempfile", "shutil", "marshal", "gzip", "subprocess",
              "socket", "time", "importlib.resources", "sys")


def test_no_core_module_imports_the_standard_librarys_files_environment_or_clock() -> None:
    found = []
    for module in pkgutil.iter_modules(worker.compaction.__path__, "worker.compaction."):
        spec = importlib.util.find_spec(module.name)
        assert spec is not None and spec.origin is not None
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module
                     else [])
            found += [f"{module.name}: {name}" for name in names
                      if any(name == io or name.startswith(io + ".") for io in IO_MODULES)]

    assert found == []
