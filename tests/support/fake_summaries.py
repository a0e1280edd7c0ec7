"""Deterministic summaries the test OpenAI server derives from a prompt.

The ``ok`` summary carries every identifier-like token it sees (an over-approximation of
what the validator extracts) and fills each section with a short line of the input (a
done one with a line the assistant of a transcript said, if any); a merge request
(partial summaries embedded as JSON) gets their sections unioned. The prior summary is
read-only context, as the prompt says: nothing of it is repeated. It follows
the prompt's merge rules as a careful model would, reading the transcript's quoted
messages: the goal as it stands now (the newest conversation's first request, else the
prior's), the prior's pending items the transcript answers copied verbatim into resolved,
and errors that ended a tool call listed in pending. The lying model's summary
(``build_lying_summary``) is that one with lies added: each call's outcome flipped, the
requests the agent answered listed as open, identifiers no input holds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from worker.compaction.outcomes import CallStatus, classify_result, failing_lines
from worker.compaction.prompts import INPUT_LAYOUT, QUOTE_PREFIX
from worker.compaction.schema import SUMMARY_SECTIONS
from worker.compaction.truth import DONE_SECTIONS

ARTIFACTS_SECTION = "relevant_artifacts"
SNIPPET_CHARS = 80
MAX_ENTRIES_PER_SECTION = 8

# URLs whole; otherwise word-ish runs that contain a digit, underscore, slash or dot
# (HAT170, mia_li_3668, /etc/app.conf, E1234, v1.2.3, pins such as sqlalchemy==2.0.1, kept
# whole as the prompt asks) or are upper-case codes of five
# or more (PUNERT); plain numbers are left out, edge punctuation dropped.
_URL = re.compile(r"https?://[^\s\"'<>`)\]}]+")
_TOKEN = re.compile(r"[A-Za-z0-9_./~@#:+=-]+")
_IDENTIFIER_MARK = re.compile(r"[0-9_/.]|^[A-Z][A-Z0-9]{4,}$")
_ALNUM = re.compile(r"[A-Za-z0-9]")
_PLAIN_NUMBER = re.compile(r"[\d,]+(?:\.\d+)?")
_PRIOR_FENCE = re.compile(r"<<<PRIOR SUMMARY (\d+) BEGIN>>>\n(.*?)\n<<<PRIOR SUMMARY \1 END>>>",
                          re.DOTALL)
_TRANSCRIPT = re.compile(r"<<<TRANSCRIPT (\d+) BEGIN>>>\n(.*?)\n<<<TRANSCRIPT \1 END>>>",
                         re.DOTALL)
_HEADER = re.compile(r"\[seq \d+\] (user|assistant|tool result) ?(?:\(([^)]*)\))?:")
_BOUNDARY = re.compile(r"(?i:conversation has ended|session boundary)")
# The prompt's fence lines frame the input; they are not part of it.
_FENCE_LINE = re.compile(r"^<<<[^\n]*>>>$", re.MULTILINE)
# A careful model lists as open only what is open (no quoted line fills these), and as
# done only what the assistant of a transcript said or did: never a line of the user's,
# of a partial summary's JSON (a merge carries the partials' done items) or of a cut
# message's later part, whose speaker no header names.
OPEN_SECTIONS = ("pending", "remaining_work")
_CALL = re.compile(r"^\[seq \d+\] assistant → tool call ([\w.-]+)\((.*)\)$", re.MULTILINE)
# Shaped like the span's codes and ids, held by no input.
INVENTED_IDENTIFIERS = ("INV-740213", "ZZQ9X7")


def extract_identifiers(text: str) -> list[str]:
    """Return identifier-like tokens of ``text`` in first-seen order, without repeats."""
    found = [match.group(0).rstrip(".,:;") for match in _URL.finditer(text)]
    for match in _TOKEN.finditer(_URL.sub(" ", text)):
        token = match.group(0).rstrip(".,:;-+#@~").lstrip(".,:;-+~")
        if (len(token) >= 2 and _IDENTIFIER_MARK.search(token) and _ALNUM.search(token)
                and not _PLAIN_NUMBER.fullmatch(token)):
            found.append(token)
    return _unique(found)


def extract_summaries(text: str) -> list[dict[str, Any]]:
    """Return the JSON objects embedded in ``text`` that look like partial summaries."""
    decoder = json.JSONDecoder()
    summaries: list[dict[str, Any]] = []
    position = text.find("{")
    while position != -1:
        try:
            value, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError:
            position = text.find("{", position + 1)
            continue
        if isinstance(value, dict) and sum(key in value for key in SUMMARY_SECTIONS) >= 3:
            summaries.append(value)
        position = text.find("{", end)
    return summaries


def build_summary(prompt_text: str, sections: Iterable[str] = SUMMARY_SECTIONS) -> dict[str, Any]:
    """Build the deterministic summary of ``prompt_text`` with the given section keys."""
    prompt_text = _input_of(prompt_text)
    prior = _read_prior(prompt_text)
    messages = _read_transcript(prompt_text)
    prompt_text = _FENCE_LINE.sub("", _PRIOR_FENCE.sub("", prompt_text))
    partials = extract_summaries(prompt_text)
    lines = _snippets(prompt_text) or ["(no content)"]
    done_lines = _snippets("\n".join(text for role, text in messages if role == "assistant"))
    ruled = {"goal": _goal(messages, prior), "resolved": _settled(messages, prior),
             "pending": _errors(messages)}
    summary: dict[str, Any] = {}
    for index, section in enumerate(sections):
        if section == ARTIFACTS_SECTION:
            carried = [item for part in partials for item in _strings(part.get(section))]
            summary[section] = _unique([*carried, *extract_identifiers(prompt_text)])
        elif section == "goal":
            goals = [part["goal"] for part in partials if isinstance(part.get("goal"), str)]
            summary[section] = goals[0] if goals else ruled["goal"] or lines[0]
        else:
            carried = [item for part in partials for item in _strings(part.get(section))]
            quotable = done_lines if section in DONE_SECTIONS else lines
            derived = [] if section in OPEN_SECTIONS or not quotable \
                else [f"{section.replace('_', ' ')}: {quotable[index % len(quotable)]}"]
            found = ruled.get(section) or []
            summary[section] = _unique([*carried, *found, *derived])[:MAX_ENTRIES_PER_SECTION]
    return summary


def _input_of(prompt_text: str) -> str:
    """The user message without the input layout that opens it: instructions, not input."""
    return prompt_text.replace(INPUT_LAYOUT, "")


def _read_prior(prompt_text: str) -> dict[str, Any]:
    match = _PRIOR_FENCE.search(prompt_text)
    value = json.loads(match.group(2)) if match else {}
    return value if isinstance(value, dict) else {}


def _read_transcript(prompt_text: str) -> list[tuple[str, str]]:
    """The transcript's messages as (role, text), text unquoted."""
    match = _TRANSCRIPT.search(prompt_text)
    messages: list[tuple[str, list[str]]] = []
    for line in match.group(2).splitlines() if match else ():
        header = _HEADER.match(line)
        if header:
            messages.append((header.group(1), []))
        elif messages and line.startswith(QUOTE_PREFIX.rstrip()):
            messages[-1][1].append(line.removeprefix(QUOTE_PREFIX.rstrip()).removeprefix(" "))
    return [(role, "\n".join(text)) for role, text in messages]


def _goal(messages: list[tuple[str, str]], prior: dict[str, Any]) -> str:
    """The newest conversation's first request, else the prior's goal, else the first ask."""
    users = [text for role, text in messages if role == "user" and text.strip()]
    starts = [i + 1 for i, text in enumerate(users) if _BOUNDARY.search(text)]
    if starts and starts[-1] < len(users):
        return _one_snippet(users[starts[-1]])
    prior_goal = prior.get("goal")
    if isinstance(prior_goal, str) and prior_goal:
        return prior_goal
    return _one_snippet(users[0]) if users else ""


def _one_snippet(text: str) -> str:
    # A model restates a request in a sentence; it never pastes a megabyte of it.
    return " ".join(text.split())[:SNIPPET_CHARS]


def _settled(messages: list[tuple[str, str]], prior: dict[str, Any]) -> list[str]:
    """The prior's pending items the transcript answers, copied verbatim."""
    answered = any(role == "assistant" and text.strip() for role, text in messages)
    said = "\n".join(text for _, text in messages)
    return [item for item in _strings(prior.get("pending"))
            if answered and (item.startswith("Unanswered")
                             or any(value in said for value in extract_identifiers(item)))]


def _errors(messages: list[tuple[str, str]]) -> list[str]:
    """Errors that ended a tool call, with their lines."""
    failed = (failing_lines(text) for role, text in messages if role == "tool result")
    return [f"Open error: {_one_snippet(' / '.join(lines))}" for lines in failed if lines]


def fit_summary(summary: dict[str, Any], limit_tokens: int,
                count_tokens: Callable[[str], int]) -> dict[str, Any]:
    """Keep as many leading artifacts as let the summary's JSON fit ``limit_tokens``.

    The artifacts are in first-seen order, and the prompt lists its ranked identifiers
    before the transcript, so the least important go first, as a careful model's would.
    """
    artifacts = list(summary.get(ARTIFACTS_SECTION) or [])

    def fits(kept: int) -> bool:
        trial = {**summary, ARTIFACTS_SECTION: artifacts[:kept]}
        return count_tokens(json.dumps(trial, ensure_ascii=False)) <= limit_tokens

    if ARTIFACTS_SECTION not in summary or fits(len(artifacts)):
        return summary
    low, high = 0, len(artifacts)
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return {**summary, ARTIFACTS_SECTION: artifacts[:low]}


def build_empty_summary(sections: Iterable[str] = SUMMARY_SECTIONS) -> dict[str, Any]:
    """Build a summary whose every section is present and empty."""
    return {section: "" if section == "goal" else [] for section in sections}


def build_wrong_schema_summary(prompt_text: str) -> dict[str, Any]:
    """Build valid JSON that follows none of the summary schema."""
    lines = _snippets(_input_of(prompt_text)) or ["(no content)"]
    return {"summary": lines[0], "notes": lines[1:3], "confidence": "high"}


def sections_of(json_schema: dict[str, Any] | None) -> tuple[str, ...]:
    """Return the property names a requested JSON schema asks for (the default keys if none)."""
    properties = (json_schema or {}).get("properties")
    if isinstance(properties, dict) and properties:
        return tuple(str(name) for name in properties)
    return SUMMARY_SECTIONS


def break_json(text: str) -> str:
    """Return ``text`` with its closing brace replaced by a dangling comma (unparseable)."""
    return text.rstrip().removesuffix("}") + ', "'


def fence_json(text: str) -> str:
    """Wrap JSON text in prose and a fenced block, as chat models without JSON mode do."""
    return (
        "Here is the structured summary of the conversation.\n\n"
        f"```json\n{text}\n```\n\nLet me know if any section needs more detail."
    )


def _snippets(text: str) -> list[str]:
    lines = (line.strip(" \t-*#>") for line in text.splitlines())
    return _unique(line[:SNIPPET_CHARS] for line in lines if len(line) >= 3)


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, list):
        yield from (item for item in value if isinstance(item, str))


def _unique(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))


def build_lying_summary(prompt_text: str, sections: Iterable[str] = SUMMARY_SECTIONS
                        ) -> dict[str, Any]:
    """The ``ok`` summary of ``prompt_text`` with lies a careless model tells: every call
    reported with the outcome its result (as the prompt shows it) does not have, each
    request the agent answered listed as unanswered, identifiers that occur nowhere."""
    summary = build_summary(prompt_text, sections)
    messages = _read_transcript(prompt_text)
    results = [text for role, text in messages if role == "tool result"]
    flipped = [f"called {name}({_first_value(arguments)}) → "
               + ("failed" if result is CallStatus.SUCCEEDED else "ok")
               for (name, arguments), result in zip(
                   _CALL.findall(prompt_text),
                   [classify_result(text)[0] for text in results], strict=False)]
    answered = _answered(messages)
    invented = [f"Fixed {value} in the deployment" for value in INVENTED_IDENTIFIERS]
    return {**summary,
            "completed_actions": [*flipped, *invented,
                                  *_strings(summary.get("completed_actions"))],
            "pending": [*(f"Unanswered user request: {_one_snippet(text)}"
                          for text in answered), *_strings(summary.get("pending"))],
            ARTIFACTS_SECTION: [*INVENTED_IDENTIFIERS,
                                *_strings(summary.get(ARTIFACTS_SECTION))]}


def _first_value(arguments: str) -> str:
    """A call's first argument value, as a summary names the call by it."""
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return ""
    first = next(iter(value.values()), "") if isinstance(value, dict) and value else ""
    return first if isinstance(first, str) else ""


def _answered(messages: list[tuple[str, str]]) -> list[str]:
    """The user's texts the assistant answered in words before the user spoke again."""
    answered: list[str] = []
    asked: str | None = None
    for role, text in messages:
        if role == "user":
            asked = text
        elif role == "assistant" and text.strip() and asked is not None:
            answered.append(asked)
            asked = None
    return answered
