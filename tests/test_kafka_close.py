"""``runnel.kafka_close.close_consumer``: a consumer's close that does not return
(librdkafka's deadlock, confluentinc/librdkafka#5476, cannot be provoked at will) is left
behind within the timeout, and the consumer stays referenced; a close that returns, or
raises, does so as before. The stuck consumer is a stand-in whose close blocks; a real
confluent-kafka Consumer closes."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import Consumer

from runnel import kafka_close

STUCK_S = 30.0  # how long the stand-in's close blocks at most (it is released sooner)
TIMEOUT_S = 0.3


class StuckConsumer:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.returned = threading.Event()

    def close(self) -> None:
        self.release.wait(STUCK_S)
        self.returned.set()


class FailingConsumer:
    def close(self) -> None:
        raise RuntimeError("Consumer closed")


def test_a_close_that_does_not_return_is_left_behind() -> None:
    stuck = StuckConsumer()
    try:
        assert kafka_close.close_consumer(stuck, timeout_s=TIMEOUT_S) is False
        assert not stuck.returned.is_set(), "it waited for the close to end"
        assert any(c is stuck for c in kafka_close._left_behind), "the consumer was let go"
    finally:
        stuck.release.set()
        assert stuck.returned.wait(STUCK_S)
        kafka_close._left_behind.remove(stuck)


def test_a_close_that_raises_raises_in_the_caller() -> None:
    with pytest.raises(RuntimeError, match="Consumer closed"):
        kafka_close.close_consumer(FailingConsumer(), timeout_s=TIMEOUT_S)


def test_a_real_consumer_closes() -> None:
    consumer = Consumer(
        {"bootstrap.servers": "127.0.0.1:9", "group.id": "close-test", "logger": None}
    )
    assert kafka_close.close_consumer(consumer) is True
    with pytest.raises(RuntimeError, match="closed"):
        consumer.poll(0)  # closed: confluent-kafka says so
