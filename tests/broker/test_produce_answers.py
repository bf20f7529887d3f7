"""Produce's checks of what a client may write, as Apache Kafka answers them: transactional
and control batches (runnel has no transactions), one batch per partition from Produce v3,
zstd only from v7, and a partition named twice in one request.

The in-process leader of dispatch_leader.py ("orders" partitions 0 and 1, led here); acks=1
so nothing waits for the follower.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dispatch_leader import DispatchLeader
from support import make_batch

from broker.protocol import ApiKey, ErrorCode
from broker.server import CloseConnection
from storage.batch import CompressionType
from storage.records import RecordInput, build_batch


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[DispatchLeader]:
    made = DispatchLeader(tmp_path / "data", partitions=2)
    yield made
    made.logs.shutdown()


def body(partitions: list[tuple[int, bytes]], *, acks: int = 1) -> dict[str, Any]:
    data = [{"index": i, "records": r} for i, r in partitions]
    return {
        "transactional_id": None,
        "acks": acks,
        "timeout_ms": 1000,
        "topic_data": [{"name": "orders", "partition_data": data}],
    }


def answers(leader: DispatchLeader, version: int, request: dict[str, Any]) -> list[Any]:
    (topic,) = leader.send(ApiKey.PRODUCE, version, request).responses
    return [(p.index, p.error_code, p.base_offset) for p in topic.partition_responses]


def log_ends(leader: DispatchLeader) -> list[int]:
    return [p.log_end_offset for p in sorted(leader.replicas.partitions(), key=lambda p: p.key)]


def transactional(value: bytes) -> bytes:
    return build_batch(
        [RecordInput(None, value, 1)],
        producer_id=7, producer_epoch=0, base_sequence=0, is_transactional=True,
    )  # fmt: skip


def control(*, is_transactional: bool) -> bytes:
    """An end-transaction marker's batch, as a transaction coordinator writes it."""
    return build_batch(
        [RecordInput(b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00", 1)],
        producer_id=7, producer_epoch=0, is_transactional=is_transactional, is_control=True,
    )  # fmt: skip


def test_a_transactional_batch_without_a_transactional_id_fails_the_whole_request(
    leader: DispatchLeader,
) -> None:
    """Kafka (KafkaApis.handleProduceRequest, RequestUtils.hasTransactionalRecords): the
    request is refused before any partition is looked at, the plain batch beside it too."""
    request = body([(0, make_batch([b"plain"])), (1, transactional(b"t"))])
    refused = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert answers(leader, 9, request) == [(0, refused, -1), (1, refused, -1)]
    assert answers(leader, 9, request | {"acks": 7}) == [(0, refused, -1), (1, refused, -1)]
    with pytest.raises(CloseConnection):  # acks=0: the only way to tell the producer
        leader.send(ApiKey.PRODUCE, 9, request | {"acks": 0})
    assert log_ends(leader) == [0, 0]


def test_a_control_batch_from_a_client_is_invalid_record_and_appends_nothing(
    leader: DispatchLeader,
) -> None:
    """Kafka's LogValidator: "Clients are not allowed to write control records". A marker
    batch is transactional too, which fails the whole request first."""
    plain = make_batch([b"fine"])
    request = body([(0, control(is_transactional=False)), (1, plain)])
    assert answers(leader, 9, request) == [(0, ErrorCode.INVALID_RECORD, -1), (1, 0, 0)]
    assert answers(leader, 3, request) == [(0, ErrorCode.CORRUPT_MESSAGE, -1), (1, 0, 1)]
    marker = body([(0, control(is_transactional=True)), (1, plain)])
    refused = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert answers(leader, 9, marker) == [(0, refused, -1), (1, refused, -1)]
    assert log_ends(leader) == [0, 2]


@pytest.mark.parametrize(
    ("version", "expected"),
    [(9, ErrorCode.INVALID_RECORD), (3, ErrorCode.CORRUPT_MESSAGE)],  # legacy code before v8
)
def test_two_batches_for_one_partition_are_refused_from_produce_v3(
    leader: DispatchLeader, version: int, expected: int
) -> None:
    """Kafka's ProduceRequest.validateRecords: "only allowed to contain exactly one record
    batch per partition"; the other partition is appended."""
    two = make_batch([b"a"]) + make_batch([b"b"])
    request = body([(0, two), (1, make_batch([b"c"]))])
    assert answers(leader, version, request) == [(0, expected, -1), (1, 0, 0)]
    # Bytes after the batch that are not a whole batch are the log's to refuse (corrupt).
    cut = make_batch([b"d"]) + make_batch([b"e"])[:40]
    assert answers(leader, 9, body([(0, cut)])) == [(0, ErrorCode.CORRUPT_MESSAGE, -1)]
    assert log_ends(leader) == [0, 1]


def test_zstd_is_unsupported_compression_type_below_produce_v7(leader: DispatchLeader) -> None:
    zstd = make_batch([b"z"], compression=CompressionType.ZSTD)
    gzip = make_batch([b"g"], compression=CompressionType.GZIP)
    unsupported = ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
    assert answers(leader, 6, body([(0, zstd), (1, gzip)])) == [(0, unsupported, -1), (1, 0, 0)]
    assert answers(leader, 7, body([(0, zstd)])) == [(0, ErrorCode.NONE, 0)]
    assert log_ends(leader) == [1, 1]


def test_a_partition_named_twice_appends_its_last_records_and_is_answered_once(
    leader: DispatchLeader,
) -> None:
    """Kafka keys a produce request's partitions by TopicPartition in a map: the last
    records named for a partition replace the earlier ones."""
    request = body(
        [(0, make_batch([b"first"])), (1, make_batch([b"x"])), (0, make_batch([b"a", b"b"]))]
    )
    assert answers(leader, 9, request) == [(0, ErrorCode.NONE, 0), (1, ErrorCode.NONE, 0)]
    assert log_ends(leader) == [2, 1]
    again = dict(request)  # the topic named twice: the same rule across its entries
    again["topic_data"] = [
        {"name": "orders", "partition_data": [{"index": 0, "records": make_batch([b"c"])}]},
        {"name": "orders", "partition_data": [{"index": 0, "records": make_batch([b"d"])}]},
    ]
    (topic,) = leader.send(ApiKey.PRODUCE, 9, again).responses
    assert [(p.index, p.base_offset) for p in topic.partition_responses] == [(0, 2)]
    assert log_ends(leader) == [3, 1]
