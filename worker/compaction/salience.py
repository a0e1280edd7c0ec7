"""Salience: what a summary shows first, ranked by what the agent that continues needs
rather than by how often a value repeats.

Tiers, most salient first: values that ended a tool call or a test run and values the
caller features (decisions, open requests); values a user or the assistant said; values
only a tool returned (bare numbers last); tool names. Within a tier an error code leads,
then the newest value, then the rarer one: a code seen once outranks an id a search
listed fifty times. Which calls failed is the outcomes' answer (``outcomes.py``).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from itertools import compress

from worker.compaction.identifiers import Artifact
from worker.compaction.outcomes import Failure
from worker.compaction.substrings import TextGrams


def failure_values(failures: Sequence[Failure], artifacts: Sequence[Artifact]) -> frozenset[str]:
    """Return the span's error codes on the lines that ended a failed call: the stored
    index says which values are codes, so no line is scanned for identifiers again."""
    lines = "\n".join(line for failure in failures for line in failure.lines)
    return frozenset(a.value for a in artifacts if a.kind == "error" and a.value in lines)


def featured_values(failures: Sequence[Failure], texts: Sequence[str],
                    artifacts: Sequence[Artifact]) -> frozenset[str]:
    """Return the values that lead the ranking: the error codes that ended a call, and the
    span's identifiers that ``texts`` (a summary's decisions and open requests) name."""
    named = TextGrams("\n".join(texts), asked=len(artifacts))
    values = [a.value for a in artifacts if a.kind != "tool"]
    return failure_values(failures, artifacts) | set(compress(values, named.contains_each(values)))


def rank_artifacts(artifacts: Sequence[Artifact], *, featured: Collection[str] = ()
                   ) -> tuple[Artifact, ...]:
    """Return ``artifacts`` most salient first (see the module's tiers); deterministic."""
    return tuple(sorted(artifacts, key=lambda artifact: _salience_key(artifact, featured)))


def rerank_featured(ranked: Sequence[Artifact], featured: Collection[str]
                    ) -> tuple[Artifact, ...]:
    """Return ``rank_artifacts(ranked, featured=featured)`` for ``ranked`` already ranked
    with a subset of ``featured``: only the featured values change tier (to the first),
    so they are sorted and the rest keep their order. A job ranks its span's artifacts
    once (~1.5k at 100k tokens) and features a draft's values after."""
    lead = [a for a in ranked if a.kind != "tool" and a.value in featured]
    leading = {id(a) for a in lead}
    return (*sorted(lead, key=lambda artifact: _salience_key(artifact, featured)),
            *(a for a in ranked if id(a) not in leading))


def _salience_key(artifact: Artifact, featured: Collection[str]
                  ) -> tuple[int, int, int, int, int, int, str]:
    if artifact.kind == "tool":
        tier = 3
    elif artifact.value in featured:
        tier = 0
    else:
        tier = 1 if artifact.is_said else 2
    # A bare number only a tool returned (a catalogue's item ids, labelled by a JSON key)
    # says nothing of what it is: it follows the typed values of its tier.
    bare = int(tier == 2 and artifact.value.isdigit())
    return (tier, bare, int(artifact.kind != "error"), -artifact.last_seq, artifact.count,
            artifact.first_seq, artifact.value)
