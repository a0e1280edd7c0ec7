"""What an agent platform uses: the sessions API, import/append/export (ingest), the data
lifecycle (gc, delete), the index backfill, the ``recall`` tool and the OpenAI Agents SDK
session."""
