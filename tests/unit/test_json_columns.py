"""The engines' JSON column decoder answers exactly as ``json.loads`` does, for the
text SQLite hands back and the UTF-8 bytes PostgreSQL does."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from db.engine import load_json

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(JSON_VALUES, st.booleans())
def test_a_json_column_decodes_as_json_loads_does(value: object, ascii_only: bool) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert load_json(text) == json.loads(text)
    assert load_json(text.encode()) == json.loads(text.encode())
