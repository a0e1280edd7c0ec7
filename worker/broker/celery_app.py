"""The Celery app: Redis broker, JSON only, late acks, prefetch 1, time limits from
settings, a dedicated queue. ``celery -A worker.broker.celery_app worker`` starts a worker as
well as ``compactor worker`` does.

Pool: prefork. It is the pool that enforces both time limits (threads enforces none,
gevent/eventlet no soft limit), and a session that exhausts memory kills only its
child process, whose job is then redelivered (``reject_on_worker_lost``) and capped by
the delivery counter.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from typing import Any

from celery import Celery
from celery.app.trace import LOG_RECEIVED, LOG_SUCCESS
from celery.apps.worker import install_worker_term_handler
from celery.signals import (
    celeryd_init,
    setup_logging,
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutting_down,
)
from structlog.contextvars import bind_contextvars, clear_contextvars

from worker.broker.contract import RECONCILE_TASK_NAME, SCAN_TASK_NAME, TASK_NAME
from worker.broker.transport import ITEM_POLICY_OPTION, item_policy_option
from worker.logging import get_logger
from worker.memory import map_large_blocks, return_free_heap, use_one_malloc_arena
from worker.settings.config import Settings, get_settings
from worker.settings.errors import EXIT_INVALID_SETTINGS, settings_or_exit
from worker.shared_state.connection import sentinel_options
from worker.tracing.spans import is_tracing_configured

_INCLUDE = ["worker.broker.tasks", "scheduler.tasks"]
EXIT_CHECK_FAILED = 1


def create_app(settings: Settings) -> Celery:
    """Build an app from settings; connects to nothing until used."""
    # Celery loads the scheduler's tasks by name: the scan runs as a task on a worker,
    # while nothing in worker/ imports scheduler/ (the dependency direction).
    app = Celery("compactor", include=_INCLUDE)
    app.config_from_object(celery_config(settings))
    return app


def celery_config(settings: Settings) -> dict[str, Any]:
    """The app's configuration: Celery's names for the settings' values."""
    # A Redis that hangs fails a read instead of blocking the worker for good.
    sockets = {"socket_timeout": settings.redis_socket_timeout_s,
               "socket_connect_timeout": settings.redis_socket_timeout_s,
               "socket_keepalive": True}
    return dict(
        broker_url=settings.redis_url,
        task_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_ignore_result=True,
        result_backend=None,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        # A lost broker connection lets the running jobs finish and record their outcome.
        # Cancelling them instead (Celery 6's default) loses them outright when Redis
        # restarts empty, as it does without persistence: their messages die with it
        # (tests/chaos/test_chaos.py). A finished job whose ack cannot land is at worst
        # delivered again, and a job is safe to run twice.
        worker_cancel_long_running_tasks_on_connection_loss=False,
        # SIGTERM is a warm shutdown: running jobs finish (the deploy's grace period
        # outlasts the hard time limit). A cold one first waits this long, and requeues
        # the messages it holds, retries waiting on their countdown too (on idle as well).
        worker_soft_shutdown_timeout=settings.worker_soft_shutdown_s,
        worker_enable_soft_shutdown_on_idle=settings.worker_soft_shutdown_s > 0,
        # Inspects every item of the service's queues before kombu reads it; refused ones
        # are dead-lettered. Settings name a Sentinel master exactly with sentinel:// URLs.
        broker_transport=("worker.broker.transport:InspectingTransport"
                          if settings.redis_sentinel_master is None
                          else "worker.broker.transport:InspectingSentinelTransport"),
        # Reports messages Celery still cannot turn into a request as rejected jobs.
        worker_consumer="worker.broker.consumer:JobConsumer",
        task_soft_time_limit=settings.task_soft_time_limit_s,
        task_time_limit=settings.task_hard_time_limit_s,
        task_default_queue=settings.queue_name,
        task_routes={TASK_NAME: {"queue": settings.queue_name},
                     SCAN_TASK_NAME: {"queue": settings.queue_name},
                     RECONCILE_TASK_NAME: {"queue": settings.queue_name}},
        broker_transport_options={
            "visibility_timeout": settings.broker_visibility_timeout_s,
            "global_keyprefix": settings.redis_key_prefix,
            **sockets,
            ITEM_POLICY_OPTION: item_policy_option(settings),
            **({} if settings.redis_sentinel_master is None
               else {"master_name": settings.redis_sentinel_master,
                     "sentinel_kwargs": sentinel_options(settings, sockets)}),
        },
        broker_connection_retry_on_startup=True,
        # configure_process_logging owns logging; these two are moot while it is connected
        # and stay off so that nothing rewires it should it ever not be.
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
        worker_send_task_events=False,
        timezone="UTC",
        enable_utc=True,
    )


# The process's app. It reads the settings when Celery first needs its configuration,
# not at import: importing a task module never fails on a bad setting.
app = Celery("compactor", include=_INCLUDE)


@app.on_configure.connect
def _configure_from_settings(sender: Celery, **_: Any) -> None:
    sender.config_from_object(celery_config(settings_or_exit()))


@setup_logging.connect
def configure_process_logging(loglevel: int | str | None = None, **_: Any) -> None:
    """Own the logging of worker, pool children and beat (Celery then sets up none of
    its own: no handler on the root logger, no redirected prints); Celery's loggers keep
    the level of its ``--loglevel``, its records of a task's routine steps DEBUG."""
    settings_or_exit()  # configures logging from the settings
    celery_logger = logging.getLogger("celery")
    if loglevel:
        celery_logger.setLevel(loglevel)
    for name, message_format in ROUTINE_TASK_RECORDS.items():
        logger = logging.getLogger(name)
        for existing in [f for f in logger.filters if isinstance(f, DebugRecords)]:
            logger.removeFilter(existing)
        logger.addFilter(DebugRecords(message_format, celery_logger))
    # The consumer's logger writes nothing else below ERROR, and Celery reads its level
    # once, building each task's strategy, to decide whether to build the record at all.
    logging.getLogger(_RECEIVING_LOGGER).setLevel(
        logging.NOTSET if celery_logger.isEnabledFor(logging.DEBUG) else logging.WARNING)


# Celery's two INFO records of every task that goes well: each job logs its own
# compaction.job event and the scheduler's tasks theirs, so these only repeated them
# (and were most of the service's own cost per task). Failures, retries and rejections
# keep their levels: they have formats of their own.
_RECEIVING_LOGGER = "celery.worker.strategy"
ROUTINE_TASK_RECORDS = {_RECEIVING_LOGGER: LOG_RECEIVED, "celery.app.trace": LOG_SUCCESS}


class DebugRecords(logging.Filter):
    """Passes a record of ``message_format`` as a DEBUG one, and only while ``gate`` logs
    DEBUG; any other record as it is."""

    def __init__(self, message_format: str, gate: logging.Logger) -> None:
        super().__init__()
        self.message_format, self.gate = message_format, gate

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != self.message_format:
            return True
        if not self.gate.isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


@celeryd_init.connect
def _quiet_worker(instance: Any = None, **_: Any) -> None:
    """Log before Celery's first warning, and print no banner: stdout and stderr carry
    log lines only (``worker.ready`` names the queue instead)."""
    configure_process_logging()
    if instance is not None:
        instance.quiet = True


@celeryd_init.connect
def _refuse_broken_configuration(**_: Any) -> None:
    """Run `compactor check`'s checks before the worker consumes anything; on a wrong
    configuration, log one ``worker.check_failed`` line per problem and exit 1 (no job is
    taken). A dependency that is only unreachable (an outage) is logged as
    ``worker.check_unreachable`` and the worker starts: its jobs retry and the reconciler
    catches up once it is back, where a refusal would only crash-loop the worker.

    The checks run in a forked process that logs and exits: what they alone import
    (alembic and mako for the schema's head revision, ~7 MiB) never reaches the pool's
    children, which would otherwise inherit it with the rest of this process."""
    pid = os.fork()
    if pid == 0:
        exit_code = EXIT_CHECK_FAILED
        try:
            exit_code = _check_and_log()
        except BaseException as exc:  # the worker refuses to start and says why
            get_logger().error("worker.check_crashed", error_class=type(exc).__name__,
                               failure_message=str(exc))
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(exit_code)
    if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
        raise SystemExit(EXIT_CHECK_FAILED)


def _check_and_log() -> int:
    """Run the checks and log their findings; the worker's exit code they call for."""
    from worker.checks import CheckStatus, run_checks

    settings = get_settings()
    results = run_checks(settings, probe_llm=settings.worker_check_llm)
    failed = [result for result in results if result.status is CheckStatus.PROBLEM]
    for result in results:
        if result.status is CheckStatus.UNREACHABLE:
            get_logger().warning("worker.check_unreachable", check=result.name,
                                 detail=result.detail, fix=result.fix, message=result.line)
    for result in failed:
        get_logger().error("worker.check_failed", check=result.name, detail=result.detail,
                           fix=result.fix, message=result.line)
    if failed:
        return EXIT_CHECK_FAILED
    get_logger().info("worker.checks_passed", checks=[result.name for result in results])
    return 0


@celeryd_init.connect
def _prepare_metrics(**_: Any) -> None:
    """With ``metrics_port`` set, every process of this worker records its samples in one
    emptied directory, set up before the pool forks (``worker/metrics.py``); a worker
    whose metrics could not be collected refuses to start (exit 78, one line)."""
    if (port := get_settings().metrics_port) is not None:
        from worker.metrics import MetricsSetupError, enable_metrics

        try:
            enable_metrics(port)
        except MetricsSetupError as exc:
            get_logger().error("metrics.refused", message=str(exc))
            raise SystemExit(EXIT_INVALID_SETTINGS) from None


@worker_init.connect
def _share_before_fork(**_: Any) -> None:
    """Load the children's read-only state once, before the pool forks, then freeze the
    heap: a child's garbage collections never write to the inherited objects, so their
    pages stay shared."""
    from worker.runtime import share_before_fork

    use_one_malloc_arena()
    map_large_blocks()
    try:
        share_before_fork(get_settings())
    except Exception as exc:  # each child then loads its own, and reports any failure
        get_logger().warning("worker.preload_failed", error_class=type(exc).__name__)
    _parse_pool_child_declaration()
    gc.freeze()


def _parse_pool_child_declaration() -> None:
    """Each pool child asks to die with its parent through cffi when cffi is installed
    (billiard's ``set_pdeathsig``), and so parses a C declaration: cffi's parser, built on
    pycparser, cost every child ~1.5 MiB. Parsed here, the children reuse the parser."""
    if "cffi" in sys.modules:  # billiard uses ctypes otherwise
        import cffi

        cffi.FFI().cdef("int prctl (int __option, ...);")  # billiard's own declaration


@worker_process_init.connect
def _start_tracing(**_: Any) -> None:
    """Trace this pool child's jobs when the ``OTEL_*`` variables ask for it; otherwise
    nothing of OpenTelemetry is loaded."""
    if not is_tracing_configured():
        return
    try:
        from worker.tracing.export import start_tracing
    except ImportError as exc:  # jobs still run, untraced
        get_logger().error("tracing.unavailable", error_class=type(exc).__name__,
                           failure_message=f"{exc}: install the otel extra")
        return
    start_tracing()


@worker_process_init.connect
def _prepare_child(**_: Any) -> None:
    """Build the runtime before the first job, not during it."""
    from worker.runtime import get_runtime  # the runtime belongs to pool children only

    try:
        get_runtime(get_settings())
    except Exception as exc:  # the first job builds it again and reports the failure
        get_logger().warning("worker.runtime_deferred", error_class=type(exc).__name__)


@worker_ready.connect
def _announce_ready(sender: Any = None, **_: Any) -> None:
    settings = get_settings()
    controller = getattr(sender, "controller", None)
    if controller is not None:
        # Celery's SIGTERM handler writes "worker: Warm shutdown" straight to stdout's
        # file descriptor; this one only logs worker.shutting_down (Ctrl+C, at a
        # terminal, keeps Celery's messages).
        install_worker_term_handler(controller, verbose=False)
    get_logger().info("worker.ready", queue=settings.queue_name,
                      summarizer=settings.effective_summarizer.value)
    if settings.metrics_port is not None:
        _serve_metrics(settings, settings.metrics_port)


def _serve_metrics(settings: Settings, port: int) -> None:
    """Serve the pool's metrics from the main process, once its children are forked."""
    from worker.metrics import serve_metrics
    from worker.metrics_state import FleetStateCollector, FleetStateReader

    collector = FleetStateCollector(FleetStateReader(settings), settings.queue_name)
    try:
        serve_metrics(settings.metrics_host, port, [collector])
    except OSError as exc:  # jobs still run; the operator reads why scrapes fail
        get_logger().error("metrics.unavailable", host=settings.metrics_host, port=port,
                           failure_message=str(exc))
        return
    get_logger().info("metrics.serving", host=settings.metrics_host, port=port,
                      path="/metrics")


@worker_process_shutdown.connect
def _forget_child(pid: int | None = None, **_: Any) -> None:
    from worker.metrics import mark_child_dead

    mark_child_dead(pid or os.getpid())


@worker_process_shutdown.connect
def _flush_traces(**_: Any) -> None:
    """Export the child's last spans before it exits."""
    if "worker.tracing.export" in sys.modules:  # only a tracing child loaded it
        from worker.tracing.export import stop_tracing

        stop_tracing()


@worker_shutting_down.connect
def _announce_shutdown(sig: str | None = None, how: str | None = None, **_: Any) -> None:
    get_logger().info("worker.shutting_down", signal=sig, how=how)


@task_prerun.connect
def _bind_task_context(task_id: str | None = None, kwargs: Any = None, **_: Any) -> None:
    clear_contextvars()
    session_id = kwargs.get("session_id") if isinstance(kwargs, dict) else None
    bind_contextvars(task_id=task_id, session_id=session_id if isinstance(session_id, str)
                     else None)


@task_postrun.connect
def _end_task(sender: Any = None, **_: Any) -> None:
    """Unbind the task's log context; after a compaction job, give the memory it freed
    back to the system (glibc otherwise keeps it in the child for good). Only a job holds
    a session's text: the scheduler's tasks allocate little, and a trim walks the whole
    heap whatever was freed."""
    clear_contextvars()
    if getattr(sender, "name", None) == TASK_NAME:
        return_free_heap()
