"""The durable session store: tables, migrations, and the store API (``db.store``)."""
