"""``spoolmq broker``: run a broker (the BrokerManager and its children) in the foreground."""

from __future__ import annotations

import argparse
import logging

from spoolmq.commands.common import CommandFactory, data_dir, positive, require_extra


def cmd_broker(args: argparse.Namespace) -> int:
    from spoolmq.broker import BrokerManager, BrokerSettings
    from spoolmq.broker.metrics import check_loopback
    from spoolmq.client.connection import parse_address
    from spoolmq.errors import InvalidArgumentError

    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s manager[%(process)d] %(levelname)s %(name)s: %(message)s",
    )
    listen = parse_address(args.listen) if args.listen else None
    metrics = check_loopback(parse_address(args.metrics)) if args.metrics else None
    kafka = parse_address(args.kafka) if args.kafka else None
    if kafka is None and (args.kafka_tls or args.kafka_max_connections is not None):
        option = "--kafka-tls" if args.kafka_tls else "--kafka-max-connections"
        raise InvalidArgumentError(f"{option} is a setting of the Kafka listener: give --kafka too")
    if kafka is not None:
        # Without its codecs the listener would refuse lz4 and snappy batches, one by one.
        require_extra("kafka", "spoolmq broker --kafka", modules=["cramjam"])
    manager = BrokerManager(
        BrokerSettings(
            data_dir=data_dir(args),
            listen=listen,
            log_level=args.log_level,
            metrics=metrics,
            store={"auto_create_topics": args.auto_create_topics == "on"},
            kafka=kafka,
            kafka_tls=tuple(args.kafka_tls) if args.kafka_tls else None,
            kafka_max_connections=args.kafka_max_connections,
        )
    )
    return manager.run()


def register(command: CommandFactory) -> None:
    p = command("broker", cmd_broker, "run a broker in the foreground")
    p.add_argument("--listen", metavar="HOST:PORT", help="also accept TCP clients here")
    p.add_argument(
        "--metrics",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (loopback only, e.g. "
        "127.0.0.1:9464)",
    )
    p.add_argument(
        "--auto-create-topics",
        choices=["on", "off"],
        default="on",
        help="on (default, as in Kafka): publishing to or consuming from a missing topic "
        "creates it; off: refused with an error",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="what the broker logs to stderr (default: info)",
    )
    p.add_argument(
        "--kafka",
        metavar="HOST:PORT",
        help="also speak the Kafka protocol here (e.g. 127.0.0.1:9092; docs/KAFKA.md); "
        "an address other than loopback requires SASL/SCRAM",
    )
    p.add_argument(
        "--kafka-tls",
        nargs=2,
        metavar=("CERT", "KEY"),
        help="serve the Kafka listener over TLS with this certificate chain and key (PEM)",
    )
    p.add_argument(
        "--kafka-max-connections",
        type=positive,
        metavar="N",
        help="Kafka connections served at once; one more is closed at its accept "
        "(default 1000; the open-file limit is raised to fit)",
    )
