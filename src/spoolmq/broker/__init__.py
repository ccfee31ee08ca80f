"""The running queue: a BrokerManager process that spawns and supervises a PublisherBroker
and a ConsumerBroker (both :class:`~spoolmq.broker.child.BrokerChild`), which talk through
multiprocessing Pipes."""

from spoolmq.broker.manager import BrokerManager, BrokerSettings

__all__ = ["BrokerManager", "BrokerSettings"]
