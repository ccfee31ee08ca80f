"""The Kafka child: a broker process of its own, started and supervised by the BrokerManager.

It shares the manager's plumbing with the other two children (``BrokerChild``:
control pipe, parent watch, status pipe, ``Ready``/``Stats``), but its loop is
asyncio: the Kafka listener (kafka/server.py), the link to the PublisherBroker
(kafka/link.py) and the growth watcher (kafka/watch.py) all run on one event
loop, and the manager's pipes are watched with ``add_reader``. A crash or a kill
of this child costs its Kafka connections only; the manager restarts it like the
others, and the PublisherBroker and ConsumerBroker never wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spoolmq.broker.child import BrokerChild, ChildChannels, child_setup, settle_gc
from spoolmq.broker.status import Ready, Stats
from spoolmq.kafka.core import KafkaCore
from spoolmq.kafka.link import PublisherLink
from spoolmq.kafka.server import DEFAULT_MAX_CONNECTIONS, KafkaServer, is_loopback_host
from spoolmq.kafka.watch import GrowthWatcher

# File descriptors the child keeps for itself besides its connections: the store's files,
# the link to the PublisherBroker, the manager's pipes, the growth watcher.
_OWN_DESCRIPTORS = 256


@dataclass(frozen=True)
class KafkaSettings:
    """How the Kafka child listens (picklable: it crosses the ``spawn`` boundary)."""

    host: str
    port: int
    tls_cert: str | None = None
    tls_key: str | None = None
    # None: required exactly when ``host`` is not a loopback address.
    auth_required: bool | None = None
    # Connections served at once; one more is closed at its accept (--kafka-max-connections).
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    # The manager's key for this child's link to the PublisherBroker (kafka/link.py); empty:
    # the link sends plain publish frames. Kept out of repr (and so out of any log).
    link_key: str = field(default="", repr=False)

    def ssl_context(self) -> ssl.SSLContext | None:
        if self.tls_cert is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.tls_cert, self.tls_key)
        return context

    def requires_auth(self) -> bool:
        if self.auth_required is not None:
            return self.auth_required
        return not is_loopback_host(self.host)


class KafkaChild(BrokerChild[Any]):
    role = "kafka"

    def __init__(
        self,
        data_dir: Path,
        channels: ChildChannels,
        *,
        store_settings: dict[str, Any] | None = None,
        kafka: KafkaSettings | None = None,
    ) -> None:
        super().__init__(data_dir, channels, store_settings=store_settings)
        self.data_dir = data_dir
        self.kafka = kafka if kafka is not None else KafkaSettings("127.0.0.1", 9092)
        self.core: KafkaCore | None = None
        self.server: KafkaServer | None = None
        self._stop: asyncio.Event | None = None

    def figures(self) -> dict[str, Any]:
        figures: dict[str, Any] = {"listen": None, "connections": 0}
        if self.server is not None:
            figures["listen"] = [self.kafka.host, self.server.port]
            figures["connections"] = self.server.connection_count
            figures["max_connections"] = self.server.max_connections
            figures["connections_refused"] = self.server.refused_connections
            figures["auth_timeouts"] = self.server.auth_timeouts
            figures["held_bytes"] = self.server.memory.held
            figures["frames_waiting_for_room"] = self.server.memory.waiting
        if self.core is not None:
            figures.update(self.core.figures)
        return figures

    def run(self) -> None:
        try:
            asyncio.run(self._main())
        finally:
            self.close()

    async def _main(self) -> None:
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        watcher = GrowthWatcher()
        watcher.start()
        link = PublisherLink(self.data_dir, link_key=self.kafka.link_key)
        self.core = KafkaCore(self.store, link, watcher)
        self.server = KafkaServer(
            self.data_dir,
            self.kafka.host,
            self.kafka.port,
            auth_required=self.kafka.requires_auth(),
            ssl_context=self.kafka.ssl_context(),
            max_connections=descriptors_for(self.kafka.max_connections, self.logger),
            shared={"core": self.core},
        )
        await self.server.start()
        self.logger.info(
            "kafka listener on %s:%d%s",
            self.kafka.host,
            self.server.port,
            " (SASL required)" if self.server.auth_required else "",
        )
        loop.add_reader(self.control.fileno(), self._on_control)
        loop.add_reader(self.parent_watch.fileno(), self._on_parent_gone)
        settle_gc()
        self._report(Ready(os.getpid()))
        self._report(Stats(self.figures()))
        try:
            while not self.stopping:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), 1.0)
                self._report(Stats(self.figures()))
        finally:
            loop.remove_reader(self.control.fileno())
            loop.remove_reader(self.parent_watch.fileno())
            await self.server.close()
            link.close()
            watcher.close()

    def _on_control(self) -> None:
        self._handle_control()
        if self.stopping and self._stop is not None:
            self._stop.set()

    def _on_parent_gone(self) -> None:
        self.logger.error("the manager is gone; stopping")
        self.stopping = True
        if self._stop is not None:
            self._stop.set()


def descriptors_for(connections: int, logger: logging.Logger) -> int:
    """Raise this process's open-file limit (the soft one, up to the hard one) to fit
    ``connections`` and the child's own descriptors; the connections that fit if the
    hard limit is lower (logged), so that the listener refuses the one past it cleanly
    instead of failing to accept it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = connections + _OWN_DESCRIPTORS
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
    if soft == resource.RLIM_INFINITY or soft >= connections + _OWN_DESCRIPTORS:
        return connections
    fitting = max(1, soft - _OWN_DESCRIPTORS)
    logger.warning(
        "serving %d Kafka connections at most, not %d: the open-file limit is %d "
        "(raise it with ulimit -n)",
        fitting,
        connections,
        soft,
    )
    return fitting


def run_kafka_child(
    data_dir: str,
    channels: ChildChannels,
    log_level: str,
    store_settings: dict[str, Any],
    kafka: KafkaSettings,
) -> None:
    """Entry point of the Kafka child process (spawned by the manager)."""
    child_setup(KafkaChild.role, log_level)
    KafkaChild(Path(data_dir), channels, store_settings=store_settings, kafka=kafka).run()
