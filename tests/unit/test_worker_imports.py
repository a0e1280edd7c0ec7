"""A pool child inherits every module its worker's main process loaded before the fork:
the worker's entry (``worker.broker.serve``) loads none that a job never uses. The guard that
keeps the child's baseline (``bench/memory_bench.py`` measures it), not a timing test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from tests.support.worker_process import REPO_ROOT

# Modules (any of their submodules counts) no job uses: the command line and its help
# (typer, rich, pygments, prompt_toolkit), the migrations (alembic, mako), and the
# scheduler's code, which its tasks import on their first run.
NEVER_IN_A_POOL_CHILD = ("typer", "rich", "pygments", "prompt_toolkit", "alembic", "mako",
                         "scheduler.cli", "scheduler.beat", "scheduler.reconcile",
                         "scheduler.enqueue", "scheduler.selection")

# The main process's steps up to the fork: the entry's import guards, Celery's worker
# command, the app with its tasks, and the state every child shares (LLM summarizer, so
# the SDK is loaded as well).
MAIN_PROCESS_UNTIL_THE_FORK = textwrap.dedent("""
    import json, sys
    from worker.broker.serve import keep_out_terminal_only_modules
    keep_out_terminal_only_modules()
    import celery.bin.worker
    from worker.broker.celery_app import app
    from worker.runtime import share_before_fork
    from worker.settings.config import get_settings
    app.loader.import_default_modules()
    assert "compactor.scan" in app.tasks and "compactor.reconcile" in app.tasks
    share_before_fork(get_settings())
    print(json.dumps([name for name, module in sys.modules.items() if module is not None]))
""")


def modules_at_the_fork() -> set[str]:
    env = {**os.environ, "COMPACTOR_DATABASE_URL": "sqlite://", "COMPACTOR_SUMMARIZER": "llm",
           "COMPACTOR_LLM_BASE_URL": "http://127.0.0.1:9/v1"}
    done = subprocess.run([sys.executable, "-P", "-c", MAIN_PROCESS_UNTIL_THE_FORK],
                          capture_output=True, text=True, timeout=120, check=False, env=env,
                          cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return set(loaded)


def test_the_worker_process_loads_no_module_a_job_never_uses_before_the_fork() -> None:
    loaded = modules_at_the_fork()

    assert {"worker.job.pipeline", "scheduler.tasks", "openai"} <= loaded  # the probe ran
    assert sorted(name for name in loaded
                  if name.startswith(tuple(f"{never}." for never in NEVER_IN_A_POOL_CHILD))
                  or name in NEVER_IN_A_POOL_CHILD) == []
