"""The Kafka-protocol broker of the Kafka tests: the embedded Tansu broker of
examples/kafka_to_spark.py on a free loopback port, with what the tests do to it
(topics, producing, reading back what a ``read_committed`` consumer sees). Import it
after ``pytest.importorskip("confluent_kafka")``: the Kafka client is optional."""

from __future__ import annotations

import socket
import time
import uuid

import pandas as pd
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from examples.kafka_to_spark import embedded_broker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    """The embedded Tansu broker of examples/kafka_to_spark.py on a free loopback port,
    stopped by its own process id."""

    def __init__(self) -> None:
        self._running = embedded_broker()
        self.bootstrap = self._running.__enter__()
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})

    def stop(self) -> None:
        self._running.__exit__(None, None, None)

    def topic(self, partitions: int, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        for future in self.admin.create_topics([NewTopic(name, partitions, 1)]).values():
            future.result()
        return name

    def producer(self, **config) -> Producer:
        return Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5, "log_level": 0,
                         **config})

    def produce(self, topic: str, partition: int, values: list[bytes], keys=None) -> None:
        producer = self.producer()
        for i, value in enumerate(values):
            producer.produce(topic, value, None if keys is None else keys[i], partition=partition)
        assert producer.flush(30) == 0

    def read(self, topic: str, *, committed: bool = True) -> pd.DataFrame:
        """Every record of ``topic`` up to where fetches say each partition ends."""
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "oracle",
                             "enable.auto.commit": False, "enable.partition.eof": True,
                             "isolation.level": "read_committed" if committed
                             else "read_uncommitted", "log_level": 0})
        partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        rows, at_end, deadline = [], set(), time.monotonic() + 60
        while len(at_end) < len(partitions):
            assert time.monotonic() < deadline, f"{topic}: no end of partitions {at_end}"
            for m in consumer.consume(10_000, 0.2):
                if m.error() is not None:
                    assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                    at_end.add(m.partition())
                    continue
                at_end.discard(m.partition())
                rows.append((m.partition(), m.offset(), m.key(), m.value()))
        consumer.close()
        return pd.DataFrame(rows, columns=["partition", "offset", "key", "value"])
