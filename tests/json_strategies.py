"""Hypothesis strategies for the JSON values a message may carry, shared by the tests that
check a fast encoder against the plain way of writing the same bytes."""

from __future__ import annotations

from hypothesis import strategies as st

TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)  # no lone surrogates
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=12,
)
