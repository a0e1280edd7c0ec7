"""The views of a stored session an export writes: a plain enum in a module of its own,
so the command line can offer its choices without loading intake (``worker/platform/ingest.py``)."""

from __future__ import annotations

from enum import StrEnum


class ExportView(StrEnum):
    FULL = "full"  # every stored message, as imported or appended
    PROJECTION = "projection"  # what a model is sent: instructions, summary block, tail
