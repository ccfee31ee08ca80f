"""The asyncio client's side of multiprocessing's authentication handshake: which digest
a challenge or an answer asks for.

A bare (MD5) challenge is 20 random bytes and a bare answer a 16-byte digest; either can
begin with "{" and hold a "}" by chance (about one connection in a few thousand), which
must not be read as a ``{digest}`` prefix (it once failed a run of the bench with "the
broker asked for an unknown digest").
"""

from __future__ import annotations

import hashlib
import hmac
import itertools

from hypothesis import given
from hypothesis import strategies as st

from spoolmq.client.aio_connection import _answer_is_right, _response

KEY = b"k" * 32


@given(st.binary(min_size=20, max_size=20))
def test_a_bare_challenge_gets_an_md5_answer_whatever_its_bytes(challenge: bytes) -> None:
    assert _response(KEY, challenge) == hmac.new(KEY, challenge, "md5").digest()


def test_a_bare_challenge_that_looks_prefixed_still_gets_an_md5_answer() -> None:
    challenge = b"{d\xff*}" + bytes(range(15))  # 20 bytes: "{", a "name", "}"
    assert _response(KEY, challenge) == hmac.new(KEY, challenge, "md5").digest()


def test_a_prefixed_challenge_gets_an_answer_with_its_digest() -> None:
    payload = bytes(range(40))
    answer = _response(KEY, b"{sha256}" + payload)
    assert answer == b"{sha256}" + hmac.new(KEY, b"{sha256}" + payload, "sha256").digest()


def test_a_bare_md5_answer_that_begins_with_a_brace_is_checked_as_md5() -> None:
    # A challenge whose MD5 answer looks like "{name}...": found by counting.
    for n in itertools.count():
        challenge = hashlib.sha1(str(n).encode()).digest()  # 20 bytes
        answer = hmac.new(KEY, challenge, "md5").digest()
        if answer.startswith(b"{") and b"}" in answer[2:18]:
            break
    assert _answer_is_right(KEY, challenge, answer)
    assert not _answer_is_right(KEY, challenge, answer[:-1] + bytes([answer[-1] ^ 1]))
