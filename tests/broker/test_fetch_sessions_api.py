"""Fetch sessions (KIP-227) through the Kafka API on a real cluster (the ``kafka`` fixture,
kafka_cluster.py: brokers 101 and 102), with raw Fetch requests from raw_client.py, and with
kafka-python, whose consumer uses incremental sessions by default.

The story: a consumer opens a session with a full fetch (epoch 0) and gets its id; its next
fetches carry the id and the next epoch and name nothing, or only what moved. The broker
answers only the partitions with news: records, or a high watermark the consumer has not
heard. A wrong epoch is INVALID_FETCH_SESSION_EPOCH (71), an unknown session
FETCH_SESSION_ID_NOT_FOUND (70), both at the top level with no partitions. A forgotten
partition is no longer fetched or answered. A parked incremental fetch wakes for an append
to any partition of its session and answers only that one.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka_cluster import KafkaCluster, kafka
from raw_client import BROKERS, RawClient, SharedCluster, fetch_body, unique_topic
from support import make_batch

from broker.protocol import ApiKey, ErrorCode

__all__ = ["kafka"]  # the fixture

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

PARTITIONS = 6  # three led by each broker


@pytest.fixture
def cluster(kafka: KafkaCluster) -> SharedCluster:
    return SharedCluster.of(kafka)


def session_fetch(
    client: RawClient,
    session_id: int,
    epoch: int,
    partitions: list[tuple[str, int, int]],
    *,
    forgotten: list[tuple[str, int]] = (),  # type: ignore[assignment]
    max_wait_ms: int = 0,
) -> Any:
    body = fetch_body(partitions, max_wait_ms=max_wait_ms)
    by_topic: dict[str, list[int]] = {}
    for topic, index in forgotten:
        by_topic.setdefault(topic, []).append(index)
    body.update(
        session_id=session_id,
        session_epoch=epoch,
        forgotten_topics_data=[{"topic": t, "partitions": ps} for t, ps in by_topic.items()],
    )
    return client.request(ApiKey.FETCH, 12, body)


def answered(response: Any) -> dict[int, Any]:
    """partition -> its answer; the response must have no top-level error."""
    assert response.error_code == ErrorCode.NONE, response.error_code
    return {p.partition_index: p for t in response.responses for p in t.partitions}


def records_of(answer: Any) -> bytes:
    return bytes(answer.records or b"")


def new_topic(cluster: SharedCluster, prefix: str, broker: int) -> tuple[str, list[int]]:
    """A fresh topic of PARTITIONS partitions (replication factor 1) and those ``broker``
    leads (at least two)."""
    topic = unique_topic(prefix)
    with cluster.client() as c:
        c.create_topic(topic, PARTITIONS, 1)
    mine = [p for p, (leader, _) in cluster.leaders(topic).items() if leader == broker]
    assert len(mine) >= 2, (topic, broker, mine)
    return topic, sorted(mine)


def open_session(client: RawClient, topic: str, partitions: list[int]) -> int:
    opened = session_fetch(client, 0, 0, [(topic, p, 0) for p in partitions])
    assert opened.session_id > 0
    assert sorted(answered(opened)) == partitions  # a full answer names every partition
    return int(opened.session_id)


def test_an_incremental_fetch_answers_only_the_partitions_that_changed(
    cluster: SharedCluster,
) -> None:
    broker = BROKERS[0]
    topic, (first, second, *rest) = new_topic(cluster, "sess-news", broker)
    with cluster.client(broker) as c:
        session = open_session(c, topic, [first, second, *rest])
        assert answered(session_fetch(c, session, 1, [])) == {}
        assert c.produce(topic, {second: make_batch([b"a", b"b"])}, acks=1)[second].error_code == 0
        news = answered(session_fetch(c, session, 2, []))
        assert list(news) == [second] and news[second].high_watermark == 2
        assert records_of(news[second])  # read from the session's offset, 0
        # The consumer moves past what it read: nothing new, and the HW was heard.
        assert answered(session_fetch(c, session, 3, [(topic, second, 2)])) == {}
        assert answered(session_fetch(c, session, 4, [])) == {}


def test_a_wrong_epoch_is_71_and_an_unknown_session_is_70(cluster: SharedCluster) -> None:
    broker = BROKERS[1]
    topic, mine = new_topic(cluster, "sess-err", broker)
    with cluster.client(broker) as c:
        session = open_session(c, topic, mine)
        for wrong in (2, 9):
            refused = session_fetch(c, session, wrong, [])
            assert refused.error_code == ErrorCode.INVALID_FETCH_SESSION_EPOCH
            assert (refused.session_id, refused.responses) == (0, [])
        assert answered(session_fetch(c, session, 1, [])) == {}  # the session is still there
        unknown = session_fetch(c, session % (2**31 - 1) + 1, 1, [])
        assert unknown.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
        assert (unknown.session_id, unknown.responses) == (0, [])
        # Closing it (epoch -1, a sessionless fetch) makes it unknown too.
        closed = session_fetch(c, session, -1, [(topic, mine[0], 0)])
        assert closed.session_id == 0 and list(answered(closed)) == [mine[0]]
        after = session_fetch(c, session, 2, [])
        assert after.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND


def test_forgotten_partitions_stop_appearing(cluster: SharedCluster) -> None:
    broker = BROKERS[0]
    topic, (kept, dropped, *_) = new_topic(cluster, "sess-forget", broker)
    with cluster.client(broker) as c:
        session = open_session(c, topic, [kept, dropped])
        assert answered(session_fetch(c, session, 1, [], forgotten=[(topic, dropped)])) == {}
        c.produce(topic, {dropped: make_batch([b"gone"])}, acks=1)
        assert answered(session_fetch(c, session, 2, [])) == {}
        c.produce(topic, {kept: make_batch([b"here"])}, acks=1)
        assert list(answered(session_fetch(c, session, 3, []))) == [kept]
        # Named again, it is back (added), answered from the offset given; ``kept`` moves
        # past its record, so it has no news.
        back = answered(session_fetch(c, session, 4, [(topic, dropped, 0), (topic, kept, 1)]))
        assert list(back) == [dropped] and records_of(back[dropped])


def test_a_parked_incremental_fetch_wakes_for_any_partition_of_its_session(
    cluster: SharedCluster,
) -> None:
    broker = BROKERS[1]
    topic, (first, *others) = new_topic(cluster, "sess-park", broker)
    woken = others[-1]
    with cluster.client(broker) as c:
        session = open_session(c, topic, [first, *others])
        got: list[Any] = []
        # It may park far beyond the join below (a minute asked, the broker's cap 30 s): only
        # the append can answer it in time, so a missed wake fails as nothing got.
        waiter = threading.Thread(
            target=lambda: got.append(session_fetch(c, session, 1, [], max_wait_ms=60_000)),
            daemon=True,
        )
        waiter.start()
        time.sleep(0.3)
        assert not got  # parked: nothing to say
        with cluster.client(broker) as producer:
            producer.produce(topic, {woken: make_batch([b"wake"])}, acks=1)
        waiter.join(10)
        assert got, "the append did not wake the parked fetch within 10 s"
        assert list(answered(got[0])) == [woken]


def test_kafka_python_consumes_through_incremental_sessions(
    kafka: KafkaCluster, cluster: SharedCluster, caplog: pytest.LogCaptureFixture
) -> None:
    topic = unique_topic("sess-kp")
    with cluster.client() as c:
        c.create_topic(topic, PARTITIONS, 1)
    cluster.leaders(topic)
    consumer = KafkaConsumer(
        bootstrap_servers=kafka.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        fetch_max_wait_ms=100,
    )
    caplog.set_level(logging.DEBUG, logger="kafka.consumer.fetcher")
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
        consumer.seek_to_beginning()
        expected, seen = [], []
        leaders = cluster.leaders(topic)
        for round_ in range(5):
            partition = round_ % PARTITIONS
            value = f"round {round_}".encode()
            with cluster.client(leaders[partition][0]) as c:
                assert c.produce(topic, {partition: make_batch([value])})[partition].error_code == 0
            expected.append((partition, value))
            deadline = time.monotonic() + 20
            while len(seen) < len(expected) and time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=200).values():
                    seen.extend((r.partition, r.value) for r in records)
        assert sorted(seen) == sorted(expected)
    finally:
        consumer.close()
    text = caplog.text
    assert "sent an incremental fetch response for session" in text
    assert "sent an invalid" not in text and "was unable to process the fetch request" not in text
