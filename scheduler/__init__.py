"""The scheduler: which sessions are due (``selection``), enqueueing one job per session
(``enqueue``), the beat schedule and its scan task (``beat``), and the ``compactor``
command line (``scheduler.cli``). Nothing in ``worker/`` or ``db/`` imports it."""
