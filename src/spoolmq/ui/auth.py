"""Who may use the web console: the password, the API tokens and the browser sessions.

The password and the tokens live in the data directory (files 0600, as every runtime file),
stored only as hashes: the password as scrypt (memory-hard, so a stolen file is slow to
guess from), each token as SHA-256 (a token is 32 random bytes, so nothing can be guessed
from its hash and a fast hash is enough). Sessions are in memory: restarting the console
logs everyone out, which is the safe direction.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from spoolmq.errors import AuthenticationError, ConfigError, InvalidArgumentError
from spoolmq.files import check_data_dir, write_durably

PASSWORD_FILE = "ui_password"
TOKENS_FILE = "ui_tokens.json"
TOKEN_PREFIX = "smq_"
SESSION_SECONDS = 12 * 3600
MIN_PASSWORD = 8
# scrypt's cost: n=2**14, r=8 is 16 MiB and ~50 ms a try, the figure the Python docs and
# OWASP give for interactive logins.
_SCRYPT = {"n": 2**14, "r": 8, "p": 1, "dklen": 32}


def _scrypt(password: str, salt: bytes) -> bytes:
    return hashlib.scrypt(
        password.encode(),
        salt=salt,
        n=_SCRYPT["n"],
        r=_SCRYPT["r"],
        p=_SCRYPT["p"],
        maxmem=64 * 1024 * 1024,
        dklen=_SCRYPT["dklen"],
    )


def set_password(data: Path, password: str) -> None:
    """Store ``password``'s scrypt hash (and its salt and cost) in the data directory."""
    if len(password) < MIN_PASSWORD:
        raise InvalidArgumentError(f"the password needs at least {MIN_PASSWORD} characters")
    salt = secrets.token_bytes(16)
    record = {"scheme": "scrypt", **_SCRYPT, "salt": salt.hex()}
    record["hash"] = _scrypt(password, salt).hex()
    check_data_dir(data)  # 0700, or refused if others can write it (as the store does)
    write_durably([(data / PASSWORD_FILE, orjson.dumps(record))])


def password_is_set(data: Path) -> bool:
    return (data / PASSWORD_FILE).is_file()


def check_password(data: Path, password: str) -> bool:
    """Whether ``password`` is the console's; False when none is set (no way in)."""
    try:
        record = orjson.loads((data / PASSWORD_FILE).read_bytes())
        salt = bytes.fromhex(record["salt"])
        expected = bytes.fromhex(record["hash"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return hmac.compare_digest(_scrypt(password, salt), expected)


# -- API tokens -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """What ``ui token list`` shows: never the token, only its name, a short id and when."""

    id: str
    name: str
    created_ms: int


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


_TOKEN_FIELDS = {"id": str, "name": str, "created_ms": int, "sha256": str}
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class TokensDamagedError(ConfigError):
    """``ui_tokens.json`` is not what ``ui token create`` writes. It is left as it is: a
    rewrite would lose every token it still holds."""


def _load_tokens(data: Path) -> list[dict[str, Any]]:
    path = data / TOKENS_FILE
    try:
        tokens = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return []
    except orjson.JSONDecodeError as exc:
        raise TokensDamagedError(f"{path} is damaged (not JSON: {exc}); {_MENDING}") from None
    if not isinstance(tokens, list) or not all(_is_token(t) for t in tokens):
        raise TokensDamagedError(
            f"{path} is damaged (not a list of tokens as `ui token create` writes them); "
            + _MENDING
        )
    return tokens


_MENDING = (
    "mend it or move it away (which revokes every token in it), then `spoolmq ui token create`"
)


def _is_token(entry: Any) -> bool:
    return (
        isinstance(entry, dict)
        and all(
            isinstance(entry.get(name), kind) and not isinstance(entry.get(name), bool)
            for name, kind in _TOKEN_FIELDS.items()
        )
        and _SHA256_HEX.fullmatch(entry["sha256"]) is not None  # as _token_hash writes it
    )


def _save_tokens(data: Path, tokens: list[dict[str, Any]]) -> None:
    check_data_dir(data)  # 0700, or refused if others can write it (as the store does)
    write_durably([(data / TOKENS_FILE, orjson.dumps(tokens))])


def create_token(data: Path, name: str) -> tuple[TokenInfo, str]:
    """A new API token: its stored description and the token itself (shown once)."""
    if not name or len(name) > 64 or not name.isprintable():
        raise InvalidArgumentError("a token name is 1-64 printable characters")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    info = TokenInfo(secrets.token_hex(4), name, int(time.time() * 1000))
    tokens = _load_tokens(data)
    tokens.append(
        {"id": info.id, "name": name, "created_ms": info.created_ms, "sha256": _token_hash(token)}
    )
    _save_tokens(data, tokens)
    return info, token


def list_tokens(data: Path) -> list[TokenInfo]:
    return [TokenInfo(t["id"], t["name"], t["created_ms"]) for t in _load_tokens(data)]


def revoke_token(data: Path, token_id: str) -> None:
    tokens = _load_tokens(data)
    kept = [t for t in tokens if t["id"] != token_id]
    if len(kept) == len(tokens):
        raise InvalidArgumentError(f"no API token with id {token_id!r} (see `ui token list`)")
    _save_tokens(data, kept)


def check_token(data: Path, token: str) -> bool:
    """Whether ``token`` is a live API token. The file is read on each request so that a
    revoke takes effect at once, without restarting the console; a damaged file is a
    :class:`TokensDamagedError`."""
    digest = _token_hash(token)
    return any(hmac.compare_digest(digest, t["sha256"]) for t in _load_tokens(data))


# -- browser sessions -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    csrf: str
    expires: float


class Sessions:
    """Logged-in browsers: a random session id in an HttpOnly cookie, and a CSRF token the
    page sends back in a header on every POST (a cross-site form cannot read it)."""

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def create(self) -> Session:
        session = Session(
            secrets.token_urlsafe(32), secrets.token_urlsafe(32), time.monotonic() + SESSION_SECONDS
        )
        with self._lock:
            self._sessions[session.id] = session
        return session

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        with self._lock:
            session = self._sessions.get(session_id)
            if session is not None and session.expires < time.monotonic():
                del self._sessions[session_id]
                return None
        return session

    def drop(self, session_id: str | None) -> None:
        with self._lock:
            self._sessions.pop(session_id or "", None)


def same_secret(sent: str, expected: str) -> bool:
    """Whether ``sent`` is ``expected``, in constant time. Compared as UTF-8 bytes:
    ``compare_digest`` raises TypeError on text with a non-ASCII character, which anyone
    can send."""
    return hmac.compare_digest(_utf8(sent), _utf8(expected))


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")  # a lone surrogate too: no error to raise


def require_csrf(session: Session, sent: str | None) -> None:
    if not sent or not same_secret(sent, session.csrf):
        raise AuthenticationError("missing or wrong CSRF token")
