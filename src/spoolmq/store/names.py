"""Topic-name validation and the paths built from names (checked before any path exists)."""

from __future__ import annotations

import re
from pathlib import Path

from spoolmq.errors import InvalidTopicError
from spoolmq.types import TopicPartition

TOPIC_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
DLQ_SUFFIX = ".dlq"


# Names already found valid: the broker checks the topic of every message it receives, and
# a regex match per message was a measurable part of its cost. Bounded, so a client sending
# many distinct names cannot grow it without limit.
_VALID: set[str] = set()
_VALID_MAX = 10_000


# The longest name: Kafka's topic name limit (a DLQ of a DLQ of ... a 128-character name).
MAX_TOPIC_NAME = 249


def _valid(name: str) -> bool:
    """A name of 1-128 characters that TOPIC_PATTERN allows, or the DLQ (``NAME.dlq``) of
    a valid name, up to MAX_TOPIC_NAME: dead letters must go somewhere, also those of a
    128-character topic or of a DLQ (a refused name held its group's committed offset)."""
    if TOPIC_PATTERN.fullmatch(name) is not None:
        return True
    while name.endswith(DLQ_SUFFIX) and len(name) <= MAX_TOPIC_NAME:
        name = name[: -len(DLQ_SUFFIX)]
        if TOPIC_PATTERN.fullmatch(name) is not None:
            return True
    return False


def check_topic(name: object) -> str:
    """Return ``name`` if it is a valid topic name, else raise InvalidTopicError."""
    if type(name) is str and name in _VALID:
        return name
    if not isinstance(name, str) or not _valid(name):
        shown = repr(name)
        if len(shown) > 60:
            shown = shown[:57] + "..."
        raise InvalidTopicError(
            f"invalid topic name {shown}: use 1-128 characters from A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit (and .dlq added for a dead-letter topic)"
        )
    if type(name) is str and len(_VALID) < _VALID_MAX:
        _VALID.add(name)
    return name


def dlq_topic(topic: str) -> str:
    """The dead-letter topic of ``topic`` (``orders`` -> ``orders.dlq``)."""
    return check_topic(topic + DLQ_SUFFIX)


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}.jsonl"


def index_name(base_offset: int) -> str:
    return f"{base_offset:020d}.index"


#: Where a topic's directory goes while it is deleted (``trash/<topic>.<ns>``), outside
#: ``logs/`` so that nothing reading the logs sees it: docs/FORMAT.md.
TRASH_DIR = "trash"


def logs_dir(root: Path) -> Path:
    """Where the segments of every topic are (``<data dir>/logs``)."""
    return root / "logs"


def topic_dir(root: Path, topic: str) -> Path:
    return logs_dir(root) / check_topic(topic)


def partition_dir(root: Path, tp: TopicPartition) -> Path:
    """A partition's segments, indexes and writer lock (``logs/<topic>/<partition>``)."""
    return topic_dir(root, tp.topic) / str(int(tp.partition))


def quarantine_dir(root: Path, tp: TopicPartition) -> Path:
    """Where recovery moves the torn tails cut off a partition's segments."""
    return root / "quarantine" / check_topic(tp.topic) / str(int(tp.partition))
