"""SASLprep (RFC 4013): the string preparation SCRAM (RFC 5802) asks for user passwords.

SASLprep maps a password to a canonical form before it is hashed, so that two ways of
typing the same text (a composed "é" or "e" plus a combining accent, a no-break space)
give the same credential, and refuses characters that have no place in one (controls,
private use, unpaired surrogates, bidirectional text that reads two ways):

1. map: a non-ASCII space (table C.1.2) becomes U+0020; characters "commonly mapped to
   nothing" (table B.1: soft hyphen, zero-width joiners, variation selectors) are removed;
2. normalise with Unicode 3.2's NFKC (the version stringprep is defined against);
3. prohibit tables C.1.2, C.2.1, C.2.2, C.3-C.9, and for a stored string also
   unassigned code points (A.1);
4. bidirectional rule (RFC 3454 section 6): a string with right-to-left characters has no
   left-to-right ones and starts and ends with a right-to-left one.

Kafka's own brokers and the common clients (librdkafka, the Java client, kafka-python) hash
the password's UTF-8 bytes as they are, without SASLprep. So ``spoolmq users add`` accepts
only passwords that SASLprep leaves unchanged (:func:`check_stable_password`): for those
both readings give the same bytes, and a client that prepares its password and one that
does not both log in. Every printable ASCII password is such a password.

The tables come from the standard library's :mod:`stringprep` module.
"""

from __future__ import annotations

import stringprep
import unicodedata

from spoolmq.errors import InvalidArgumentError

_PROHIBITED = (
    ("a non-ASCII space", stringprep.in_table_c12),
    ("an ASCII control character", stringprep.in_table_c21),
    ("a non-ASCII control character", stringprep.in_table_c22),
    ("a private-use character", stringprep.in_table_c3),
    ("a non-character code point", stringprep.in_table_c4),
    ("a surrogate code point", stringprep.in_table_c5),
    ("a character not for plain text", stringprep.in_table_c6),
    ("a character not for canonical representation", stringprep.in_table_c7),
    ("a character that changes display properties", stringprep.in_table_c8),
    ("a tagging character", stringprep.in_table_c9),
)


def saslprep(text: str, *, stored: bool = True) -> str:
    """``text`` prepared by SASLprep; :class:`InvalidArgumentError` naming the first
    character it prohibits. ``stored`` (a password being stored, not one being checked)
    also refuses code points unassigned in Unicode 3.2."""
    mapped = "".join(
        " " if stringprep.in_table_c12(ch) else ch for ch in text if not stringprep.in_table_b1(ch)
    )
    prepared = unicodedata.ucd_3_2_0.normalize("NFKC", mapped)
    for position, ch in enumerate(prepared):
        for what, in_table in _PROHIBITED:
            if in_table(ch):
                raise InvalidArgumentError(
                    f"the password has {what} (U+{ord(ch):04X}) at position {position}"
                )
        if stored and stringprep.in_table_a1(ch):
            raise InvalidArgumentError(
                f"the password has a code point unassigned in Unicode 3.2 "
                f"(U+{ord(ch):04X}) at position {position}"
            )
    right_to_left = [stringprep.in_table_d1(ch) for ch in prepared]
    if any(right_to_left):
        if any(stringprep.in_table_d2(ch) for ch in prepared):
            raise InvalidArgumentError(
                "the password mixes right-to-left and left-to-right characters"
            )
        if not (right_to_left[0] and right_to_left[-1]):
            raise InvalidArgumentError(
                "a password with right-to-left characters must start and end with one"
            )
    return prepared


def check_stable_password(password: str) -> str:
    """``password`` if SASLprep leaves it as it is (see the module docstring), else an
    :class:`InvalidArgumentError` saying why and what to do."""
    prepared = saslprep(password)
    if prepared != password:
        raise InvalidArgumentError(
            "SASLprep changes this password (it has characters that are mapped, removed or "
            "written another way once normalised), and Kafka clients differ on whether they "
            "apply it: choose a password that needs no preparation (e.g. printable ASCII)"
        )
    return password
