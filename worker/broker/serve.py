"""`compactor worker`'s process: Celery's worker command on the service's app. The CLI
parses the options, then execs ``python -P -m worker.broker.serve <Celery's worker options>``, so
that the pool's children inherit none of the command line's modules (typer, rich, every
command's imports) with the rest of their parent's memory."""

from __future__ import annotations

import sys

from worker.tracing.spans import is_tracing_configured

# Optional imports that only dress output for a terminal, which a worker never writes to:
# structlog's console tracebacks (rich, with pygments and attrs, in every child) and
# the highlighted results of Celery's inspection commands (``celery.bin.base``: pygments).
# Both libraries import them in ``try: ... except ImportError``, and a name bound to None
# in ``sys.modules`` makes its import raise ImportError.
TERMINAL_ONLY_MODULES = ("rich", "pygments")
# redis-py imports OpenTelemetry's metrics SDK whenever it is installed (in a ``try``, as
# above); a worker that does not trace keeps it out, so that nothing of it is loaded.
TRACING_ONLY_MODULES = ("opentelemetry",)


def keep_out_terminal_only_modules() -> None:
    """Have the terminal-only optional imports fail, before anything tries them, and
    OpenTelemetry's too when the worker does not trace."""
    unused = TERMINAL_ONLY_MODULES + (() if is_tracing_configured() else TRACING_ONLY_MODULES)
    for name in unused:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # None: "not importable"


def set_metrics_environment() -> None:
    """Put ``PROMETHEUS_MULTIPROC_DIR`` in the environment the worker execs with, so that
    prometheus-client chooses multiprocess mode whatever imports it first (a
    ``sitecustomize``, a Celery plugin)."""
    from worker.metrics import choose_multiproc_dir

    choose_multiproc_dir()


def serve_worker(argv: list[str]) -> None:
    """Run Celery's worker command alone (not its whole command group: `repl` imports
    prompt_toolkit and pygments into every child) with ``argv``, as ``app.worker_main`` runs it."""
    keep_out_terminal_only_modules()
    from celery.bin.base import CLIContext
    from celery.bin.worker import worker as celery_worker

    from worker.broker.celery_app import app

    celery_worker.main(argv, prog_name="compactor worker", standalone_mode=False,
                       obj=CLIContext(app=app, no_color=None, workdir=None, quiet=False))


if __name__ == "__main__":
    serve_worker(sys.argv[1:])
