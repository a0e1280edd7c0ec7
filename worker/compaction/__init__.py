"""The pure compaction core: plain data in, plain data out. It imports no Celery, Redis,
SQLAlchemy, OpenAI SDK, logging, settings, environment, files or clock (callers pass
``now``; the tokenizer's encoding is loaded outside, by ``worker.tokenizer``).

This module is the core's public face: code outside ``worker/compaction/`` imports from
``worker.compaction`` only, never from its modules; a test walks the imports.

Each name is declared once, in ``__init__.pyi`` (which type checkers read), and loads on
first use with only the module that defines it (``lazy_loader``): a process that needs
one enum (the settings' ``StrategyName``) does not import the summary schema's pydantic
models.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
