"""Metadata (3, v0-v6), CreateTopics (19, v0-v3), DeleteTopics (20, v0-v2) and
DescribeConfigs (32, v0-v2): the topics of the store, seen as a one-node Kafka cluster.

Node 0 (this listener's host and port) leads every partition, is its only replica
and the controller. Metadata creates a topic it is asked about that does not exist
when the store's ``auto_create_topics`` is on and the request allows it (v4+'s
``allow_auto_topic_creation``; earlier versions always ask), as Kafka's
``auto.create.topics.enable=true`` default does, with the store's default
partition count.

Topic settings map onto Kafka config names (``retention.ms``, ``retention.bytes``,
``cleanup.policy``, ``segment.bytes``, ``segment.ms``, ``delete.retention.ms``);
``max.message.bytes`` is the store's, and ``message.timestamp.type`` is
``LogAppendTime`` (see kafka/produce.py). Deleting a topic needs the broker
stopped (``spoolmq topics delete`` refuses otherwise), so DeleteTopics answers
TOPIC_DELETION_DISABLED, as a Kafka broker with ``delete.topic.enable=false``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from spoolmq.config import TopicConfig
from spoolmq.errors import SpoolError
from spoolmq.kafka.api import ApiHandler, ApiKey, ErrorCode, RequestContext
from spoolmq.kafka.core import KafkaCore, core_of, error_code_of
from spoolmq.kafka.wire import Reader, Writer
from spoolmq.store.names import check_topic

CLUSTER_ID = "spoolmq"
_TOPIC_RESOURCE = 2
_BROKER_RESOURCE = 4
_SOURCE_TOPIC = 1  # DYNAMIC_TOPIC_CONFIG
_SOURCE_DEFAULT = 5  # DEFAULT_CONFIG

# Kafka config name -> TopicConfig field (the settings a spoolmq topic has).
TOPIC_CONFIGS = {
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "cleanup.policy": "cleanup_policy",
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "delete.retention.ms": "tombstone_retention_ms",
}


def _topic_metadata(
    core: KafkaCore, w: Writer, version: int, name: str, config: TopicConfig | None, error: int
) -> None:
    w.int16(error).string(name)
    if version >= 1:
        w.boolean(False)  # is_internal
    partitions = config.partitions if config is not None and error == ErrorCode.NONE else 0
    w.int32(partitions)
    for index in range(partitions):
        w.int16(ErrorCode.NONE).int32(index).int32(0)  # error, partition, leader
        w.int32(1).int32(0)  # replicas: [0]
        w.int32(1).int32(0)  # isr: [0]
        if version >= 5:
            w.int32(0)  # offline_replicas: []


async def handle_metadata(ctx: RequestContext, version: int, r: Reader) -> bytes:
    core = core_of(ctx)
    names = r.nullable_array(Reader.string, min_size=2)
    allow_create = r.boolean() if version >= 4 else True
    if version == 0 and names == []:
        names = None  # v0: an empty list means every topic
    store = core.store
    entries: list[tuple[str, TopicConfig | None, int]] = []
    if names is None:
        topics = await asyncio.to_thread(store.topics)
        entries = [(n, c, ErrorCode.NONE) for n, c in sorted(topics.items())]
    else:
        for name in names:
            entries.append(await _lookup(core, name, allow_create))
    w = Writer()
    if version >= 3:
        w.int32(0)  # throttle_time_ms
    w.int32(1).int32(ctx.node_id).string(ctx.host).int32(ctx.port)
    if version >= 1:
        w.nullable_string(None)  # rack
    if version >= 2:
        w.nullable_string(CLUSTER_ID)
    if version >= 1:
        w.int32(ctx.node_id)  # controller
    w.int32(len(entries))
    for name, config, error in entries:
        _topic_metadata(core, w, version, name, config, error)
    return w.getvalue()


async def _lookup(
    core: KafkaCore, name: str, allow_create: bool
) -> tuple[str, TopicConfig | None, int]:
    store = core.store
    try:
        check_topic(name)
        create = allow_create and store.config.auto_create_topics
        config = await asyncio.to_thread(store.topic_config, name, create=create)
    except SpoolError as exc:
        return name, None, error_code_of(exc)
    return name, config, ErrorCode.NONE


# -- CreateTopics / DeleteTopics --------------------------------------------------------


def _create_settings(configs: list[tuple[str, str | None]]) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    for name, value in configs:
        field = TOPIC_CONFIGS.get(name)
        if field is None or value is None:
            raise _ConfigRefused(f"config {name!r} is not a spoolmq topic setting")
        settings[field] = value if field == "cleanup_policy" else int(value)
    return settings


class _ConfigRefused(Exception):
    pass


async def handle_create_topics(ctx: RequestContext, version: int, r: Reader) -> bytes:
    core = core_of(ctx)
    requests = []
    for _ in range(r.array_count(min_size=14)):
        name = r.string()
        partitions = r.int32()
        replication = r.int16()
        assignments = r.array_count(min_size=8)
        for _ in range(assignments):
            r.int32()
            r.array(Reader.int32, min_size=4)
        configs = r.array(lambda r: (r.string(), r.nullable_string()), min_size=4)
        requests.append((name, partitions, replication, assignments, configs))
    r.int32()  # timeout_ms
    validate_only = r.boolean() if version >= 1 else False
    w = Writer()
    if version >= 2:
        w.int32(0)
    w.int32(len(requests))
    for name, partitions, replication, assignments, configs in requests:
        error, message = await _create(
            core, name, partitions, replication, assignments, configs, validate_only
        )
        w.string(name).int16(error)
        if version >= 1:
            w.nullable_string(message)
    return w.getvalue()


async def _create(
    core: KafkaCore,
    name: str,
    partitions: int,
    replication: int,
    assignments: int,
    configs: list[tuple[str, str | None]],
    validate_only: bool,
) -> tuple[int, str | None]:
    store = core.store
    if replication not in (-1, 1):
        return ErrorCode.INVALID_REPLICATION_FACTOR, "a spoolmq broker is one node: use 1"
    if assignments:
        return ErrorCode.INVALID_REPLICA_ASSIGNMENT, "replica assignments are not supported"
    if partitions == -1:
        partitions = store.config.default_topic.partitions
    try:
        settings = _create_settings(configs)
        check_topic(name)
        if name in await asyncio.to_thread(store.topics):
            return ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists"
        TopicConfig.from_mapping({"partitions": partitions, **settings})
        if not validate_only:
            await asyncio.to_thread(
                store.create_topic, name, partitions=partitions, exist_ok=False, **settings
            )
    except (_ConfigRefused, ValueError) as exc:
        if isinstance(exc, SpoolError) and exc.code != "config":
            return error_code_of(exc), str(exc)
        if "partitions" in str(exc):
            return ErrorCode.INVALID_PARTITIONS, str(exc)
        return ErrorCode.INVALID_CONFIG, str(exc)
    except SpoolError as exc:
        return error_code_of(exc), str(exc)
    return ErrorCode.NONE, None


async def handle_delete_topics(ctx: RequestContext, version: int, r: Reader) -> bytes:
    names = r.array(Reader.string, min_size=2)
    r.int32()  # timeout_ms
    w = Writer()
    if version >= 1:
        w.int32(0)
    w.int32(len(names))
    for name in names:
        w.string(name).int16(ErrorCode.TOPIC_DELETION_DISABLED)
    return w.getvalue()


# -- DescribeConfigs -----------------------------------------------------------------------


def topic_configs(core: KafkaCore, config: TopicConfig) -> list[tuple[str, str, bool]]:
    """(name, value, is_default) of a topic's Kafka-visible configs."""
    default = core.store.config.default_topic
    rows = []
    for kafka_name, field in TOPIC_CONFIGS.items():
        value = getattr(config, field)
        rows.append((kafka_name, str(value), value == getattr(default, field)))
    rows.append(("max.message.bytes", str(core.store.config.max_message_bytes), True))
    rows.append(("message.timestamp.type", "LogAppendTime", True))
    return rows


async def handle_describe_configs(ctx: RequestContext, version: int, r: Reader) -> bytes:
    core = core_of(ctx)
    resources = []
    for _ in range(r.array_count(min_size=7)):
        kind = r.int8()
        name = r.string()
        wanted = r.nullable_array(Reader.string, min_size=2)
        resources.append((kind, name, wanted))
    if version >= 1:
        r.boolean()  # include_synonyms: we have none
    w = Writer().int32(0).int32(len(resources))
    for kind, name, wanted in resources:
        rows: list[tuple[str, str, bool]] = []
        error, message = int(ErrorCode.NONE), None
        if kind == _TOPIC_RESOURCE:
            try:
                config = await asyncio.to_thread(core.store.current_topic_config, name)
                rows = topic_configs(core, config)
            except SpoolError as exc:
                error, message = error_code_of(exc), str(exc)
        elif kind != _BROKER_RESOURCE:
            error, message = int(ErrorCode.INVALID_REQUEST), "only topic and broker configs"
        if wanted is not None:
            rows = [row for row in rows if row[0] in wanted]
        w.int16(error).nullable_string(message).int8(kind).string(name).int32(len(rows))
        for cname, value, is_default in rows:
            w.string(cname).nullable_string(value).boolean(False)  # read_only
            if version == 0:
                w.boolean(is_default)
            else:
                w.int8(_SOURCE_DEFAULT if is_default else _SOURCE_TOPIC)
            w.boolean(False)  # is_sensitive
            if version >= 1:
                w.int32(0)  # synonyms
    return w.getvalue()


APIS = [
    ApiHandler(ApiKey.METADATA, 0, 6, handle_metadata, name="Metadata"),
    ApiHandler(ApiKey.CREATE_TOPICS, 0, 3, handle_create_topics, name="CreateTopics"),
    ApiHandler(ApiKey.DELETE_TOPICS, 0, 2, handle_delete_topics, name="DeleteTopics"),
    ApiHandler(ApiKey.DESCRIBE_CONFIGS, 0, 2, handle_describe_configs, name="DescribeConfigs"),
]
