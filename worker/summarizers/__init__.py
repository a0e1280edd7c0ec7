"""Summarizers: the port the pipeline calls (``base.py``) and its two implementations,
``extractive.py`` (offline, deterministic) and ``llm.py`` (OpenAI-compatible endpoint,
imported only where configured: it loads the SDK)."""

from worker.summarizers.base import Summarizer, SummaryDraft, SummaryUsage, SummaryWork
from worker.summarizers.extractive import ExtractiveSummarizer

__all__ = ["ExtractiveSummarizer", "Summarizer", "SummaryDraft", "SummaryUsage", "SummaryWork"]
