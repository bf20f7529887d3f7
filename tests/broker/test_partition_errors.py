"""Partition-level requests checked against the broker's metadata image, on a real cluster,
and Fetch's waiting and size rules.

The story: a client asks a broker about a partition. If the broker does not lead it, the
answer is NOT_LEADER_OR_FOLLOWER and, where the protocol has room (Fetch v12's and Produce
v10's tagged ``current_leader``, with Produce's ``node_endpoints``), who does; if the
client's leader epoch is older than the partition's it is FENCED_LEADER_EPOCH, if newer
UNKNOWN_LEADER_EPOCH (KIP-320); if the topic or partition does not exist,
UNKNOWN_TOPIC_OR_PARTITION. A fetch at the log end long-polls until another connection
produces or ``max_wait_ms`` passes, and a fetch's byte limits hold except that the first batch
of the first partition with data is always whole (KIP-74).

The cluster (the ``kafka`` fixture, kafka_cluster.py) has brokers 101 and 102; topics with
one replica put their partitions on the two in turn. A leader epoch only moves when
leadership does, so the fencing test moves it: broker 101 shuts down under control (its
leaderships move to 102 at the next epoch) and is started again. That test runs on a cluster
of its own of the same shape (the ``own_cluster`` fixture), since the shared one's contract
is that its brokers stay up for every test of the session.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka_cluster import KafkaCluster, kafka
from raw_client import (
    BROKERS,
    RawClient,
    SharedCluster,
    fetch_body,
    unique_topic,
)
from support import make_batch
from test_local_cluster import Cluster, free_base_port, wait_for

from broker.protocol import ApiKey, ErrorCode, decode_response
from runnel.kafka_close import close_consumer
from runnel.local_cluster import process_alive
from storage.batch import peek_size
from storage.records import decode_batch

__all__ = ["kafka"]  # the fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

FETCH_VERSIONS_WITH_EPOCH = [9, 12]  # current_leader_epoch exists from Fetch v9
LIST_OFFSETS_VERSIONS_WITH_EPOCH = [4, 7]
WOKEN_READ_S = 10.0  # the bound on a woken long poll's answer (it comes in milliseconds)


@pytest.fixture
def cluster(kafka: KafkaCluster) -> SharedCluster:
    return SharedCluster.of(kafka)


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[SharedCluster]:
    """A cluster of the test's own, shaped like the shared one (one controller, brokers 101
    and 102), for a test that stops and restarts a broker; stopped at the end, and whatever
    ``cluster down`` leaves running is kill -9'd, found by its pid file."""
    local = Cluster(tmp_path / "cluster", free_base_port(3))
    try:
        yield SharedCluster.of(KafkaCluster(local.data_dir, local.up_two_brokers()))
    finally:
        try:
            local.run("cluster", "down")
        finally:
            for pid in local.pids():
                if process_alive(pid, str(local.data_dir)) or process_alive(pid, "cluster\0up"):
                    os.kill(pid, signal.SIGKILL)


def _other(broker: int) -> int:
    return BROKERS[1] if broker == BROKERS[0] else BROKERS[0]


def _fetch_one(
    client: RawClient, topic: str, partition: int, *, version: int = 12, **kwargs: Any
) -> Any:
    answer = client.fetch([(topic, partition, 0)], version=version, **kwargs)
    assert answer.error_code == ErrorCode.NONE
    (t,) = answer.responses
    (p,) = t.partitions
    assert (t.topic, p.partition_index) == (topic, partition)
    return p


def _list_offsets(
    client: RawClient, topic: str, partition: int, *, version: int = 7, leader_epoch: int = -1
) -> Any:
    partition_body: dict[str, Any] = {"partition_index": partition, "timestamp": -1}
    if version >= 4:
        partition_body["current_leader_epoch"] = leader_epoch
    body = {
        "replica_id": -1,
        "isolation_level": 0,
        "topics": [{"name": topic, "partitions": [partition_body]}],
    }
    return client.request(ApiKey.LIST_OFFSETS, version, body).topics[0].partitions[0]


def _epoch_end(client: RawClient, topic: str, partition: int, *, current: int = -1) -> Any:
    body = {
        "replica_id": -1,
        "topics": [
            {
                "topic": topic,
                "partitions": [
                    {"partition": partition, "current_leader_epoch": current, "leader_epoch": 0}
                ],
            }
        ],
    }
    return client.request(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4, body).topics[0].partitions[0]


def _batch(*values: str) -> bytes:
    return make_batch([v.encode() for v in values])


def _values(records: Any) -> list[bytes | None]:
    """The values of the whole batches in ``records`` (a partial trailing batch ignored)."""
    data, pos, out = bytes(records), 0, []
    while len(data) - pos >= 12 and pos + peek_size(data, pos)[1] <= len(data):
        batch = decode_batch(data, pos)
        out.extend(r.value for r in batch.records)
        pos += batch.header.size_bytes
    return out


def _whole_batch_sizes(records: Any) -> list[int]:
    data, pos, sizes = bytes(records), 0, []
    while len(data) - pos >= 12 and pos + (size := peek_size(data, pos)[1]) <= len(data):
        sizes.append(size)
        pos += size
    return sizes


# -- not the leader ---------------------------------------------------------------------------


def test_a_produce_to_a_partition_led_elsewhere_is_not_leader_or_follower(
    cluster: SharedCluster,
) -> None:
    single, double = unique_topic("nl1"), unique_topic("nl2")
    with cluster.client() as c:
        c.create_topic(single, 4, 1)  # no replica at all on the other broker
        c.create_topic(double, 4, 2)  # a follower replica on the other broker
    for topic in (single, double):
        leaders = cluster.leaders(topic)
        for partition, (leader, epoch) in leaders.items():
            with cluster.client(_other(leader)) as wrong:
                for version in (3, 9, 10):
                    answer = wrong.produce(topic, {partition: _batch("x")}, version=version)
                    assert answer[partition].error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
                    assert answer[partition].base_offset == -1
                # Metadata from the same broker names the leader the client should ask.
                metadata = wrong.metadata([topic])
                (t,) = metadata.topics
                assert {p.partition_index: p.leader_id for p in t.partitions}[partition] == leader
                # From Produce v10 the refusal itself says so, with the address (KIP-951).
                hinted = wrong.produce_answer(topic, {partition: _batch("x")}, version=10)
                (p,) = hinted.responses[0].partition_responses
                named = (p.current_leader.leader_id, p.current_leader.leader_epoch)
                assert named == (leader, epoch)
                (address,) = [(b.host, b.port) for b in metadata.brokers if b.node_id == leader]
                assert [(e.node_id, e.host, e.port) for e in hinted.node_endpoints] == [
                    (leader, *address)
                ]
            with cluster.client(leader) as right:
                answer = right.produce(topic, {partition: _batch("y")})[partition]
                assert (answer.error_code, answer.base_offset) == (ErrorCode.NONE, 0)


@pytest.mark.parametrize("replication_factor", [1, 2])
def test_reads_off_the_leader_are_not_leader_and_fetch_v12_names_the_leader(
    cluster: SharedCluster, replication_factor: int
) -> None:
    topic = unique_topic(f"off{replication_factor}")
    with cluster.client() as c:
        c.create_topic(topic, 2, replication_factor)
    for partition, (leader, epoch) in cluster.leaders(topic).items():
        with cluster.client(_other(leader)) as wrong:
            p = _fetch_one(wrong, topic, partition, version=12)
            assert p.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
            assert (p.current_leader.leader_id, p.current_leader.leader_epoch) == (leader, epoch)
            assert bytes(p.records or b"") == b""
            for version in (4, 11):
                old = _fetch_one(wrong, topic, partition, version=version)
                assert old.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
            for version in (1, 4, 7):
                answer = _list_offsets(wrong, topic, partition, version=version)
                assert answer.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER, version
            assert _epoch_end(wrong, topic, partition).error_code == (
                ErrorCode.NOT_LEADER_OR_FOLLOWER
            )
        with cluster.client(leader) as right:
            assert _fetch_one(right, topic, partition).error_code == ErrorCode.NONE
            assert _list_offsets(right, topic, partition).error_code == ErrorCode.NONE


# -- unknown topics and partitions --------------------------------------------------------------


def test_an_unknown_topic_or_partition_is_unknown_topic_or_partition_for_every_api(
    cluster: SharedCluster,
) -> None:
    known = unique_topic("known")
    with cluster.client() as c:
        c.create_topic(known, 2, 1)
    cluster.leaders(known)
    for broker in BROKERS:
        with cluster.client(broker) as c:
            for topic, partition in [
                (unique_topic("absent"), 0),
                (known, 2),
                (known, 1000),
                (known, -1),
            ]:
                for version in (3, 9):
                    answer = c.produce(topic, {partition: _batch("z")}, version=version)
                    assert answer[partition].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                for version in (4, 12):
                    p = _fetch_one(c, topic, partition, version=version)
                    assert p.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, (topic, version)
                for version in (1, 7):
                    answer = _list_offsets(c, topic, partition, version=version)
                    assert answer.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                assert _epoch_end(c, topic, partition).error_code == (
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                )


# -- leader epochs -------------------------------------------------------------------------------


def _assert_epoch_answers(
    cluster: SharedCluster, topic: str, partition: int, leader: int, epoch: int
) -> None:
    """On the leader at ``epoch``: an older client epoch is fenced, a newer one unknown, the
    same one (or none, -1) served. On the other replica the epoch is checked first, then
    leadership."""
    with cluster.client(leader) as c:
        for version in FETCH_VERSIONS_WITH_EPOCH:
            for theirs, code in [
                (epoch + 1, ErrorCode.UNKNOWN_LEADER_EPOCH),
                (epoch, ErrorCode.NONE),
                (-1, ErrorCode.NONE),
            ] + ([(epoch - 1, ErrorCode.FENCED_LEADER_EPOCH)] if epoch > 0 else []):
                p = _fetch_one(c, topic, partition, version=version, leader_epoch=theirs)
                assert p.error_code == code, (version, theirs, p)
                if code == ErrorCode.FENCED_LEADER_EPOCH and version >= 12:
                    assert (p.current_leader.leader_id, p.current_leader.leader_epoch) == (
                        leader,
                        epoch,
                    )
        for version in LIST_OFFSETS_VERSIONS_WITH_EPOCH:
            for theirs, code in [
                (epoch + 1, ErrorCode.UNKNOWN_LEADER_EPOCH),
                (epoch, ErrorCode.NONE),
            ] + ([(epoch - 1, ErrorCode.FENCED_LEADER_EPOCH)] if epoch > 0 else []):
                answer = _list_offsets(c, topic, partition, version=version, leader_epoch=theirs)
                assert answer.error_code == code, (version, theirs, answer)
                if code == ErrorCode.NONE:
                    assert answer.leader_epoch == epoch
        assert _epoch_end(c, topic, partition, current=epoch + 1).error_code == (
            ErrorCode.UNKNOWN_LEADER_EPOCH
        )
        if epoch > 0:
            assert _epoch_end(c, topic, partition, current=epoch - 1).error_code == (
                ErrorCode.FENCED_LEADER_EPOCH
            )


def test_a_newer_client_leader_epoch_is_unknown_leader_epoch(cluster: SharedCluster) -> None:
    topic = unique_topic("epoch0")
    with cluster.client() as c:
        c.create_topic(topic, 2, 1)
    for partition, (leader, epoch) in cluster.leaders(topic).items():
        assert epoch == 0
        _assert_epoch_answers(cluster, topic, partition, leader, epoch)


def _stop_and_restart(cluster: SharedCluster, broker: int) -> None:
    """A controlled shutdown of ``broker`` (its leaderships move away at a new epoch), then
    ``cluster up --once`` starts it again and waits until the cluster is healthy."""
    pid = cluster.pid(broker)
    os.kill(pid, signal.SIGTERM)
    wait_for(f"broker {broker} to exit", lambda: None if cluster.alive(broker) else True, 30)
    cluster.cluster.ok("cluster", "up", "--once")
    assert cluster.pid(broker) != pid and cluster.alive(broker)

    def both_listed() -> bool | None:
        for b in BROKERS:
            try:
                with cluster.client(b) as c:
                    listed = sorted(x.node_id for x in c.metadata([]).brokers)
            except ConnectionRefusedError:  # `up` returns before the listener is bound
                return None
            if listed != list(BROKERS):
                return None
        return True

    wait_for("both brokers to serve and list both brokers again", both_listed, 30)


def test_an_older_client_leader_epoch_is_fenced_once_leadership_moved(
    own_cluster: SharedCluster,
) -> None:
    cluster = own_cluster  # it restarts broker 101: not on the shared cluster
    topic = unique_topic("epoch-moved")
    with cluster.client() as c:
        c.create_topic(topic, 2, 2)
    before = cluster.leaders(topic)
    moved = next(p for p, (leader, _) in before.items() if leader == 101)
    _stop_and_restart(cluster, 101)
    after = cluster.leaders(topic)
    leader, epoch = after[moved]
    assert leader == 102 and epoch > before[moved][1], (before, after)
    _assert_epoch_answers(cluster, topic, moved, leader, epoch)
    with cluster.client(101) as follower:  # the epoch first, then leadership (Kafka's order)
        fenced = _fetch_one(follower, topic, moved, leader_epoch=epoch - 1)
        assert fenced.error_code == ErrorCode.FENCED_LEADER_EPOCH
        current = _fetch_one(follower, topic, moved, leader_epoch=epoch)
        assert current.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert (current.current_leader.leader_id, current.current_leader.leader_epoch) == (
            102,
            epoch,
        )
        assert follower.produce(topic, {moved: _batch("late")})[moved].error_code == (
            ErrorCode.NOT_LEADER_OR_FOLLOWER
        )
    with cluster.client(102) as c:
        answer = c.produce(topic, {moved: _batch("new-epoch")})[moved]
        assert answer.error_code == ErrorCode.NONE
        p = _fetch_one(c, topic, moved, leader_epoch=epoch)
        assert _values(p.records) == [b"new-epoch"]


def test_librdkafka_moves_a_partition_on_the_leader_named_in_a_produce_answer(
    own_cluster: SharedCluster,
) -> None:
    """A real client reads Produce v10's hint (KIP-951): a preferred election moves a
    partition back to 101 while 102 stays up; confluent-kafka's next produce to 102 is
    refused with 101 named, and librdkafka moves the partition from that answer (its debug
    log says "updated with leader", which it writes for such a hint, not for a Metadata
    answer: none with Produce v9), and every record is delivered."""
    from confluent_kafka import Producer

    cluster = own_cluster  # it restarts broker 101: not on the shared cluster
    topic, moved = _led_by_102_until_elected(cluster, "hinted")
    lines: list[str] = []
    producer = Producer(
        {
            "bootstrap.servers": _bootstrap(cluster),
            "acks": "all",
            "debug": "metadata",
            "logger": _collecting(f"librdkafka-{topic}", lines),
        }
    )
    delivered: list[bytes] = []
    failed: list[str] = []

    def report(error: Any, message: Any) -> None:
        if error is None:
            delivered.append(message.value())
        else:
            failed.append(str(error))

    def send(prefix: str) -> None:
        for i in range(20):
            producer.produce(topic, f"{prefix}-{i}".encode(), partition=moved, on_delivery=report)
            producer.poll(0)
        assert producer.flush(30) == 0, "records still queued after 30 s"

    send("to-102")
    leader, epoch = _elect_preferred(cluster, topic, moved)
    send("to-101")
    assert failed == []
    assert sorted(delivered) == sorted(
        f"{prefix}-{i}".encode() for prefix in ("to-102", "to-101") for i in range(20)
    )
    hint = f"updated with leader {leader} and epoch {epoch}"
    assert any(hint in line for line in lines), f"librdkafka never logged {hint!r}"


def test_librdkafka_consumer_moves_a_partition_on_the_leader_named_in_a_fetch_answer(
    own_cluster: SharedCluster,
) -> None:
    """The consumer's side of KIP-951: confluent-kafka fetches by topic id (Fetch v16) from
    102; a preferred election moves the partition to 101, the parked fetch is answered
    NOT_LEADER_OR_FOLLOWER naming 101 with its address, and librdkafka moves the partition
    from that answer (its "updated with leader" line: with Fetch v12, which has no
    ``node_endpoints``, it refreshes its Metadata instead and writes none) and reads on from
    101, every record once and in order."""
    from confluent_kafka import Consumer, TopicPartition

    cluster = own_cluster  # it restarts broker 101: not on the shared cluster
    topic, moved = _led_by_102_until_elected(cluster, "followed")
    lines: list[str] = []
    consumer = Consumer(
        {
            "bootstrap.servers": _bootstrap(cluster),
            "group.id": "fetch-hints",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 5000,  # parked on 102 when the election comes
            "debug": "metadata,fetch,protocol",
            "logger": _collecting(f"librdkafka-{topic}", lines),
        }
    )
    got: list[bytes] = []

    def read(count: int) -> None:
        deadline = time.monotonic() + 30
        while len(got) < count:
            assert time.monotonic() < deadline, f"read {len(got)} of {count} in 30 s"
            for m in consumer.consume(count - len(got), timeout=0.5):
                assert m.error() is None, m.error()
                got.append(m.value())

    def produce(leader: int, prefix: str) -> None:
        with cluster.client(leader) as c:
            answer = c.produce(topic, {moved: _batch(*(f"{prefix}-{i}" for i in range(10)))})
        assert answer[moved].error_code == ErrorCode.NONE

    try:
        consumer.assign([TopicPartition(topic, moved, 0)])
        produce(102, "from-102")
        read(10)
        assert any("FetchRequest (v16" in line for line in lines), (
            "librdkafka did not fetch with v16"
        )
        leader, epoch = _elect_preferred(cluster, topic, moved)
        produce(leader, "from-101")
        read(20)
    finally:
        close_consumer(consumer)  # bounded: librdkafka can deadlock after a leader moved
    assert got == [
        f"{prefix}-{i}".encode() for prefix in ("from-102", "from-101") for i in range(10)
    ]
    hint = f"updated with leader {leader} and epoch {epoch}"
    assert any(hint in line for line in lines), f"librdkafka never logged {hint!r}"


def _led_by_102_until_elected(cluster: SharedCluster, prefix: str) -> tuple[str, int]:
    """A new two-replica topic and one of its partitions whose preferred leader, 101, was
    restarted: 102 leads it, and both replicas are in the ISR (as an election needs)."""
    topic = unique_topic(prefix)
    with cluster.client() as c:
        c.create_topic(topic, 2, 2)
    moved = next(p for p, (leader, _) in cluster.leaders(topic).items() if leader == 101)
    _stop_and_restart(cluster, 101)
    assert cluster.leaders(topic)[moved][0] == 102

    def both_in_sync() -> bool | None:
        with cluster.client(102) as c:
            (t,) = c.metadata([topic]).topics
        isr = {p.partition_index: sorted(p.isr_nodes) for p in t.partitions}
        return True if isr[moved] == list(BROKERS) else None

    wait_for("101 back in the ISR (a preferred election needs it there)", both_in_sync, 30)
    return topic, moved


def _elect_preferred(cluster: SharedCluster, topic: str, partition: int) -> tuple[int, int]:
    """``runnel topics elect`` of the partition; its new (leader, epoch) once 101 leads."""
    cluster.cluster.ok("topics", "elect", topic, "--partition", str(partition))
    return wait_for("the preferred election", lambda: _led_by(cluster, topic, partition, 101), 30)


def _bootstrap(cluster: SharedCluster) -> str:
    return ",".join(f"127.0.0.1:{cluster.ports[b]}" for b in BROKERS)


def _collecting(name: str, lines: list[str]) -> logging.Logger:
    """A logger for librdkafka's lines that keeps them in ``lines``."""
    log = logging.getLogger(name)
    log.addHandler(_Collect(lines))
    log.setLevel(logging.DEBUG)
    log.propagate = False
    return log


class _Collect(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _led_by(cluster: SharedCluster, topic: str, partition: int, broker: int) -> Any:
    leader, epoch = cluster.leaders(topic)[partition]
    return (leader, epoch) if leader == broker else None


# -- fetch: long polls and limits ---------------------------------------------------------------


def _partition_led_by_101(
    cluster: SharedCluster, prefix: str, count: int = 2, attempts: int = 10
) -> tuple[str, list[int]]:
    """A new topic with ``count`` partitions led by 101. New leaderships go to the broker with
    the fewest (controller/placement.py), so after other tests on the shared cluster 102 may
    take most of a topic's; each such topic evens them out, and the next one is tried."""
    seen = []
    for _ in range(attempts):
        topic = unique_topic(prefix)
        with cluster.client() as c:
            c.create_topic(topic, 2 * count, 1)
        mine = sorted(p for p, (leader, _) in cluster.leaders(topic).items() if leader == 101)
        if len(mine) >= count:
            return topic, mine[:count]
        seen.append(mine)
    raise AssertionError(f"no topic with {count} partitions led by 101: {seen}")


def test_a_long_poll_fetch_returns_when_another_connection_produces(
    cluster: SharedCluster,
) -> None:
    topic, (p, _) = _partition_led_by_101(cluster, "poll")
    with cluster.client(101) as waiter, cluster.client(101) as producer:
        assert producer.produce(topic, {p: _batch("old")})[p].error_code == ErrorCode.NONE
        # It may park far beyond the read below (a minute asked, the broker's cap 30 s): only
        # the produce can answer it in time, so a missed wake fails the read (TimeoutError).
        body = fetch_body([(topic, p, 1)], max_wait_ms=60_000, min_bytes=1)
        correlation_id = waiter.send_request(ApiKey.FETCH, 12, body)
        time.sleep(0.2)  # let the fetch park (if it has not, it answers at once: also right)
        answer = producer.produce(topic, {p: _batch("new-1", "new-2")})[p]
        assert (answer.error_code, answer.base_offset) == (ErrorCode.NONE, 1)
        frame = waiter.read_frame(timeout_s=WOKEN_READ_S)
    got_id, response = decode_response(ApiKey.FETCH, 12, frame)
    assert got_id == correlation_id
    (t,) = response.responses
    (got,) = t.partitions
    assert got.error_code == ErrorCode.NONE and got.high_watermark == 3
    assert _values(got.records) == [b"new-1", b"new-2"]


def test_a_long_poll_fetch_with_nothing_new_returns_empty_after_max_wait(
    cluster: SharedCluster,
) -> None:
    topic, (p, q) = _partition_led_by_101(cluster, "idle")
    with cluster.client(101) as c:
        assert c.produce(topic, {p: _batch("only")})[p].error_code == ErrorCode.NONE
        body = fetch_body([(topic, p, 1), (topic, q, 0)], max_wait_ms=1000, min_bytes=1)
        correlation_id = c.send_request(ApiKey.FETCH, 12, body)
        with pytest.raises(TimeoutError):  # it waits: nothing to read well before max_wait_ms
            c.read_frame(timeout_s=0.3)
        response = c.receive(ApiKey.FETCH, 12, correlation_id)  # bounded by IO_TIMEOUT_S
        got = {x.partition_index: x for x in response.responses[0].partitions}
        assert {i: (x.error_code, bytes(x.records or b"")) for i, x in got.items()} == {
            p: (ErrorCode.NONE, b""),
            q: (ErrorCode.NONE, b""),
        }
        assert (got[p].high_watermark, got[q].high_watermark) == (1, 0)
        assert c.api_versions().error_code == ErrorCode.NONE  # and the connection serves on


BATCH_BYTES = 500


def _filled(cluster: SharedCluster, prefix: str, batches: int = 4) -> tuple[str, list[int]]:
    """Two partitions led by 101, each holding ``batches`` batches of BATCH_BYTES bytes."""
    topic, partitions = _partition_led_by_101(cluster, prefix)
    with cluster.client(101) as c:
        for p in partitions:
            for i in range(batches):
                value = f"{p}-{i}-".encode().ljust(BATCH_BYTES - 70, b".")
                batch = make_batch([value])
                assert len(batch) == BATCH_BYTES, len(batch)
                assert c.produce(topic, {p: batch})[p].error_code == ErrorCode.NONE
    return topic, partitions


def _by_partition(response: Any) -> dict[int, bytes]:
    out = {}
    for t in response.responses:
        for p in t.partitions:
            assert p.error_code == ErrorCode.NONE, p
            out[p.partition_index] = bytes(p.records or b"")
    return out


def test_fetch_keeps_to_partition_max_bytes_except_for_a_first_batch(
    cluster: SharedCluster,
) -> None:
    topic, (p, _) = _filled(cluster, "pmax")
    with cluster.client(101) as c:
        for limit in (1200, 1000, 501, 4 * BATCH_BYTES):
            got = _by_partition(c.fetch([(topic, p, 0)], partition_max_bytes=limit))[p]
            assert len(got) <= limit, (limit, len(got))
            assert _whole_batch_sizes(got) == [BATCH_BYTES] * (limit // BATCH_BYTES)
        for limit in (1, 100, BATCH_BYTES - 1):  # KIP-74: the first batch comes whole
            got = _by_partition(c.fetch([(topic, p, 0)], partition_max_bytes=limit))[p]
            assert _whole_batch_sizes(got) == [BATCH_BYTES] and len(got) == BATCH_BYTES


def test_fetch_keeps_to_max_bytes_across_partitions_except_for_a_first_batch(
    cluster: SharedCluster,
) -> None:
    topic, (p, q) = _filled(cluster, "rmax")
    both = [(topic, p, 0), (topic, q, 0)]
    with cluster.client(101) as c:
        got = _by_partition(c.fetch(both, max_bytes=1200))
        assert len(got[p]) + len(got[q]) <= 1200
        assert _whole_batch_sizes(got[p]) == [BATCH_BYTES, BATCH_BYTES]
        got = _by_partition(c.fetch(both, max_bytes=100))  # the first partition's batch only
        assert (len(got[p]), got[q]) == (BATCH_BYTES, b"")
        # The first partition WITH DATA gets the whole batch: here q, as p is at its end.
        got = _by_partition(c.fetch([(topic, p, 4), (topic, q, 0)], max_bytes=100))
        assert (got[p], len(got[q])) == (b"", BATCH_BYTES)
        got = _by_partition(c.fetch(both, max_bytes=3000, partition_max_bytes=1000))
        assert [len(got[p]), len(got[q])] == [1000, 1000]
