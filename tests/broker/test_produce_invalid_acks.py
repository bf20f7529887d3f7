"""A Produce with acks other than -1, 0 and 1 is answered as Apache Kafka answers it: its
KafkaApis.handleProduceRequest answers each partition the metadata does not have
UNKNOWN_TOPIC_OR_PARTITION and each whose records the request may not carry their error
(ProduceRequest.validateRecords), and hands the rest to ReplicaManager.appendRecords, which
answers them all INVALID_REQUIRED_ACKS before looking any further (led here or not). Nothing
is appended. In process, through the real dispatcher and codec (test_dispatcher_answers.py's
harness: this broker, 1, leads "orders"; broker 2 leads "theirs")."""

from __future__ import annotations

from typing import Any

from support import make_batch
from test_dispatcher import ME, TOPIC_ID, Harness
from test_dispatcher_answers import PEER, broker, replayed, set_image
from test_dispatcher_answers import cluster as cluster_view

from broker.protocol import ApiKey, ErrorCode
from controller import records as rec

__all__ = ["broker", "cluster_view"]  # the fixtures

THEIRS = bytes(range(16, 32))


def with_theirs(harness: Harness) -> None:
    """Partition 1 of "orders" is added (led here) and "theirs", led by broker 2."""
    records = [
        rec.partition(TOPIC_ID, 1, [ME], [ME], leader=ME),
        rec.topic("theirs", THEIRS),
        rec.partition(THEIRS, 0, [PEER], [PEER], leader=PEER),
    ]
    set_image(harness, replayed(harness.image, records))


def log_ends(harness: Harness) -> list[int]:
    replicas = harness.dispatcher.context.replicas
    return [replicas.get("orders", p).log_end_offset for p in (0, 1)]  # type: ignore[union-attr]


def produce(harness: Harness, acks: int, topics: dict[str, dict[int, bytes]]) -> dict[Any, int]:
    data = [
        {"name": name, "partition_data": [{"index": i, "records": r} for i, r in parts.items()]}
        for name, parts in topics.items()
    ]
    body = {"transactional_id": None, "acks": acks, "timeout_ms": 1000, "topic_data": data}
    answer = harness.ask(ApiKey.PRODUCE, 9, body)
    return {
        (t.name, p.index): p.error_code for t in answer.responses for p in t.partition_responses
    }


def test_invalid_acks_answers_unknown_and_invalid_partitions_first_and_appends_nothing(
    cluster_view: Harness,
) -> None:
    with_theirs(cluster_view)
    good = make_batch([b"a"])
    two_batches = make_batch([b"b"]) + make_batch([b"c"])  # Produce v3+: exactly one
    request = {
        "orders": {0: good, 1: two_batches, 7: good},
        "theirs": {0: good},
        "nowhere": {0: good},
    }
    assert produce(cluster_view, 2, request) == {
        ("orders", 0): ErrorCode.INVALID_REQUIRED_ACKS,
        ("orders", 1): ErrorCode.INVALID_RECORD,
        ("orders", 7): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ("theirs", 0): ErrorCode.INVALID_REQUIRED_ACKS,  # not led here: acks come first
        ("nowhere", 0): ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    }
    assert log_ends(cluster_view) == [0, 0]
    # With valid acks the same request appends to "orders" 0 alone.
    answers = produce(cluster_view, 1, request)
    assert answers[("orders", 0)] == ErrorCode.NONE
    assert answers[("theirs", 0)] == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert log_ends(cluster_view) == [1, 0]
