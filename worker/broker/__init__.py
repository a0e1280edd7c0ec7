"""The Celery entrypoints: the app, the thin task, the hardened consumer and transport, the
job message contract, and the process ``compactor worker`` execs. Importing this package
builds no app: ``worker.broker.celery_app`` does."""
