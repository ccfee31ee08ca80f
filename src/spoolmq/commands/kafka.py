"""``spoolmq export --kafka HOST:PORT TOPIC``: copy a topic's history to a Kafka cluster.

The records come straight from the store (as ``spoolmq read`` reads them: no broker, no
group state), so a topic can be moved after its broker is stopped. They go out through a
real Kafka client (librdkafka, via confluent-kafka) with ``enable.idempotence=true`` and
``acks=all``: librdkafka retries what the cluster did not confirm, and the cluster stores
each retried batch once, so an export is never told a record is stored when it is not
and never duplicates one because of a retry. Rerunning an export after a failure does
copy again what the first run delivered: ``--from-offset`` starts past it.

Each record keeps its key, value and header bytes (turned back into Kafka bytes by
:func:`spoolmq.kafka.core.fields_to_kafka`, the conversion the Kafka front's Fetch uses)
and its stored timestamp, given as the record's CreateTime (a cluster whose topic uses
``LogAppendTime``, as a spoolmq broker does, stamps its own). A record goes to the same
partition number when the target topic has that partition, which keeps per-key order; a
target with fewer partitions gets the record without a partition, so its partitioner
hashes the key there instead.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import Any

from spoolmq.commands.common import (
    CommandFactory,
    data_dir,
    natural,
    require_extra,
    seconds_positive,
)
from spoolmq.errors import BrokerUnavailableError, InvalidArgumentError, PublishTimeoutError

# Records read from a partition per store call: few calls, bounded memory.
_READ_BATCH = 500
_KAFKA_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
# How long the end of an export waits for the last deliveries, past the connect timeout:
# librdkafka's own message timeout (below) ends each one before this.
_FLUSH_EXTRA_S = 30.0


def _check_address(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InvalidArgumentError(f"--kafka takes HOST:PORT, not {text!r}")
    return text


def _target_partitions(producer: Any, topic: str, timeout: float) -> int:
    """How many partitions ``topic`` has on the target (0: it does not exist yet), asking
    for the cluster's metadata; no answer within ``timeout`` means it is unreachable."""
    from confluent_kafka import KafkaException

    try:
        metadata = producer.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise BrokerUnavailableError(
            f"no answer from the Kafka cluster within {timeout:g} s: {exc.args[0]}"
        ) from None
    found = metadata.topics.get(topic)
    if found is None or found.error is not None:
        return 0
    return len(found.partitions)


def export(
    data: Any,
    topic: str,
    address: str,
    *,
    to: str | None = None,
    partitions: Sequence[int] | None = None,
    from_offset: int = 0,
    timeout: float = 30.0,
) -> int:
    """Produce every record of ``topic`` (those of ``partitions``, from ``from_offset`` on)
    to the Kafka cluster at ``address`` as topic ``to``; the number delivered. Raises
    :class:`BrokerUnavailableError` when the cluster does not answer within ``timeout``
    and :class:`PublishTimeoutError` naming how many failed when any delivery did."""
    from confluent_kafka import Producer

    from spoolmq.kafka.core import fields_to_kafka
    from spoolmq.store import Store

    if to is not None:
        check_kafka_topic(to)
    target = to or topic
    with Store(data) as store:
        config = store.topic_config(topic)  # an unknown topic is an error before connecting
        chosen = list(partitions) if partitions else list(range(config.partitions))
        for partition in chosen:
            store.partition_log(topic, partition)  # an unknown partition, likewise
        producer = Producer(
            {
                "bootstrap.servers": address,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": int(timeout * 1000),
                # No logging to stderr by librdkafka: the failures are counted below.
                "log_level": 0,
            }
        )
        target_count = _target_partitions(producer, target, timeout)
        failures: list[str] = []
        delivered = 0

        def on_delivery(err: Any, _msg: Any) -> None:
            nonlocal delivered
            if err is None:
                delivered += 1
            else:
                failures.append(str(err))

        refused: str | None = None
        for partition in chosen:
            log = store.partition_log(topic, partition)
            start = max(from_offset, log.log_start_offset())
            reader = store.reader(topic, partition, offset=start)
            try:
                while refused is None and (entries := reader.read_entries(_READ_BATCH)):
                    for fields, _line in entries:
                        key, value, headers = fields_to_kafka(fields)
                        extra: dict[str, Any] = {}
                        if partition < target_count:
                            extra["partition"] = partition
                        refused = _produce(
                            producer,
                            target,
                            key=key,
                            value=value,
                            headers=headers,
                            timestamp=int(fields["timestamp"]),
                            on_delivery=on_delivery,
                            **extra,
                        )
                        if refused is not None:
                            break
            finally:
                reader.close()
            if refused is not None:
                break
        left = producer.flush(timeout + _FLUSH_EXTRA_S)
    if refused is not None:
        raise PublishTimeoutError(
            f"the export to {target} at {address} stopped: the cluster refused it ({refused}); "
            f"{delivered} records were delivered before, {len(failures) + left} failed"
        )
    if failures or left:
        first = failures[0] if failures else "no answer"
        raise PublishTimeoutError(
            f"{len(failures) + left} of {delivered + len(failures) + left} records were not "
            f"delivered to {target} at {address} (first error: {first}); "
            f"{delivered} were delivered"
        )
    return delivered


def check_kafka_topic(name: str) -> None:
    """A name Kafka takes for a topic (1-249 of ``[A-Za-z0-9._-]``, not "." or ".."):
    ``--to ""`` used to export a topic into itself."""
    if name in (".", "..") or not _KAFKA_TOPIC.fullmatch(name):
        raise InvalidArgumentError(
            f"--to {name!r} is not a Kafka topic name (1-249 of letters, digits, '.', '_', '-')"
        )


def _produce(producer: Any, topic: str, **record: Any) -> str | None:
    """Queue one record, waiting for room when librdkafka's local queue is full (a large
    topic is read faster than the cluster takes it); the error that refused it, if the
    producer would take no record for ``topic`` (librdkafka raises once it has learnt
    the cluster refuses the topic: no later record could go either)."""
    from confluent_kafka import KafkaException

    while True:
        try:
            producer.produce(topic, **record)
            return None
        except BufferError:
            producer.poll(0.1)
        except KafkaException as exc:
            return str(exc.args[0].str() if exc.args else exc)


def cmd_export(args: argparse.Namespace) -> int:
    address = _check_address(args.kafka)
    require_extra("kafka", "spoolmq export", modules=["confluent_kafka"])
    count = export(
        data_dir(args, must_exist=True),
        args.topic,
        address,
        to=args.to,
        partitions=args.partition,
        from_offset=args.from_offset,
        timeout=args.timeout,
    )
    sys.stdout.write(f"exported {count} records of {args.topic} to {args.to or args.topic}\n")
    return 0


def register(command: CommandFactory) -> None:
    p = command("export", cmd_export, "copy a topic's records to a Kafka cluster")
    p.add_argument("topic", help="the topic to export (read from the store; no broker needed)")
    p.add_argument(
        "--kafka",
        metavar="HOST:PORT",
        required=True,
        help="the Kafka cluster's bootstrap server to produce to",
    )
    p.add_argument("--to", metavar="NAME", help="the target topic (default: the same name)")
    p.add_argument(
        "--partition",
        type=natural,
        action="append",
        metavar="P",
        help="export this partition (repeat for several; default: all)",
    )
    p.add_argument(
        "--from-offset",
        type=natural,
        default=0,
        metavar="N",
        help="start each partition at offset N (default: its first record)",
    )
    p.add_argument(
        "--timeout",
        type=seconds_positive,
        default=30.0,
        metavar="S",
        help="seconds to wait for the cluster to answer, and for each delivery (default 30)",
    )
