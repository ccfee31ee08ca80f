"""The Kafka front: a broker child that speaks the Kafka wire protocol over spoolmq's store.

Kafka clients (kafka-python, confluent-kafka, aiokafka, kcat) talk to this child;
it publishes through the PublisherBroker's group commit like any native client and
reads the store for Fetch. See docs/KAFKA.md for the advertised API versions.
"""
