"""Alembic migrations of the store schema (script location ``db:migrations``)."""
