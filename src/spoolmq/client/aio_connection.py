"""Connecting to a broker from asyncio: the same socket, authkey challenge and
``hello``/``welcome`` as ``client/connection.py``, on the event loop's transport instead of
a blocking ``multiprocessing.connection.Connection``.

The broker's listener is a ``multiprocessing.connection.Listener``, so this speaks that
module's wire format, re-done for an event loop (its functions block on the socket):

* framing: each message is a 4-byte big-endian signed size, or ``-1`` and an 8-byte size for
  one over 2 GiB, then the bytes (``FrameStream``, an ``asyncio.Protocol``);
* authentication, both ways: the listener sends ``#CHALLENGE#`` and random bytes, the client
  answers with their HMAC under the authkey and gets ``#WELCOME#`` (or ``#FAILURE#``); then
  the client challenges the listener the same way, so each side knows the other holds the
  key. Python up to 3.11 uses HMAC-MD5 on a bare challenge; 3.12 prefixes the challenge and
  the answer with the digest's name (``{sha256}``). We answer in whichever form we are
  asked, and challenge in the bare form, which every version answers.
"""

from __future__ import annotations

import asyncio
import hmac
import os
from collections import deque
from collections.abc import Callable

from spoolmq import protocol
from spoolmq.client import connection
from spoolmq.client.connection import Address, hello_frame
from spoolmq.errors import AuthenticationError, BrokerUnavailableError

_CHALLENGE = b"#CHALLENGE#"
_WELCOME = b"#WELCOME#"
_FAILURE = b"#FAILURE#"
_LONG_SIZE = -1
_HANDSHAKE_BYTES = 256  # what multiprocessing reads at most for each handshake message


class FrameStream(asyncio.Protocol):
    """One connection's frames, as an ``asyncio.Protocol``: the event loop hands it the
    bytes as they arrive and it cuts them into frames at once. A client then either awaits
    ``read()`` (the handshake does) or sets ``on_frame`` to take every frame in the loop's
    own callback, with no reader task to wake per frame: an idle consumer woken for each
    message pays one callback instead of a task step and two futures. ``write`` hands a
    frame to the transport without waiting; ``drain`` waits while its buffer is over the
    high-water mark.

    When the connection ends (or sends a frame over ``max_bytes``) ``read``/``drain`` raise
    ConnectionResetError and ``on_lost`` is called once with the reason."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._frames: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self._paused = False
        self._lost: BaseException | None = None
        self.max_bytes = protocol.MAX_FRAME_BYTES
        self.on_frame: Callable[[bytes], None] | None = None
        self.on_lost: Callable[[BaseException], None] | None = None

    # -- what the event loop calls -----------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start = 0
        end = len(buffer)
        while end - start >= 4:
            size = int.from_bytes(buffer[start : start + 4], "big", signed=True)
            head = 4
            if size == _LONG_SIZE:
                if end - start < 12:
                    break
                size = int.from_bytes(buffer[start + 4 : start + 12], "big")
                head = 12
            if not 0 <= size <= self.max_bytes:
                self._fail(OSError(f"bad message length: {size} (limit {self.max_bytes})"))
                return
            if end - start < head + size:
                break
            frame = bytes(buffer[start + head : start + head + size])
            start += head + size
            if self.on_frame is None:
                self._frames.append(frame)
                continue
            try:
                self.on_frame(frame)
            except Exception as exc:  # a bad frame, or the broker's error: the connection ends
                self._fail(exc)
                return
        if start:
            del buffer[:start]
        if self._frames:
            _wake(self._waiter)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionResetError("the broker closed the connection"))

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        _wake(self._drain)

    # -- what the client calls --------------------------------------------------------

    def take_frames(
        self, on_frame: Callable[[bytes], None], on_lost: Callable[[BaseException], None]
    ) -> None:
        """From now on, hand every frame to ``on_frame`` as it arrives (those already
        read first) and the end of the connection to ``on_lost``."""
        self.on_frame, self.on_lost = on_frame, on_lost
        while self._frames and self._lost is None:
            frame = self._frames.popleft()
            try:
                on_frame(frame)
            except Exception as exc:
                self._fail(exc)
        if self._lost is not None:
            on_lost(self._lost)

    def write(self, data: bytes) -> None:
        assert self._transport is not None
        size = len(data)
        if size <= 0x7FFFFFFF:
            self._transport.write(size.to_bytes(4, "big", signed=True) + data)
        else:
            self._transport.write(
                _LONG_SIZE.to_bytes(4, "big", signed=True) + size.to_bytes(8, "big")
            )
            self._transport.write(data)

    async def drain(self) -> None:
        while self._paused and self._lost is None:
            self._drain = asyncio.get_running_loop().create_future()
            await self._drain
        if self._lost is not None:
            raise ConnectionResetError(f"lost the broker: {self._lost}")

    async def read(self, max_bytes: int = protocol.MAX_FRAME_BYTES) -> bytes:
        """The next frame (ConnectionResetError once the connection has ended; OSError
        for a frame over ``max_bytes``, as ``Connection.recv_bytes``)."""
        while not self._frames:
            if self._lost is not None:
                raise ConnectionResetError(f"lost the broker: {self._lost}")
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        frame = self._frames.popleft()
        if len(frame) > max_bytes:
            raise OSError(f"bad message length: {len(frame)} (the limit is {max_bytes} bytes)")
        return frame

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    async def wait_closed(self) -> None:
        """Let the loop run the transport's close (the socket is closed on the next turn)."""
        await asyncio.sleep(0)

    def _fail(self, exc: BaseException) -> None:
        if self._lost is not None:
            return
        self._lost = exc
        if self._transport is not None:
            self._transport.abort()
        _wake(self._waiter)
        _wake(self._drain)
        if self.on_lost is not None:
            self.on_lost(exc)


def _wake(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


# The bare (MD5) form's lengths: a challenge of 20 random bytes, an answer of a 16-byte
# digest. Either may begin with "{" by chance, so the length decides first, as
# multiprocessing itself does (Python 3.12+); a prefixed message is always longer.
_BARE_LENGTHS = (16, 20)


def _digest_name(message: bytes) -> str | None:
    """``sha256`` for a ``{sha256}…`` challenge or answer, None for the bare (MD5) form."""
    if len(message) in _BARE_LENGTHS:
        return None
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
    same errors as ``client.connection.connect``, and the same bound on a broker that does
    not answer (``CONNECT_TIMEOUT_S``, here for the whole greeting)."""
    try:
        async with asyncio.timeout(connection.CONNECT_TIMEOUT_S):
            return await _connect(address, authkey, role, name)
    except TimeoutError:
        raise BrokerUnavailableError(
            f"the broker at {address} did not answer within {connection.CONNECT_TIMEOUT_S:g} s"
        ) from None


async def _connect(
    address: Address, authkey: bytes, role: str, name: str
) -> tuple[FrameStream, str]:
    try:
        loop = asyncio.get_running_loop()
        if isinstance(address, str):
            _, stream = await loop.create_unix_connection(FrameStream, address)
        else:
            _, stream = await loop.create_connection(FrameStream, address[0], address[1])
    except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError) as exc:
        raise BrokerUnavailableError(
            f"no broker is listening at {address} ({type(exc).__name__}); "
            "start one with `spoolmq broker`"
        ) from None
    except OSError as exc:
        raise BrokerUnavailableError(f"cannot connect to {address}: {exc}") from None
    try:
        await _authenticate(stream, authkey)
        stream.write(protocol.encode(hello_frame(role, name)))
        welcome = protocol.decode(await stream.read())
        protocol.raise_if_error(welcome)
    except OSError as exc:
        stream.close()
        raise BrokerUnavailableError(f"the broker closed the connection: {exc}") from None
    except BaseException:
        stream.close()
        raise
    return stream, str(welcome.get("client_id", ""))
