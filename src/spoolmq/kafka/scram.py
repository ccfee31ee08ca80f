"""SCRAM-SHA-256 (RFC 5802, RFC 7677), the server's side, and the users file it reads.

SCRAM lets a client prove it knows a password without sending it, and lets the server
check the proof without storing it: the server keeps, per user, a random salt, an
iteration count and two keys derived from the salted password:

    SaltedPassword = PBKDF2-HMAC-SHA-256(password, salt, iterations)
    StoredKey      = SHA-256(HMAC(SaltedPassword, "Client Key"))
    ServerKey      = HMAC(SaltedPassword, "Server Key")

A stolen users file gives neither the password nor a working proof (the proof needs
ClientKey, and StoredKey is only its hash). The exchange is two round trips:

    client-first  n,,n=USER,r=CNONCE
    server-first  r=CNONCE+SNONCE,s=SALT,i=ITERATIONS
    client-final  c=biws,r=CNONCE+SNONCE,p=PROOF        (PROOF = ClientKey XOR ClientSignature)
    server-final  v=SERVER-SIGNATURE                    (or e=... on failure)

where both signatures are HMACs over the "auth message" (the three messages without the
proof), so a replayed or altered exchange fails. Every message is bounded in size and
parsed without loops that depend on the client beyond its few attributes.

The users file (``users`` in the data directory, mode 0600, written atomically) is JSON:
``{"version": 1, "users": {NAME: {"mechanism": "SCRAM-SHA-256", "salt": B64,
"iterations": N, "stored_key": B64, "server_key": B64}}}`` (docs/FORMAT.md).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from spoolmq.errors import ConfigError, InvalidArgumentError
from spoolmq.files import FILE_MODE, write_durably

MECHANISM = "SCRAM-SHA-256"
USERS_FILE = "users"
# RFC 7677 asks for at least 4096; Kafka's default is 4096. More costs every client
# (librdkafka, kafka-python) the same PBKDF2 work on each connection.
DEFAULT_ITERATIONS = 8192
MIN_ITERATIONS = 4096
MAX_ITERATIONS = 1_000_000
SALT_BYTES = 16
# No SCRAM message of a sane client comes near this; a larger one is refused unread.
MAX_MESSAGE_BYTES = 2048
USER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$")


class ScramError(Exception):
    """The client's SCRAM message is malformed, or its proof is wrong."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise ScramError("bad base64") from None


def _hmac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


@dataclass(frozen=True)
class Credential:
    """What the server keeps of one user's password."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def derive(
        cls, password: str, *, salt: bytes | None = None, iterations: int = DEFAULT_ITERATIONS
    ) -> Credential:
        salt = salt if salt is not None else secrets.token_bytes(SALT_BYTES)
        # Passwords are used as their UTF-8 bytes, as Kafka does; `spoolmq users add`
        # stores only passwords SASLprep leaves unchanged (kafka/saslprep.py), so clients
        # that prepare them and clients that do not hash the same bytes.
        salted = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
        client_key = _hmac(salted, b"Client Key")
        return cls(
            salt, iterations, hashlib.sha256(client_key).digest(), _hmac(salted, b"Server Key")
        )

    def to_json(self) -> dict[str, object]:
        return {
            "mechanism": MECHANISM,
            "salt": _b64(self.salt),
            "iterations": self.iterations,
            "stored_key": _b64(self.stored_key),
            "server_key": _b64(self.server_key),
        }

    @classmethod
    def from_json(cls, data: object) -> Credential:
        if not isinstance(data, dict) or data.get("mechanism") != MECHANISM:
            raise ConfigError("users file: an entry is not a SCRAM-SHA-256 credential")
        try:
            return cls(
                base64.b64decode(data["salt"], validate=True),
                int(data["iterations"]),
                base64.b64decode(data["stored_key"], validate=True),
                base64.b64decode(data["server_key"], validate=True),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"users file: a damaged credential ({exc})") from None


# -- the users file ------------------------------------------------------------------------


def users_path(data_dir: Path) -> Path:
    return Path(data_dir) / USERS_FILE


def load_users(data_dir: Path) -> dict[str, Credential]:
    """Every user of the data directory (none when the file does not exist)."""
    path = users_path(data_dir)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        raise ConfigError(f"{path} is not JSON") from None
    if (
        not isinstance(data, dict)
        or data.get("version") != 1
        or not isinstance(data.get("users"), dict)
    ):
        raise ConfigError(f"{path} is not a spoolmq users file (version 1)")
    return {name: Credential.from_json(entry) for name, entry in data["users"].items()}


def save_users(data_dir: Path, users: dict[str, Credential]) -> None:
    """Replace the users file atomically (a reader sees the old or the new one), 0600."""
    body = {"version": 1, "users": {n: c.to_json() for n, c in sorted(users.items())}}
    write_durably([(users_path(data_dir), json.dumps(body, indent=2).encode() + b"\n")])


def update_users(data_dir: Path, change: Callable[[dict[str, Credential]], None]) -> None:
    """Load the users, let ``change`` edit them, save them: under ``users.lock``, so two
    ``spoolmq users`` commands at once cannot lose each other's change."""
    lock = FileLock(str(Path(data_dir) / f"{USERS_FILE}.lock"), timeout=30, mode=FILE_MODE)
    with lock:
        users = load_users(data_dir)
        change(users)
        save_users(data_dir, users)


def check_user_name(name: str) -> str:
    if not USER_NAME.match(name):
        raise InvalidArgumentError(
            f"user name {name!r} must match {USER_NAME.pattern} (letters, digits, . _ @ -)"
        )
    return name


# -- the server's side of one exchange ---------------------------------------------------


def _attributes(message: str, expected: str) -> dict[str, str]:
    """``k=v`` attributes in order; ``expected`` are the first keys, in that order."""
    parts = message.split(",", 8)  # bounded: a client cannot make us split forever
    attrs: dict[str, str] = {}
    for part in parts:
        if len(part) < 2 or part[1] != "=":
            raise ScramError(f"malformed attribute {part[:20]!r}")
        attrs.setdefault(part[0], part[2:])
    if "".join(p[0] for p in parts[: len(expected)]) != expected:
        raise ScramError(f"attributes out of order: expected {expected}")
    if "m" in attrs:
        raise ScramError("mandatory extensions are not supported")
    return attrs


def _sasl_name(text: str) -> str:
    # RFC 5802: "," and "=" in a name arrive as "=2C" and "=3D"; any other "=" is an error.
    if re.search(r"=(?!2C|3D)", text):
        raise ScramError("bad escape in user name")
    return text.replace("=2C", ",").replace("=3D", "=")


class ScramServer:
    """One SCRAM-SHA-256 exchange: :meth:`first` answers the client-first message,
    :meth:`final` checks the client's proof and answers with the server's signature.

    ``lookup(user)`` gives the user's credential or None. An unknown user still gets a
    server-first message (with a salt derived from ``secret`` and the name, the same each
    time), and fails only at the proof, so the answers do not tell which names exist."""

    def __init__(
        self, lookup: dict[str, Credential], secret: bytes, *, server_nonce: str | None = None
    ) -> None:
        self._users = lookup
        # Fixed only by tests that replay RFC 7677's example exchange.
        self._server_nonce = server_nonce
        self._secret = secret
        self.user: str | None = None
        self._credential: Credential | None = None
        self._nonce = ""
        self._client_nonce = ""
        self._gs2 = ""
        self._auth_prefix = ""

    def first(self, message: bytes) -> bytes:
        text = self._text(message)
        # gs2 header: "n" (no channel binding) or "y" (client could, thinks we cannot),
        # then an optional authzid, which must name the same user.
        if not text.startswith(("n,", "y,")):
            raise ScramError("channel binding is not supported")
        gs2_end = text.find(",", 2)
        if gs2_end < 0:
            raise ScramError("no gs2 header")
        self._gs2 = text[: gs2_end + 1]
        authzid = text[2:gs2_end]
        bare = text[gs2_end + 1 :]
        attrs = _attributes(bare, "nr")
        user = _sasl_name(attrs["n"])
        if authzid and _sasl_name(authzid.removeprefix("a=")) != user:
            raise ScramError("authorization identity differs from the user")
        client_nonce = attrs["r"]
        if not client_nonce or len(client_nonce) > 256 or not client_nonce.isprintable():
            raise ScramError("bad client nonce")
        self.user = user
        self._credential = self._users.get(user)
        cred = self._credential or self._decoy(user)
        self._client_nonce = client_nonce
        self._nonce = client_nonce + (self._server_nonce or secrets.token_urlsafe(24))
        server_first = f"r={self._nonce},s={_b64(cred.salt)},i={cred.iterations}"
        self._auth_prefix = f"{bare},{server_first}"
        return server_first.encode()

    def final(self, message: bytes) -> bytes:
        if not self._nonce:
            raise ScramError("client-final before client-first")
        text = self._text(message)
        attrs = _attributes(text, "cr")
        if "p" not in attrs or not text.endswith(",p=" + attrs["p"]):
            raise ScramError("no proof")
        if _unb64(attrs["c"]) != self._gs2.encode():
            raise ScramError("channel binding data differs from the gs2 header")
        nonce = attrs["r"].encode()
        # RFC 5802: the nonce the server sent. librdkafka before 2.6.1 (Debian's kcat is
        # built with 2.0.2) sends its own nonce once more in front of it
        # (confluentinc/librdkafka#4895); Kafka 3.x takes that form too. Either way the
        # server's whole nonce, fresh for this exchange, is in it and under the proof.
        if not (
            hmac.compare_digest(nonce, self._nonce.encode())
            or hmac.compare_digest(nonce, (self._client_nonce + self._nonce).encode())
        ):
            raise ScramError("nonce differs")
        without_proof = text[: -len(",p=" + attrs["p"])]
        auth_message = f"{self._auth_prefix},{without_proof}".encode()
        proof = _unb64(attrs["p"])
        cred = self._credential
        if cred is None or len(proof) != len(cred.stored_key):
            raise ScramError("authentication failed")
        signature = _hmac(cred.stored_key, auth_message)
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        if not hmac.compare_digest(hashlib.sha256(client_key).digest(), cred.stored_key):
            raise ScramError("authentication failed")
        return f"v={_b64(_hmac(cred.server_key, auth_message))}".encode()

    def _decoy(self, user: str) -> Credential:
        salt = _hmac(self._secret, user.encode())[:SALT_BYTES]
        return Credential(salt, DEFAULT_ITERATIONS, b"", b"")

    @staticmethod
    def _text(message: bytes) -> str:
        if len(message) > MAX_MESSAGE_BYTES:
            raise ScramError(f"SCRAM message of {len(message)} bytes")
        try:
            return message.decode("utf-8")
        except UnicodeDecodeError:
            raise ScramError("SCRAM message is not UTF-8") from None


def server_secret() -> bytes:
    """A per-process secret for the decoy salts of unknown users."""
    return os.urandom(32)
