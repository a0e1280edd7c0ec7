"""The durable session store: tables, migrations, and the store API.

This module is the package's public face: code outside ``db/`` imports from ``db`` only
(``from db import Store, NewMessage``), never from its modules; a test walks the imports.

Each name is declared once, in ``__init__.pyi`` (which type checkers read), and loads on
first use with only the module that defines it (``lazy_loader``): a process that only
names a store error, or a `compactor --help`, imports neither SQLAlchemy nor alembic.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
