"""Summarizers: the port the pipeline calls (``base.py``) and its two implementations,
``extractive.py`` (offline, deterministic) and ``llm.py`` (OpenAI-compatible endpoint,
imported only where configured: it loads the SDK).

The face's names are declared once, in ``__init__.pyi``, which type checkers read; each
loads on first use, with only the module that defines it."""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
