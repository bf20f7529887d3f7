"""Bad input against a real cluster: corrupt and oversized batches, invalid acks, unsupported
APIs and versions, and frames that cannot be trusted.

The story of each test: a client sends something wrong; the broker answers the Kafka error a
real client expects (or closes that one connection and says why in its log), appends nothing
(the log end offset, read back with ListOffsets, is where it was, and the next good batch
lands exactly there), and goes on serving everyone else. The cluster is real: a controller
and brokers 101 and 102 in their own processes (the ``kafka`` fixture, kafka_cluster.py);
the client is runnel's own codec over a blocking socket, so every byte on the wire is the
test's.
"""

from __future__ import annotations

import os
import re
import struct
import time
from collections.abc import Callable

import pytest
from kafka_cluster import KafkaCluster, kafka
from raw_client import RawClient, SharedCluster, unique_topic
from support import make_batch

from broker.protocol import (
    API_SPECS,
    ApiKey,
    ErrorCode,
    decode_response,
    encode_request,
)
from storage.batch import CompressionType, compute_crc
from storage.errors import CorruptRecordError as StorageCorruptRecordError
from storage.records import decode_batch

__all__ = ["kafka"]  # the fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

DEFAULT_MAX_MESSAGE_BYTES = 1_048_588  # Kafka's default max.message.bytes, runnel's too
SOCKET_REQUEST_MAX_BYTES = 100 * 1024 * 1024  # the listener's default
_CRC_AT, _MAGIC_AT, _LENGTH_AT, _COUNT_AT = 17, 16, 8, 57  # byte positions in a v2 batch


@pytest.fixture
def cluster(kafka: KafkaCluster) -> SharedCluster:
    return SharedCluster.of(kafka)


# -- batches ------------------------------------------------------------------------------------


def _good(tag: str = "v") -> bytes:
    return make_batch([f"{tag}-1".encode(), f"{tag}-2".encode()])


def _with_crc_flipped(batch: bytes) -> bytes:
    out = bytearray(batch)
    out[_CRC_AT + 2] ^= 0x10
    return bytes(out)


def _with_magic_1(batch: bytes) -> bytes:
    out = bytearray(batch)
    out[_MAGIC_AT] = 1
    return bytes(out)


def _with_length(batch: bytes, delta: int) -> bytes:
    """The batch_length field off by ``delta`` from the bytes that follow it."""
    out = bytearray(batch)
    struct.pack_into(">i", out, _LENGTH_AT, len(batch) - 12 + delta)
    return bytes(out)


def _with_record_count(batch: bytes, count: int) -> bytes:
    """A record count that disagrees with the last offset delta, CRC recomputed: the batch
    is intact bytes that break a rule (Kafka: InvalidRecordException)."""
    out = bytearray(batch)
    struct.pack_into(">i", out, _COUNT_AT, count)
    struct.pack_into(">I", out, _CRC_AT, compute_crc(out, 0, len(out)))
    return bytes(out)


# A second whole batch, even a corrupt one, is refused before the log reads it: Produce v3+
# allows one batch per partition (INVALID_RECORD; tests/broker/test_produce_answers.py).
CORRUPTIONS: dict[str, Callable[[bytes], bytes]] = {
    "crc-flipped": _with_crc_flipped,
    "magic-1": _with_magic_1,
    "length-says-10-more": lambda b: _with_length(b, 10),
    "length-says-5-fewer": lambda b: _with_length(b, -5),
    "length-below-header": lambda b: _with_length(b, -(len(b) - 20)),
    "trailing-partial-batch": lambda b: b + b[:30],
    "header-only-half": lambda b: b[:40],
}


def batch_of_size(size: int) -> bytes:
    """One batch of exactly ``size`` bytes (one record)."""
    value_bytes = size - 80
    for _ in range(20):
        batch = make_batch([b"x" * value_bytes])
        if len(batch) == size:
            return batch
        value_bytes += size - len(batch)
    raise AssertionError(f"cannot build a batch of {size} bytes")


# -- helpers ------------------------------------------------------------------------------------


def led_by(cluster: SharedCluster, topic: str, broker: int) -> list[int]:
    return sorted(p for p, (leader, _) in cluster.leaders(topic).items() if leader == broker)


def log_end(client: RawClient, topic: str, partition: int) -> int:
    answer = client.list_offset(topic, partition)
    assert answer.error_code == ErrorCode.NONE, answer
    return int(answer.offset)


def new_topic(
    cluster: SharedCluster, prefix: str, configs: dict[str, str] | None = None
) -> tuple[str, int]:
    """A one-partition topic led by broker 101: (name, partition)."""
    name = unique_topic(prefix)
    with cluster.client() as c:
        c.create_topic(name, 2, 1, configs)
    (partition,) = led_by(cluster, name, 101)
    return name, partition


def peer_of(client: RawClient) -> str:
    host, port = client.sock.getsockname()[:2]
    return f"{host}:{port}"


def advertised(client: RawClient) -> dict[int, tuple[int, int]]:
    answer = client.api_versions()
    assert answer.error_code == ErrorCode.NONE
    return {a.api_key: (a.min_version, a.max_version) for a in answer.api_keys}


def assert_still_serving(client: RawClient) -> None:
    versions = advertised(client)
    assert versions.keys() >= API_SPECS.keys(), versions


# -- corrupt batches ----------------------------------------------------------------------------


@pytest.mark.parametrize("version", [3, 9])
def test_a_corrupt_batch_is_corrupt_message_and_appends_nothing(
    cluster: SharedCluster, version: int
) -> None:
    topic, p = new_topic(cluster, "corrupt")
    with cluster.client(101) as c:
        assert c.produce(topic, {p: _good("first")}, version=version)[p].error_code == 0
        end = log_end(c, topic, p)
        assert end == 2
        for name, corrupt in CORRUPTIONS.items():
            answer = c.produce(topic, {p: corrupt(_good(name))}, version=version)[p]
            assert (answer.error_code, answer.base_offset) == (ErrorCode.CORRUPT_MESSAGE, -1), (
                name,
                answer,
            )
            assert log_end(c, topic, p) == end, f"{name}: the log end moved"
        answer = c.produce(topic, {p: None}, version=version)[p]  # null records
        assert answer.error_code == ErrorCode.CORRUPT_MESSAGE
        # Nothing was half-written: the next good batch lands exactly at the old end.
        answer = c.produce(topic, {p: _good("after")}, version=version)[p]
        assert (answer.error_code, answer.base_offset) == (ErrorCode.NONE, end)
        assert log_end(c, topic, p) == end + 2


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (9, ErrorCode.INVALID_RECORD),  # KIP-467: Produce v8+ knows INVALID_RECORD
        (3, ErrorCode.CORRUPT_MESSAGE),  # before v8 Kafka sends CORRUPT_MESSAGE for it
    ],
)
def test_a_batch_breaking_a_rule_is_invalid_record_or_corrupt_message_by_version(
    cluster: SharedCluster, version: int, expected: int
) -> None:
    """A record count that disagrees with the last offset delta (CRC valid), and an empty
    records field, are InvalidRecordException in Kafka: INVALID_RECORD from Produce v8,
    CORRUPT_MESSAGE before (replication.errors.InvalidRecord.legacy_code)."""
    topic, p = new_topic(cluster, "rule")
    with cluster.client(101) as c:
        end = log_end(c, topic, p)
        for name, records in [
            ("count-3-for-2-records", _with_record_count(_good(), 3)),
            ("no-batch-at-all", b""),
        ]:
            answer = c.produce(topic, {p: records}, version=version)[p]
            assert answer.error_code == expected, (name, version, answer)
            assert log_end(c, topic, p) == end


def _with_crc_fixed(batch: bytes | bytearray) -> bytes:
    out = bytearray(batch)
    struct.pack_into(">I", out, _CRC_AT, compute_crc(out, 0, len(out)))
    return bytes(out)


def _records_garbled(batch: bytes) -> bytes:
    """The records section overwritten with bytes that are not records; CRC recomputed."""
    return _with_crc_fixed(batch[:61] + bytes(range(7, 7 + len(batch) - 61)))


def _fewer_records_than_counted(batch: bytes) -> bytes:
    """Count 2 and last offset delta 1, but one record inside; CRC recomputed."""
    single = bytearray(make_batch([b"only"]))
    struct.pack_into(">i", single, 23, 1)  # last_offset_delta
    struct.pack_into(">i", single, _COUNT_AT, 2)
    return _with_crc_fixed(single)


def _compressed_garbled(batch: bytes) -> bytes:
    """A gzip batch whose compressed section is damaged; CRC recomputed."""
    out = bytearray(make_batch([b"a" * 100, b"b" * 100], compression=CompressionType.GZIP))
    out[70:80] = bytes(10)
    return _with_crc_fixed(out)


def _plain_records_flagged_gzip(batch: bytes) -> bytes:
    out = bytearray(batch)
    struct.pack_into(">h", out, 21, int(CompressionType.GZIP))  # attributes: codec
    return _with_crc_fixed(out)


@pytest.mark.parametrize(
    "damage",
    [
        _records_garbled,
        _fewer_records_than_counted,
        _compressed_garbled,
        _plain_records_flagged_gzip,
    ],
)
def test_a_batch_whose_records_do_not_decode_is_refused_even_with_a_valid_crc(
    cluster: SharedCluster, damage: Callable[[bytes], bytes]
) -> None:
    """A CRC only proves the bytes arrived as the producer wrote them. Kafka's broker also
    reads every record before appending (LogValidator), so a batch whose records section
    does not decode is refused (CORRUPT_MESSAGE, or INVALID_RECORD from Produce v8) instead
    of being stored and served to consumers that cannot read it."""
    topic, p = new_topic(cluster, "undecodable")
    records = damage(_good())
    with pytest.raises(StorageCorruptRecordError):
        decode_batch(records)  # the batch really is unreadable
    with cluster.client(101) as c:
        answer = c.produce(topic, {p: records})[p]
        assert answer.error_code in (ErrorCode.CORRUPT_MESSAGE, ErrorCode.INVALID_RECORD), answer
        assert log_end(c, topic, p) == 0


# -- oversized batches --------------------------------------------------------------------------


def test_a_batch_over_the_topics_max_message_bytes_is_message_too_large(
    cluster: SharedCluster,
) -> None:
    topic, p = new_topic(cluster, "max-msg", {"max.message.bytes": "1000"})
    with cluster.client(101) as c:
        for version in (3, 9):
            answer = c.produce(topic, {p: batch_of_size(1001)}, version=version)[p]
            assert (answer.error_code, answer.base_offset) == (ErrorCode.MESSAGE_TOO_LARGE, -1)
            assert log_end(c, topic, p) == 0
        answer = c.produce(topic, {p: batch_of_size(1000)})[p]  # the limit itself is allowed
        assert (answer.error_code, answer.base_offset) == (ErrorCode.NONE, 0)


def test_a_batch_over_the_default_max_message_bytes_is_message_too_large(
    cluster: SharedCluster,
) -> None:
    topic, p = new_topic(cluster, "max-default")
    with cluster.client(101) as c:
        over = batch_of_size(DEFAULT_MAX_MESSAGE_BYTES + 1)
        answer = c.produce(topic, {p: over})[p]
        assert answer.error_code == ErrorCode.MESSAGE_TOO_LARGE, answer
        assert log_end(c, topic, p) == 0
        answer = c.produce(topic, {p: batch_of_size(DEFAULT_MAX_MESSAGE_BYTES)})[p]
        assert (answer.error_code, answer.base_offset) == (ErrorCode.NONE, 0)
        assert log_end(c, topic, p) == 1


def test_a_request_larger_than_a_segment_is_record_list_too_large(
    cluster: SharedCluster,
) -> None:
    segment = 1024 * 1024  # the least a topic may set (Kafka 4's minimum)
    configs = {"segment.bytes": str(segment), "max.message.bytes": str(2 * segment)}
    topic, p = new_topic(cluster, "seg", configs)
    with cluster.client(101) as c:
        # One batch: from Produce v3 a partition's records are exactly one batch, so
        # several small ones are INVALID_RECORD before the size is looked at (as in Kafka).
        answer = c.produce(topic, {p: batch_of_size(segment + 1)})[p]
        assert (answer.error_code, answer.base_offset) == (ErrorCode.RECORD_LIST_TOO_LARGE, -1)
        assert log_end(c, topic, p) == 0
        assert c.produce(topic, {p: batch_of_size(segment)})[p].error_code == ErrorCode.NONE


# -- timestamps ---------------------------------------------------------------------------------


def test_a_batch_stamped_too_far_from_the_brokers_clock_is_invalid_timestamp(
    cluster: SharedCluster,
) -> None:
    """KIP-937: by default a batch more than an hour ahead is refused; a topic may bound how
    far behind or ahead it takes. Nothing refused is appended."""
    hour = 3_600_000
    default, p = new_topic(cluster, "ts-default")
    bounded, q = new_topic(
        cluster,
        "ts-bounded",
        {"message.timestamp.before.max.ms": "60000", "message.timestamp.after.max.ms": "60000"},
    )
    with cluster.client(101) as c:
        now = int(time.time() * 1000)
        refused = [
            (default, p, now + 2 * hour),
            (bounded, q, now + 10 * 60_000),
            (bounded, q, now - 10 * 60_000),
        ]
        for topic, partition, stamp in refused:
            answer = c.produce(topic, {partition: make_batch([b"x"], timestamp_ms=stamp)})
            assert (answer[partition].error_code, answer[partition].base_offset) == (
                ErrorCode.INVALID_TIMESTAMP,
                -1,
            ), (topic, stamp - now)
        assert (log_end(c, default, p), log_end(c, bounded, q)) == (0, 0)
        taken = [(default, p, now + hour // 2), (default, p, now - 100 * hour), (bounded, q, now)]
        for topic, partition, stamp in taken:
            answer = c.produce(topic, {partition: make_batch([b"y"], timestamp_ms=stamp)})
            assert answer[partition].error_code == ErrorCode.NONE, (topic, stamp - now)
        assert (log_end(c, default, p), log_end(c, bounded, q)) == (2, 1)


# -- acks and mixed requests ------------------------------------------------------------------


@pytest.mark.parametrize("acks", [2, -2, 100])
def test_invalid_acks_is_invalid_required_acks_for_every_partition(
    cluster: SharedCluster, acks: int
) -> None:
    topic = unique_topic("acks")
    with cluster.client(101) as c:
        c.create_topic(topic, 2, 1)
        mine = led_by(cluster, topic, 101)
        for version in (3, 9):
            answers = c.produce(topic, {0: _good(), 1: _good()}, acks=acks, version=version)
            assert {i: a.error_code for i, a in answers.items()} == {
                0: ErrorCode.INVALID_REQUIRED_ACKS,
                1: ErrorCode.INVALID_REQUIRED_ACKS,
            }
        assert [log_end(c, topic, p) for p in mine] == [0] * len(mine)


def test_one_bad_partition_does_not_fail_the_good_ones(cluster: SharedCluster) -> None:
    topic = unique_topic("mixed")
    with cluster.client(101) as c:
        c.create_topic(topic, 4, 1)
        leaders = cluster.leaders(topic)
        good, bad = (p for p in sorted(leaders) if leaders[p][0] == 101)
        elsewhere = next(p for p in sorted(leaders) if leaders[p][0] == 102)
        assert c.produce(topic, {good: _good(), bad: _good()})[good].error_code == 0
        answers = c.produce(
            topic,
            {
                good: _good("kept"),
                bad: _with_crc_flipped(_good("refused")),
                elsewhere: _good("elsewhere"),
                99: _good("nowhere"),
            },
        )
        assert {i: (a.error_code, a.base_offset) for i, a in answers.items()} == {
            good: (ErrorCode.NONE, 2),
            bad: (ErrorCode.CORRUPT_MESSAGE, -1),
            elsewhere: (ErrorCode.NOT_LEADER_OR_FOLLOWER, -1),
            99: (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1),
        }
        assert (log_end(c, topic, good), log_end(c, topic, bad)) == (4, 2)
    with cluster.client(102) as other:
        assert log_end(other, topic, elsewhere) == 0


# -- unsupported APIs and versions --------------------------------------------------------------


def _frame(api_key: int, version: int, correlation_id: int, body: bytes = b"") -> bytes:
    """A request frame with header v1 (api key, version, correlation id, client id)."""
    head = struct.pack(">hhih", api_key, version, correlation_id, 4) + b"test"
    return struct.pack(">i", len(head) + len(body)) + head + body


def _metadata_frame(correlation_id: int) -> bytes:
    parts = encode_request(ApiKey.METADATA, 12, correlation_id, "test", {"topics": []})
    return b"".join(bytes(x) for x in parts)


def _unsupported_answer(correlation_id: int) -> bytes:
    return struct.pack(">ih", correlation_id, ErrorCode.UNSUPPORTED_VERSION)


def test_api_versions_beyond_the_supported_range_answers_v0_with_the_apis(
    cluster: SharedCluster,
) -> None:
    with cluster.client(101) as c:
        c.send_raw(_frame(ApiKey.API_VERSIONS, 99, 4242, b"\x00" * 8))
        correlation_id, answer = decode_response(ApiKey.API_VERSIONS, 0, c.read_frame())
        assert correlation_id == 4242
        assert answer.error_code == ErrorCode.UNSUPPORTED_VERSION
        listed = {a.api_key: (a.min_version, a.max_version) for a in answer.api_keys}
        assert listed == advertised(c)  # what a supported ApiVersions says, on the same socket
        assert listed.keys() >= API_SPECS.keys()


@pytest.mark.parametrize(
    ("api_key", "version"),
    [
        (1000, 0),  # no such API
        (-1, 0),
        (ApiKey.METADATA, API_SPECS[ApiKey.METADATA].max_version + 1),
        (ApiKey.FETCH, API_SPECS[ApiKey.FETCH].min_version - 1),  # below the range
        (ApiKey.METADATA, 0x7FFF),
        (ApiKey.FETCH, -1),
    ],
)
def test_an_unknown_api_or_version_is_unsupported_version_and_the_connection_serves_on(
    cluster: SharedCluster, api_key: int, version: int
) -> None:
    watch = cluster.watch(101)
    with cluster.client(101) as c:
        c.send_raw(_frame(api_key, version, 777, os.urandom(16)))
        assert c.read_frame() == _unsupported_answer(777)
        # Pipelined: an unsupported request between two good ones, all in one write.
        c.send_raw(_metadata_frame(10) + _frame(api_key, version, 11) + _metadata_frame(12))
        first = decode_response(ApiKey.METADATA, 12, c.read_frame())
        second = c.read_frame()
        third = decode_response(ApiKey.METADATA, 12, c.read_frame())
        assert (first[0], second, third[0]) == (10, _unsupported_answer(11), 12)
        assert_still_serving(c)
    watch.wait_for(rf"unsupported request api_key={api_key} api_version={version} ")


@pytest.mark.parametrize("version", [0, 1, 2])
def test_a_produce_of_message_format_v0_or_v1_closes_the_connection(
    cluster: SharedCluster, version: int
) -> None:
    """Produce v0-v2 is advertised (librdkafka needs v0 listed) but not served: the
    connection is closed and logged, as Apache Kafka 4.0 does (KAFKA-18659)."""
    frame = _frame(ApiKey.PRODUCE, version, 9, b"\x00" * 12)
    _closed_and_logged(cluster, lambda c: c.send_raw(frame), f"Produce v{version} ")


def test_a_client_id_cannot_forge_a_record_in_the_node_log(cluster: SharedCluster) -> None:
    """The client id of an unsupported request is logged (WARNING); a newline in it must not
    start a record of the client's making in the operator's log."""
    forged = "2000-01-01 00:00:00,000 level=ERROR node=101 logger=forged a forged record"
    client_id = f"innocent\n{forged}".encode()
    head = struct.pack(">hhih", 1000, 0, 31, len(client_id)) + client_id
    watch = cluster.watch(101)
    with cluster.client(101) as c:
        c.send_raw(struct.pack(">i", len(head)) + head)
        assert c.read_frame() == _unsupported_answer(31)
        watch.wait_for(r"unsupported request api_key=1000 ")
    lines = watch.text().splitlines()
    assert not [line for line in lines if line.startswith(forged)], watch.text()


# -- frames that cannot be trusted ------------------------------------------------------------


def _closed_and_logged(
    cluster: SharedCluster, send: Callable[[RawClient], None], reason: str
) -> None:
    """``send`` on a fresh connection: the broker closes it and logs why (naming the peer),
    while a connection opened before and one opened after are served."""
    watch = cluster.watch(101)
    with cluster.client(101) as before, cluster.client(101) as victim:
        peer = peer_of(victim)
        send(victim)
        assert victim.closed_by_peer(), "the broker kept the connection open"
        assert_still_serving(before)
    with cluster.client(101) as after:
        assert_still_serving(after)
    record = watch.wait_for(rf"from {re.escape(peer)}:", level="WARNING")
    assert reason in record, record
    assert cluster.alive(101)


@pytest.mark.parametrize(
    "size",
    [SOCKET_REQUEST_MAX_BYTES + 1, 2**31 - 1, -1, -(2**31)],
    ids=["limit+1", "int32-max", "minus-1", "int32-min"],
)
def test_a_size_prefix_outside_the_limit_closes_that_connection_only(
    cluster: SharedCluster, size: int
) -> None:
    _closed_and_logged(
        cluster,
        lambda c: c.send_raw(struct.pack(">i", size)),
        f"request size {size} is outside [0, {SOCKET_REQUEST_MAX_BYTES}]",
    )


def test_garbage_bytes_close_the_connection(cluster: SharedCluster) -> None:
    _closed_and_logged(
        cluster, lambda c: c.send_raw(b"GET / HTTP/1.1\r\nHost: runnel\r\n\r\n"), "FrameSizeError"
    )


def test_a_frame_too_short_for_a_header_closes_the_connection(cluster: SharedCluster) -> None:
    _closed_and_logged(
        cluster, lambda c: c.send_raw(struct.pack(">i", 3) + b"\x00\x03\x00"), "ProtocolError"
    )


def test_a_valid_header_with_a_malformed_body_closes_the_connection(
    cluster: SharedCluster,
) -> None:
    # Metadata v12: the topics array's compact length is a varint longer than 5 bytes.
    head = struct.pack(">hhih", ApiKey.METADATA, 12, 5, 4) + b"test" + b"\x00"
    body = b"\xff" * 8
    frame = struct.pack(">i", len(head) + len(body)) + head + body
    _closed_and_logged(cluster, lambda c: c.send_raw(frame), "ProtocolError")


def test_a_request_cut_short_inside_its_frame_closes_the_connection(
    cluster: SharedCluster,
) -> None:
    parts = encode_request(ApiKey.METADATA, 12, 6, "test", {"topics": [{"name": "abc"}]})
    whole = b"".join(bytes(x) for x in parts)[4:]
    cut = whole[:-5]
    frame = struct.pack(">i", len(cut)) + cut
    _closed_and_logged(cluster, lambda c: c.send_raw(frame), "ProtocolError")


def test_a_truncated_frame_then_eof_closes_the_connection_and_is_logged(
    cluster: SharedCluster,
) -> None:
    """The client sends part of a frame and closes its side: the broker closes the
    connection and, as the issue asks for truncated frames, logs it (at a level the node's
    log keeps: INFO and above)."""
    parts = encode_request(ApiKey.METADATA, 12, 7, "test", {"topics": None})
    whole = b"".join(bytes(x) for x in parts)

    def send(c: RawClient) -> None:
        c.send_raw(whole[:-3])
        c.half_close()  # EOF mid-frame

    watch = cluster.watch(101)
    with cluster.client(101) as before, cluster.client(101) as victim:
        peer = peer_of(victim)
        send(victim)
        assert victim.closed_by_peer()
        assert_still_serving(before)
    with cluster.client(101) as after:
        assert_still_serving(after)
    assert cluster.alive(101)
    records = [r for r in watch.records() if re.search(rf"{re.escape(peer)}\b", r)]
    assert records, f"nothing in {watch.path} about the truncated frame from {peer}"


def test_many_bad_connections_at_once_leave_a_good_one_served(cluster: SharedCluster) -> None:
    """Twenty connections send twenty kinds of rubbish, interleaved with requests on a
    healthy connection, which is answered throughout."""
    with cluster.client(101) as good:
        bad = [cluster.client(101) for _ in range(20)]
        try:
            for i, c in enumerate(bad):
                c.send_raw(struct.pack(">i", 8 + i) + os.urandom(8 + i) if i % 2 else os.urandom(7))
                assert_still_serving(good)
            for c in bad:
                c.half_close()
                assert c.closed_by_peer()
        finally:
            for c in bad:
                c.close()
        assert_still_serving(good)
