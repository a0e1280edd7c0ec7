"""The compaction core stays pure: importing it loads no broker, database, LLM or logging."""

from __future__ import annotations

import json
import pkgutil
import subprocess
import sys

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
