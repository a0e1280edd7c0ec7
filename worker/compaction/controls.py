"""Control characters: what makes an id unprintable (C0, DEL, C1, Unicode format and bidi
controls, line and paragraph separators), found at intake and escaped on output, so
that no stored text can move a terminal's cursor, recolour it or reorder what it shows.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable

# Cc: C0, DEL and C1; Cf: format controls (bidi overrides and isolates, zero-width
# joiners, the BOM, soft hyphen); Zl, Zp: the line and paragraph separators.
_CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})
# Every control character is outside printable ASCII: only those are looked up.
_SUSPECT = re.compile(r"[^\x20-\x7e]")


def is_control_character(char: str) -> bool:
    """True for one character a terminal may act on instead of showing."""
    return unicodedata.category(char) in _CONTROL_CATEGORIES


def find_control_character(field: str, text: str) -> str | None:
    """Why ``text`` is no printable ``field``: its first control character and where it
    is (counted from 0), e.g. ``session_id contains control character U+001B at
    position 3``; None when it has none."""
    if text.isprintable():  # no control character is printable: the common case is quick
        return None
    for position, char in enumerate(text):
        if is_control_character(char):
            return (f"{field} contains control character U+{ord(char):04X} at position "
                    f"{position}")
    return None


def escape_controls(text: str) -> str:
    """``text`` with each control character written as its escape (ESC as ``\\x1b``,
    U+202E as ``\\u202e``): safe to print, and still tells what was there."""
    return _replace_controls(text, _escape)


def escape_controls_in_json(text: str) -> str:
    """JSON ``text`` with each control character left in it (DEL, C1, format controls:
    ``json.dumps`` keeps them when not ASCII-only) as its ``\\uXXXX`` escape: the same
    JSON value, safe to print."""
    return _replace_controls(text, lambda char: json.dumps(char)[1:-1])


def _replace_controls(text: str, replace: Callable[[str], str]) -> str:
    if text.isprintable():
        return text
    return _SUSPECT.sub(
        lambda m: replace(m[0]) if is_control_character(m[0]) else m[0], text)


def _escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
