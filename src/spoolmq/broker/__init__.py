"""The running queue: a BrokerManager process that spawns and supervises a PublisherBroker
and a ConsumerBroker, which talk through multiprocessing Queues and Pipes."""

from spoolmq.broker.manager import BrokerManager, BrokerSettings

__all__ = ["BrokerManager", "BrokerSettings"]
