"""The wire protocol between clients and the broker (docs/PROTOCOL.md).

``frames`` frames, checks and sends every frame; ``publish`` is the codec of a publish
frame's messages, used by the Publisher client to encode and by the PublisherBroker to
decode; ``auth`` names the socket and the authkey of a data directory; ``greeting``
connects and authenticates a client, every step bounded. The names most
callers need are here: ``from spoolmq import protocol; protocol.send(conn, frame)``.
"""

from spoolmq.protocol.auth import (
    AUTHKEY_FILE,
    SOCKET_FILE,
    read_authkey,
    read_or_create_authkey,
)
from spoolmq.protocol.frames import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    FrameReader,
    FrameWriter,
    PipeFrames,
    borrowed_socket,
    check_client_frame,
    cut_off,
    decode,
    encode,
    encode_delivery,
    error_frame,
    raise_if_error,
    receive,
    send,
    split_frame,
)

__all__ = [
    "AUTHKEY_FILE",
    "MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "SOCKET_FILE",
    "FrameReader",
    "FrameWriter",
    "PipeFrames",
    "borrowed_socket",
    "check_client_frame",
    "cut_off",
    "decode",
    "encode",
    "encode_delivery",
    "error_frame",
    "raise_if_error",
    "read_authkey",
    "read_or_create_authkey",
    "receive",
    "send",
    "split_frame",
]
