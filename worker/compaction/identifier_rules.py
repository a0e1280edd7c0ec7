"""The rules that find identifiers in one text, as written: one C-level scan picks the
words worth a look (a digit, a path or URL sign, an error's shape), a cached classifier
names each word's kind, and a few labelled rules read values a word alone cannot type
(``"reservation_id": "HATHAT"``, ``HTTP 503``, ``order id is X``). A word no specific
rule types is judged by its shape: letters and digits joined by any separators are one
identifier, kept whole, unless the shape says number, date, time, measure or code name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache
from itertools import accumulate, repeat

# Characters that end a word: whitespace, quotes, brackets and list punctuation.
_DELIMITERS = r"\s\"'`<>()\[\]{},;|*"
_WORD = rf"[^{_DELIMITERS}]"
_WORD_OR_COMPARISON = r"[^\s\"'`()\[\]{},;|*]"
# A word is worth classifying when it holds a digit or an identifier's sign, or looks
# like an error name; plain words (most of any text) never leave the regex engine. The
# first look-ahead is the cheap necessary part (one of the characters every such sign
# starts with), so a word without one is passed over in one tight loop. The word itself
# is runs of word characters joined by comparisons (``<=``), each run one possessive
# repeat of a single class, which the engine reads in a tight loop too. The group makes
# ``split`` hand back the words with the text between them.
_SIGN_START = r"\d/\\@#=_~.:^!\-A-Z"
_CANDIDATE = re.compile(
    rf"((?<!{_WORD})(?=[^\s\"'`()\[\]{{}},;|*{_SIGN_START}]*+[{_SIGN_START}])"
    rf"(?={_WORD_OR_COMPARISON}*?(?:[\d/\\@#=_~]|[.:^!-]{_WORD}|Error|Exception|Fault"
    rf"|Warning|[A-Z]{{4}}))(?:[<>](?==))?{_WORD}++(?:[<>](?==){_WORD}++)*)"
)
_TRAILING = ".,:;!?"

_ERRNO_NAMES = frozenset({
    "ENOENT", "EACCES", "EPERM", "EEXIST", "EINVAL", "EISDIR", "ENOTDIR", "ENOSPC", "EROFS",
    "EBADF", "EBUSY", "EAGAIN", "EPIPE", "EMFILE", "ENOMEM", "ETIMEDOUT", "ECONNREFUSED",
    "ECONNRESET", "ECONNABORTED", "EADDRINUSE", "EHOSTUNREACH", "ENETUNREACH", "ENOTFOUND",
    "ENOTEMPTY", "EAI_AGAIN"
})
# Prefixes that look like ticket keys but name encodings, ciphers or standards.
_NOT_TICKETS = frozenset({"UTF", "SHA", "AES", "ISO", "RSA", "COVID", "GPT", "MD", "TLS", "SSL"})
_EXTENSIONS = frozenset({
    "py", "pyi", "js", "mjs", "ts", "tsx", "jsx", "json", "yaml", "yml", "toml", "md", "txt",
    "csv", "log", "sh", "go", "rs", "java", "kt", "cs", "c", "h", "cc", "cpp", "hpp", "rb",
    "php", "sql", "html", "css", "ini", "cfg", "conf", "lock", "xml", "env", "proto", "tf"
})
_RUNTIMES = ("python", "node", "java", "go", "ruby", "version", "release")

_PRERELEASE = r"(?:-[0-9A-Za-z]+(?:\.[0-9A-Za-z]+)*)?(?:\+[0-9A-Za-z.]+)?"
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s]+")
_EMAIL = re.compile(r"[\w.+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
_AT_PIN = re.compile(r"@?[A-Za-z0-9][\w.-]*(?:/[\w.-]+)?@[\^~]?v?\d[\w.*+-]*")
_PIN = re.compile(r"[A-Za-z][\w.-]*(?:==|>=|<=|~=|!=)v?\d[\w.*+-]*(?:,(?:==|>=|<=|~=|!=|<|>)"
                  r"v?\d[\w.*+-]*)*")
# A name with a version after any pin or tag sign: ``tool:3.2``, ``lib-1.2.3``,
# ``@scope/pkg~=1.2``.
_NAMED_VERSION = re.compile(r"@?[A-Za-z][\w.-]*?(?:/[A-Za-z][\w.-]*)?(?:[=<>~!]=|@[\^~]?|[:/-])"
                            r"[\^~]?v?\d+(?:\.\d+)+[\w.+-]*")
_HEX_CODE = re.compile(r"0[xX][0-9a-fA-F]{4,16}")
# Any letters and digits joined by separators, each run kept whole. What is not an
# identifier is ruled out by shape below: numbers, dates, times, measures.
_COMPOUND = re.compile(r"[#+]?[A-Za-z0-9]+(?:[-_.:/+~]{1,2}[A-Za-z0-9]+)+")
_SEGMENT = re.compile(r"[A-Za-z0-9]+")
_DATE_TIME = re.compile(r"\d{1,4}[-/.]\d{1,2}[-/.]\d{1,4}(?:T\d{1,2}(?::\d\d){1,2}(?:\.\d+)?"
                        r"(?:Z|[+-]\d\d:?\d\d)?)?|\d{1,2}(?::\d\d){1,2}(?:\.\d+)?(?:[ap]m)?",
                        re.IGNORECASE)
# ``5000ms``, ``1.5GB``, ``24-hour``, ``64-bit``.
_MEASURE = re.compile(r"\d+(?:[.,:]\d+)*[A-Za-z]{1,3}|\d+(?:-[a-z]+)+")
_CODE_NAME_SEGMENT = re.compile(r"[a-z]*\d{0,4}")
_NAME_AND_NUMBER = re.compile(r"[a-z]+-\d{1,2}")
_ERROR_LEAD = re.compile(r"E\d|E_|ERR(?:OR)?[-_.:]")
_TICKET_SHAPE = re.compile(r"#?[A-Z]{2,10}[-_.:]?\d+(?:[-_.:]\d+)*")
_UUID = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}")
_ABSOLUTE_PATH = re.compile(r"(?:~|\.\.?)?(?:/[\w.@+-]+){2,}/?|~/[\w.@+-]+(?:/[\w.@+-]+)*")
_RELATIVE_PATH = re.compile(r"[\w.-]+(?:/[\w.-]+)+\.([A-Za-z][A-Za-z0-9]{0,7})")
# Three or more parts are a path without an extension (``and/or`` is two).
_NESTED_PATH = re.compile(r"[\w.-]+(?:/[\w.-]*[A-Za-z][\w.-]*){2,}/?")
_WINDOWS_PATH = re.compile(r"[A-Za-z]:\\(?:[\w.-]+\\)*[\w.-]+")
_FILE_NAME = re.compile(r"[\w-]+\.([A-Za-z]+)")
# ``key=`` before a value that may hold a pin of its own (``pin=name==1.2``).
_KEY_PREFIX = re.compile(r"[\w.-]+=(?!=)")
_LINE_SUFFIX = re.compile(r"(?::\d+)+:?$|::.*$")
_ERROR_CODE = re.compile(r"E\d{3,5}(?:-[A-Z][A-Z0-9]*)*|(?:ORA|PLS|TNS|ERR|SQLSTATE)[-_]?\d{3,5}"
                         r"(?:[-_][A-Z0-9]+)*|ERR(?:_[A-Z0-9]+)+")
_ERROR_NAME = re.compile(r"(?:[a-z_][\w]*\.)*[A-Z][A-Za-z0-9]*(?:Error|Exception|Fault|Warning)")
_ERROR_CONSTANT = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")
_ERROR_WORDS = ("ERR", "FAIL", "TIMEOUT", "DENIED", "INVALID", "REFUSED", "RESET", "UNAVAILABLE",
                "NOT_FOUND", "CONFLICT", "EXCEEDED", "ABORT")
_VERSION = re.compile(rf"v\d+(?:\.\d+){{1,3}}{_PRERELEASE}|\d+(?:\.\d+){{2,3}}{_PRERELEASE}")
_SHORT_VERSION = re.compile(r"\d+\.\d+")
_TICKET = re.compile(r"([A-Z][A-Z0-9]{1,9})-\d{1,6}")
_HASH_TICKET = re.compile(r"#(\d{2,7}|[A-Z]\d{3,12})")
# A record number with a short prefix (``ORD-6703259``, ``#ORD-6703259``): longer than a
# ticket's number.
_RECORD_ID = re.compile(r"#?[A-Z]{2,6}-\d{7,12}")
_HASH = re.compile(r"[0-9a-f]{7,64}")
_CODE = re.compile(r"[A-Z0-9]{5,16}")
_TOKEN = re.compile(r"[A-Za-z0-9]{8,40}")
_SNAKE = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+")
_KEBAB = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)+")
_PHONE = re.compile(r"\+\d{7,15}|(?:\+?\d{1,3}[-.])?\d{3}[-.]\d{3}[-.]\d{4}")

# Labelled values, read where a word alone says too little. Group ``v`` is the value.
_ID_KEY = re.compile(
    r"(?:_id|_number|_code|Id|ID|Number|Code|\"id)\"\s*:\s*(?:\"(?P<v>[A-Za-z0-9][A-Za-z0-9_.:/"
    r"-]{2,63})\"|(?P<n>\d{3,20})\b)"
)
_CODE_IN_ARRAY = re.compile(r"[\[,]\s*\"(?P<v>[A-Z0-9]{5,12})\"(?=\s*[,\]])")
_HTTP_STATUS = re.compile(r"HTTP(?:/\d(?:\.\d)?)?[ :]+[45]\d\d\b")
_STATUS_CODE = re.compile(r"(?i:\bstatus(?: code)?)[ :]+[45]\d\d\b")
# Each starts with a literal, which the regex engine finds fast.
_PHONE_GROUPED = re.compile(r"\+\d{1,3}(?:[ .-]\d{2,5}){1,5}\b"
                            r"|\+\d{1,3}[ .-]?(?:\(\d{3}\)|\d{3})[ .-]?\d{3}[ .-]\d{4}\b"
                            r"|\(\d{3}\)[ .-]?\d{3}[ .-]\d{4}\b")
_PHONE_DIGITS = 7
_SPACED = re.compile(r"\S+")
_LABEL_WORDS = ("reservation", "booking", "confirmation", "order", "ticket", "account", "user",
                "customer", "member", "transaction", "invoice", "case", "flight", "record",
                "locator")
# Every match opens with one of ``_LABEL_WORDS``, in any case (``(?i)`` also takes dotless
# i and long s for i and s, which lowercasing leaves).
_LABELLED = re.compile(
    rf"(?i:\b(?:{'|'.join(_LABEL_WORDS)})(?:\s+(?:id|number|code|no\.?))?"
    r"\s*(?:is|:|=)?\s*)(?P<v>#?[A-Z0-9]{5,12})"
    rf"(?=[{_TRAILING}]*(?:[{_DELIMITERS}]|$))"
)


def find_identifiers(text: str, *, said: bool = True) -> list[tuple[str, str]]:
    """Return ``(value, kind)`` for every identifier in ``text``, in text order.

    ``said``: the text is what a user or an assistant wrote (or a tool call's arguments),
    not a tool's output, where snake_case names with digits are code, not ids.
    """
    found: list[tuple[int, str, str]] = []
    labelled = _find_labelled(text, found, said)
    # [text before word 1, word 1, text before word 2, ...] in one C-level call, without a
    # match object per word: the words' offsets are running sums of the parts' lengths.
    parts = _CANDIDATE.split(text)
    part_ends = list(accumulate(map(len, parts)))
    for index, typed in enumerate(map(classify_word, parts[1::2], repeat(said))):
        if typed is None:
            continue
        start = part_ends[2 * index]
        if labelled and not labelled.isdisjoint(range(start, part_ends[2 * index + 1])):
            continue
        offset, value, kind = typed
        if kind == "short_version":
            if not text[max(0, start - 9):start].rstrip().lower().endswith(_RUNTIMES):
                continue
            kind = "version"
        found.append((start + offset, value, kind))
    found.sort(key=lambda item: item[0])
    return [(value, kind) for _, value, kind in found]


def _find_labelled(text: str, found: list[tuple[int, str, str]], said: bool) -> set[int]:
    """Add the labelled values to ``found``; return the positions of the words they cover."""
    covered: set[int] = set()
    rules = [_ID_KEY, _CODE_IN_ARRAY] if '"' in text else []
    if "HTTP" in text:
        rules.append(_HTTP_STATUS)
    if "tatus" in text or "TATUS" in text:
        rules.append(_STATUS_CODE)
    if "(" in text or "+" in text:
        rules.append(_PHONE_GROUPED)
    # "order id is X" where it is said; JSON text is read by its keys instead.
    if said and text.lstrip()[:1] not in ("{", "["):
        rules.append(_LABELLED)
    for rule in rules:
        for match in _labelled_matches(text) if rule is _LABELLED else rule.finditer(text):
            group: str | int = 0
            if "v" in rule.groupindex:
                group = "v" if match.group("v") is not None else "n"
            start = match.start(group)
            if start in covered:
                continue
            value = match.group(group)
            if rule is _PHONE_GROUPED and sum(map(str.isdigit, value)) < _PHONE_DIGITS:
                continue
            typed = classify_word(value, True) if group else None
            kind = typed[2] if typed and typed[2] != "short_version" else _labelled_kind(rule)
            found.append((start, value, kind))
            covered.update(start + word.start() for word in _SPACED.finditer(value))
    return covered


def _labelled_matches(text: str) -> Iterator[re.Match[str]]:
    """``_LABELLED.finditer(text)``'s matches, the engine started only where a label word
    opens, found by ``str.find`` in the lowercased text: the case-insensitive alternation
    is slow to try at every position. When lowercasing moves offsets, every one is tried."""
    lowered = text.lower()
    if len(lowered) != len(text):
        yield from _LABELLED.finditer(text)
        return
    if not text.isascii():
        lowered = lowered.replace("\u0131", "i").replace("\u017f", "s")
    opens: set[int] = set()
    for word in _LABEL_WORDS:
        at = lowered.find(word)
        while at >= 0:
            opens.add(at)
            at = lowered.find(word, at + 1)
    end = 0
    for at in sorted(opens):
        match = _LABELLED.match(text, at) if at >= end else None
        if match:
            yield match
            end = match.end()


def _labelled_kind(rule: re.Pattern[str]) -> str:
    if rule is _HTTP_STATUS or rule is _STATUS_CODE:
        return "error"
    return "phone" if rule is _PHONE_GROUPED else "id"


@lru_cache(maxsize=1 << 16)
def classify_word(word: str, said: bool) -> tuple[int, str, str] | None:
    """Return ``(offset, value, kind)`` of the identifier a word holds, or None.

    ``short_version`` marks ``3.11``: a version only after a runtime's name.
    """
    trimmed = word.rstrip(_TRAILING)
    if not trimmed:
        return None
    typed = _classify(trimmed, said)
    if typed is not None or "=" not in trimmed or _PIN.fullmatch(trimmed):
        return None if typed is None else (0, typed[0], typed[1])
    # ``key=value`` (log fields, options): the value, as written.
    key = _KEY_PREFIX.match(trimmed)
    offset = key.end() if key else trimmed.rindex("=") + 1
    inner = classify_word(trimmed[offset:], said)
    return None if inner is None else (offset + inner[0], inner[1], inner[2])


def _classify(word: str, said: bool) -> tuple[str, str] | None:
    """The kind of one trimmed word (most specific first), or None."""
    if word.isdigit():
        return None  # a number without context (the most common word no rule can type)
    if "://" in word:
        url = _URL.search(word)
        return (url.group().rstrip(_TRAILING), "url") if url else None
    if "@" in word:
        if _EMAIL.fullmatch(word):
            return word, "email"
        if _AT_PIN.fullmatch(word) or _NAMED_VERSION.fullmatch(word):
            return word, "version"
        return None
    if _PIN.fullmatch(word) or _NAMED_VERSION.fullmatch(word):
        return word, "version"
    if len(word) == 36 and _UUID.fullmatch(word):
        return word, "uuid"
    path = _classify_path(word)
    if path is not None:
        return path, "path"
    return _classify_code(word, said)


def _classify_path(word: str) -> str | None:
    if "/" in word or "\\" in word:
        path = _LINE_SUFFIX.sub("", word)
        if _ABSOLUTE_PATH.fullmatch(path) or _WINDOWS_PATH.fullmatch(path):
            return path
        relative = _RELATIVE_PATH.fullmatch(path)
        if relative:
            return None if relative.group(1).isdigit() else path
        return path if _NESTED_PATH.fullmatch(path) else None
    if "." in word:
        name = _FILE_NAME.fullmatch(_LINE_SUFFIX.sub("", word))
        if name and name.group(1) in _EXTENSIONS:
            return name.group()
    return None


def _classify_code(word: str, said: bool) -> tuple[str, str] | None:
    """Error codes, versions, tickets, hashes, phone numbers and ids."""
    if _ERROR_CODE.fullmatch(word) or word in _ERRNO_NAMES or _ERROR_NAME.fullmatch(word):
        return word, "error"
    if _ERROR_CONSTANT.fullmatch(word):
        if _ERROR_LEAD.match(word) or any(part in word for part in _ERROR_WORDS):
            return word, "error"
        if not any(char.isdigit() for char in word):
            return None  # a constant in code (``RETRY_LIMIT``)
    if _PHONE.fullmatch(word):
        return word, "phone"
    if _VERSION.fullmatch(word):
        return word, "version"
    if _SHORT_VERSION.fullmatch(word):
        return word, "short_version"
    ticket = _TICKET.fullmatch(word)
    if ticket:
        return (word, "ticket") if ticket.group(1) not in _NOT_TICKETS else None
    hashed = _HASH_TICKET.fullmatch(word)
    if hashed:
        return word, "ticket" if hashed.group(1).isdigit() else "id"
    if _RECORD_ID.fullmatch(word):
        return word, "id"
    return _classify_id(word, said)


def _classify_id(word: str, said: bool) -> tuple[str, str] | None:
    if not any(char.isdigit() for char in word):
        return None  # a word
    if _HASH.fullmatch(word):
        return word, "hash"
    if _CODE.fullmatch(word) or _HEX_CODE.fullmatch(word):
        return word, "id"
    if word[0] == "#" and len(word) > 3 and word[1:].isalnum():
        return word, "id"  # a numbered record: #CP885879
    if _TOKEN.fullmatch(word) and not word.islower() and not word.isupper():
        return word, "id"
    if _COMPOUND.fullmatch(word):
        return _classify_compound(word, said)
    if (word.isalnum() and len(word) >= 6 and sum(char.isdigit() for char in word) >= 4
            and not _MEASURE.fullmatch(word)):
        return word, "id"
    return None


def _classify_compound(word: str, said: bool) -> tuple[str, str] | None:
    """Letters and digits joined by separators: an identifier unless its shape says it
    is a number, a date, a time, a measure, a standard's name or a code-local name."""
    segments = _SEGMENT.findall(word)
    if all(segment.isdigit() for segment in segments):
        digits = sum(map(len, segments))
        return (word, "phone") if word[0] == "+" and digits >= 7 else None
    if _DATE_TIME.fullmatch(word) or _MEASURE.fullmatch(word):
        return None
    if len(segments) == 2 and segments[0].upper() in _NOT_TICKETS and segments[1].isdigit():
        return None  # UTF-8, SHA-256
    if word == word.lower():
        # A short number after a lower-case name is code's (``queue_2``, ``x86_64``) in a
        # tool's output, and a model's or a standard's name (``gpt-4``) when said.
        if not said and all(map(_CODE_NAME_SEGMENT.fullmatch, segments)):
            return None
        if said and _NAME_AND_NUMBER.fullmatch(word):
            return None
    if _ERROR_LEAD.match(word):
        return word, "error"
    return word, "ticket" if _TICKET_SHAPE.fullmatch(word) else "id"
