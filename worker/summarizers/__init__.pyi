from .base import BatchLineFailed as BatchLineFailed
from .base import BatchPending as BatchPending
from .base import Summarizer as Summarizer
from .base import SummaryDraft as SummaryDraft
from .base import SummaryUsage as SummaryUsage
from .base import SummaryWork as SummaryWork
from .extractive import ExtractiveSummarizer as ExtractiveSummarizer
