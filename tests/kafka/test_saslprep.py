"""SASLprep (RFC 4013) against the examples of RFC 4013 section 3 and properties that any
correct preparation has."""

from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spoolmq.errors import InvalidArgumentError
from spoolmq.kafka.saslprep import check_stable_password, saslprep


@pytest.mark.parametrize(
    ("given_text", "prepared"),
    [
        ("I\u00adX", "IX"),  # soft hyphen mapped to nothing
        ("user", "user"),  # no transformation
        ("USER", "USER"),  # case preserved
        ("\u00aa", "a"),  # NFKC of the feminine ordinal indicator
        ("\u2168", "IX"),  # NFKC of ROMAN NUMERAL NINE
        ("a\u00a0b", "a b"),  # a non-ASCII space becomes a space
        ("e\u0301", "\u00e9"),  # composed
    ],
)
def test_rfc_4013_examples_and_mappings(given_text: str, prepared: str) -> None:
    assert saslprep(given_text) == prepared


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("\u0007", "ASCII control"),  # RFC 4013's example 6
        ("\u0627\u0031", "start and end"),  # RFC 4013's example 7: RandALCat not last
        ("\u0627a\u0627", "mixes"),  # right-to-left with left-to-right
        ("\ue000", "private-use"),
        ("\ud800", "surrogate"),
        ("\U000e0001", "tagging"),
        ("\u0221", "unassigned"),  # unassigned in Unicode 3.2
    ],
)
def test_prohibited_input_is_refused_with_the_reason(text: str, why: str) -> None:
    with pytest.raises(InvalidArgumentError, match=why):
        saslprep(text)


def test_a_query_may_hold_unassigned_code_points() -> None:
    assert saslprep("\u0221", stored=False) == "\u0221"


def test_right_to_left_text_that_starts_and_ends_right_to_left_is_accepted() -> None:
    assert saslprep("\u0627\u0031\u0628") == "\u0627\u0031\u0628"


@given(st.text(alphabet=string.printable.strip(string.whitespace) + " ", min_size=1))
def test_printable_ascii_is_left_unchanged(password: str) -> None:
    assert saslprep(password) == password
    assert check_stable_password(password) == password


@given(st.text(max_size=30))
def test_preparation_is_idempotent(text: str) -> None:
    try:
        prepared = saslprep(text)
    except InvalidArgumentError:
        return
    assert saslprep(prepared) == prepared


def test_a_password_preparation_would_change_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="SASLprep changes"):
        check_stable_password("I\u00adX")
    assert check_stable_password("\u00e9t\u00e9") == "\u00e9t\u00e9"  # already composed
