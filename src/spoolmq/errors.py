"""The one error tree of spoolmq.

Every error a user can meet derives from :class:`SpoolError`. Each class says
whether retrying the same call can succeed (``retriable``), so callers decide
without parsing messages, and carries a stable ``code`` that travels in wire
frames so a client raises the same class the broker raised.
"""

from __future__ import annotations

from typing import ClassVar


class SpoolError(Exception):
    """Base class of every spoolmq error."""

    code: ClassVar[str] = "error"
    retriable: ClassVar[bool] = False


# --- configuration and input -------------------------------------------------


class ConfigError(SpoolError, ValueError):
    """A configuration key is unknown or a setting is out of range."""

    code = "config"


class InvalidTopicError(SpoolError, ValueError):
    """A topic name does not match the allowed pattern."""

    code = "invalid_topic"


class UnknownTopicError(SpoolError, LookupError):
    """The topic does not exist (and was not to be created)."""

    code = "unknown_topic"


class TopicDeletedError(UnknownTopicError):
    """Every topic a consumer read was deleted while it ran (``topics delete`` with the
    broker running): there is nothing left for it to receive."""

    code = "topic_deleted"


class TopicExistsError(SpoolError):
    """A topic of that name already exists with other settings."""

    code = "topic_exists"


class UnknownPartitionError(SpoolError, LookupError):
    """The partition number is outside the topic's partitions."""

    code = "unknown_partition"


class SerializationError(SpoolError, TypeError):
    """A key, value or header cannot be stored as JSON or bytes."""

    code = "serialization"


class MessageTooLargeError(SpoolError, ValueError):
    """An encoded message is over the configured size limit."""

    code = "message_too_large"


class OffsetOutOfRangeError(SpoolError, LookupError):
    """An offset is below the log start offset or past the log end offset."""

    code = "offset_out_of_range"


class InvalidArgumentError(SpoolError, ValueError):
    """Any other argument outside what is allowed."""

    code = "invalid_argument"


# --- stored data ------------------------------------------------------------------


class CorruptRecordError(SpoolError):
    """A stored record failed its checksum or could not be parsed.

    Raised where the corruption is found, never skipped in silence; ``path`` and
    ``position`` say where.
    """

    code = "corrupt_record"

    def __init__(self, message: str, *, path: str = "", position: int = -1) -> None:
        super().__init__(message)
        self.path = path
        self.position = position


class StorageError(SpoolError, OSError):
    """Writing or syncing failed (disk full, I/O error); nothing was acknowledged."""

    code = "storage"
    retriable = True


class SchemaVersionError(SpoolError):
    """``state.db`` was written by a newer spoolmq than this one."""

    code = "schema_version"


# --- broker and clients -------------------------------------------------------------


class BrokerLockedError(SpoolError):
    """Another broker already serves this data directory."""

    code = "broker_locked"

    def __init__(self, message: str, *, pid: int | None = None) -> None:
        super().__init__(message)
        self.pid = pid


class UnsafePermissionsError(SpoolError):
    """The data directory can be written by other users."""

    code = "unsafe_permissions"


class ProtocolError(SpoolError):
    """A frame broke the wire protocol (bad JSON, unknown op, missing field)."""

    code = "protocol"


class KafkaDecodeError(ProtocolError):
    """A Kafka request frame is truncated, oversized or otherwise does not parse.

    Raised by the bounded reader of the Kafka front before any allocation the
    frame asks for; the server closes that one connection and nothing else.
    """

    code = "kafka_decode"


class AuthenticationError(SpoolError):
    """The authkey was wrong or missing."""

    code = "authentication"


class BrokerUnavailableError(SpoolError, ConnectionError):
    """No broker answered at the data directory or address."""

    code = "broker_unavailable"
    retriable = True


class PublishTimeoutError(SpoolError, TimeoutError):
    """A publish was not acknowledged within the delivery timeout."""

    code = "publish_timeout"
    retriable = True


class LeaseExpiredError(SpoolError):
    """An ACK, NACK or lease extension came after the delivery's lease expired."""

    code = "lease_expired"


class UnknownDeliveryError(SpoolError, LookupError):
    """An ACK or NACK names a delivery the broker does not know."""

    code = "unknown_delivery"


class GroupActiveError(SpoolError):
    """The group has live consumers, so its offsets cannot be reset."""

    code = "group_active"


class WorkersFailedError(SpoolError):
    """A worker process of ``run_workers`` could not start or exited with an error."""

    code = "workers_failed"


# --- tasks ---------------------------------------------------------------------


class TaskFailed(SpoolError):
    """A task ended without a value: ``error`` is the remote exception as text
    (``"ValueError: bad address"``), ``traceback`` its traceback text, ``state`` the
    task's final state (``failed`` or ``cancelled``)."""

    code = "task_failed"

    def __init__(
        self, message: str, *, error: str = "", traceback: str = "", state: str = "failed"
    ) -> None:
        super().__init__(message)
        self.error = error or message
        self.traceback = traceback
        self.state = state


class ResultTimeoutError(SpoolError, TimeoutError):
    """A task's result was not there within the time asked for (it may come later)."""

    code = "result_timeout"
    retriable = True


def _all_error_classes() -> dict[str, type[SpoolError]]:
    found: dict[str, type[SpoolError]] = {}
    pending: list[type[SpoolError]] = [SpoolError]
    while pending:
        cls = pending.pop()
        found[cls.code] = cls
        pending.extend(cls.__subclasses__())
    return found


ERRORS_BY_CODE: dict[str, type[SpoolError]] = _all_error_classes()


def error_from_code(code: str, message: str) -> SpoolError:
    """Rebuild the error a broker sent in a frame (unknown codes become SpoolError)."""
    cls = ERRORS_BY_CODE.get(code, SpoolError)
    try:
        return cls(message)
    except TypeError:  # pragma: no cover - every class takes a message first
        return SpoolError(message)
