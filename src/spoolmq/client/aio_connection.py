"""Connecting to a broker from asyncio: the same socket, authkey challenge and
``hello``/``welcome`` as ``client/connection.py``, on asyncio streams instead of a blocking
``multiprocessing.connection.Connection``.

The broker's listener is a ``multiprocessing.connection.Listener``, so this speaks that
module's wire format, re-done for an event loop (its functions block on the socket):

* framing: each message is a 4-byte big-endian signed size, or ``-1`` and an 8-byte size for
  one over 2 GiB, then the bytes (``FrameStream``);
* authentication, both ways: the listener sends ``#CHALLENGE#`` and random bytes, the client
  answers with their HMAC under the authkey and gets ``#WELCOME#`` (or ``#FAILURE#``); then
  the client challenges the listener the same way, so each side knows the other holds the
  key. Python up to 3.11 uses HMAC-MD5 on a bare challenge; 3.12 prefixes the challenge and
  the answer with the digest's name (``{sha256}``). We answer in whichever form we are
  asked, and challenge in the bare form, which every version answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import os

from spoolmq import protocol
from spoolmq.client.connection import Address, hello_frame
from spoolmq.errors import AuthenticationError, BrokerUnavailableError

_CHALLENGE = b"#CHALLENGE#"
_WELCOME = b"#WELCOME#"
_FAILURE = b"#FAILURE#"
_LONG_SIZE = -1
_HANDSHAKE_BYTES = 256  # what multiprocessing reads at most for each handshake message


class FrameStream:
    """One connection's frames over asyncio streams: ``write`` queues a frame in the
    transport without waiting (the event loop sends it), ``drain`` waits while the socket's
    buffer is full, ``read`` returns the next whole frame."""

    __slots__ = ("_reader", "_writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    def write(self, data: bytes) -> None:
        size = len(data)
        if size <= 0x7FFFFFFF:
            self._writer.write(size.to_bytes(4, "big", signed=True) + data)
        else:
            self._writer.write(_LONG_SIZE.to_bytes(4, "big", signed=True) + size.to_bytes(8, "big"))
            self._writer.write(data)

    async def drain(self) -> None:
        await self._writer.drain()

    async def read(self, max_bytes: int = protocol.MAX_FRAME_BYTES) -> bytes:
        """The next frame; IncompleteReadError when the connection ends, OSError for a frame
        over ``max_bytes`` (as ``Connection.recv_bytes``)."""
        size = int.from_bytes(await self._reader.readexactly(4), "big", signed=True)
        if size == _LONG_SIZE:
            size = int.from_bytes(await self._reader.readexactly(8), "big")
        if not 0 <= size <= max_bytes:
            raise OSError(f"bad message length: {size} (the limit is {max_bytes} bytes)")
        return await self._reader.readexactly(size)

    def close(self) -> None:
        self._writer.close()

    async def wait_closed(self) -> None:
        # The other end may have gone first: the stream is closed all the same.
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            await self._writer.wait_closed()


def _digest_name(message: bytes) -> str | None:
    """``sha256`` for a ``{sha256}…`` challenge or answer, None for the bare (MD5) form."""
    if message.startswith(b"{"):
        end = message.find(b"}", 1, 20)
        if end > 0:
            return message[1:end].decode("ascii", "replace")
    return None


def _response(authkey: bytes, challenge: bytes) -> bytes:
    name = _digest_name(challenge)
    try:
        if name is None:
            return hmac.new(authkey, challenge, "md5").digest()
        return b"{%s}%s" % (name.encode(), hmac.new(authkey, challenge, name).digest())
    except ValueError:  # a digest this Python does not have
        raise AuthenticationError(f"the broker asked for an unknown digest {name!r}") from None


def _answer_is_right(authkey: bytes, challenge: bytes, answer: bytes) -> bool:
    name = _digest_name(answer)
    try:
        if name is None:
            expected = hmac.new(authkey, challenge, "md5").digest()
        else:
            prefix = b"{%s}" % name.encode()
            expected = prefix + hmac.new(authkey, challenge, name).digest()
    except ValueError:
        return False
    return hmac.compare_digest(expected, answer)


async def _authenticate(stream: FrameStream, authkey: bytes) -> None:
    """Both challenges, the client's side (``answer_challenge`` then
    ``deliver_challenge`` of ``multiprocessing.connection``)."""
    message = await stream.read(_HANDSHAKE_BYTES)
    if not message.startswith(_CHALLENGE):
        raise AuthenticationError("the broker did not send an authentication challenge")
    stream.write(_response(authkey, message[len(_CHALLENGE) :]))
    if await stream.read(_HANDSHAKE_BYTES) != _WELCOME:
        raise AuthenticationError("the broker refused the authkey: digest received was wrong")
    challenge = os.urandom(20)
    stream.write(_CHALLENGE + challenge)
    answer = await stream.read(_HANDSHAKE_BYTES)
    if not _answer_is_right(authkey, challenge, answer):
        stream.write(_FAILURE)
        raise AuthenticationError("the broker's answer to our challenge was wrong")
    stream.write(_WELCOME)


async def connect(
    address: Address, authkey: bytes, role: str, name: str = ""
) -> tuple[FrameStream, str]:
    """An authenticated asyncio connection that has been welcomed, and the client id; the
    same errors as ``client.connection.connect``."""
    try:
        if isinstance(address, str):
            reader, writer = await asyncio.open_unix_connection(address)
        else:
            reader, writer = await asyncio.open_connection(address[0], address[1])
    except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError) as exc:
        raise BrokerUnavailableError(
            f"no broker is listening at {address} ({type(exc).__name__}); "
            "start one with `spoolmq broker`"
        ) from None
    except OSError as exc:
        raise BrokerUnavailableError(f"cannot connect to {address}: {exc}") from None
    stream = FrameStream(reader, writer)
    try:
        await _authenticate(stream, authkey)
        stream.write(protocol.encode(hello_frame(role, name)))
        welcome = protocol.decode(await stream.read())
        protocol.raise_if_error(welcome)
    except (asyncio.IncompleteReadError, OSError) as exc:
        stream.close()
        raise BrokerUnavailableError(f"the broker closed the connection: {exc}") from None
    except BaseException:
        stream.close()
        raise
    return stream, str(welcome.get("client_id", ""))
