"""KIP-903 with real processes: a leader does not take a follower back into the ISR on the
strength of fetches that say another incarnation of that broker (another broker epoch) than
the one its metadata registers, and does on fetches that say the registered one.

How this works. A cluster of one controller and three brokers (tests/replication/
fault_cluster.py), the session timeout (30 s) far above the lag time (2 s). The follower is
restarted by a controlled shutdown, so it has an old broker epoch and a new one, both read
from its log ("registered with epoch N"); then it is paused (SIGSTOP) until the leader has
shrunk the ISR without it, still registered and unfenced. The test then plays that follower
over the Kafka protocol: Fetch v15 requests to the leader naming the follower's id in
``replica_state`` at the leader's log end, the position at which the leader proposes a
follower back into the ISR. Said with the old epoch, for several lag times: the ISR stays
without it. Said with the new epoch: it is proposed and joins (which shows that the refused
fetches were the kind that would have brought it back). Then the real follower resumes and
every replica ends identical.
"""

from __future__ import annotations

import re
import time
import uuid

import fault_cluster as rc
import pytest
from fault_cluster import Cluster

from bench.kafka_load import Connection
from broker.protocol import ApiKey, ErrorCode

replication_cluster = rc.replication_cluster

FETCH_VERSION = 15  # the first with replica_state (the follower's id and broker epoch)
METADATA_VERSION = 12  # topic ids
LIST_OFFSETS_VERSION = 7
STALE_FETCHING_S = 6.0  # three lag times of fetches from the old incarnation
FETCH_EVERY_S = 0.2
REGISTERED = re.compile(r"broker (\d+) registered with epoch (\d+)")


def registered_epochs(c: Cluster, broker: int) -> list[int]:
    """Every broker epoch ``broker``'s log says it registered with, oldest first."""
    text = c.spec.log_path(broker).read_text(errors="replace")
    return [int(m[2]) for m in REGISTERED.finditer(text) if int(m[1]) == broker]


def topic_id(leader: Connection, topic: str) -> uuid.UUID:
    body = {"topics": [{"name": topic}], "allow_auto_topic_creation": False}
    (found,) = leader.call(ApiKey.METADATA, METADATA_VERSION, body).topics
    assert found.error_code == 0, found
    return uuid.UUID(str(found.topic_id))


def log_end(leader: Connection, topic: str) -> int:
    """Partition 0's latest offset at the leader (its HW: every write here is acks=all)."""
    body = {
        "replica_id": -1,
        "isolation_level": 0,
        "topics": [{"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}],
    }
    answer = leader.call(ApiKey.LIST_OFFSETS, LIST_OFFSETS_VERSION, body)
    (partition,) = answer.topics[0].partitions
    assert partition.error_code == 0, partition
    return int(partition.offset)


def fetch_as(leader: Connection, follower: int, epoch: int, tid: uuid.UUID, at: int) -> None:
    """A follower's Fetch v15 of partition 0 from ``at``, saying ``follower`` and broker epoch
    ``epoch``; asserts the leader answered it without an error."""
    partition = {"partition": 0, "fetch_offset": at, "partition_max_bytes": 1 << 20}
    body = {
        "replica_state": {"replica_id": follower, "replica_epoch": epoch},
        "max_wait_ms": 0,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [{"topic_id": tid, "partitions": [partition]}],
        "forgotten_topics_data": [],
        "rack_id": "",
    }
    answer = leader.call(ApiKey.FETCH, FETCH_VERSION, body)
    assert answer.error_code == ErrorCode.NONE, answer
    (got,) = answer.responses[0].partitions
    assert got.error_code == ErrorCode.NONE, got
    assert got.high_watermark == at, f"the leader's HW {got.high_watermark}, fetched at {at}"


def ok(c: Cluster, topic: str, value: str) -> None:
    code, _ = rc.produce_one(c, topic, value)
    assert code is None, f"{value}: {rc.error_name(code)}\n{c.story()}"


@pytest.mark.slow
@rc.with_settings(
    controller={"broker_session_timeout_ms": 30_000}, broker={"replica_lag_time_max_ms": 2000}
)
def test_a_stale_incarnations_fetches_do_not_bring_its_broker_back_into_the_isr(
    replication_cluster: Cluster,
) -> None:
    c, topic = replication_cluster, "stale-incarnation"
    [view] = c.create_topic(topic, 1)
    leader, follower, other = view.replicas
    ok(c, topic, "first")

    (old, *_) = registered_epochs(c, follower)
    c.terminate(follower)  # a controlled shutdown: the next incarnation registers at once
    c.start(follower)
    new = rc.wait_for(
        f"{follower} to register again",
        lambda: next((e for e in registered_epochs(c, follower)[1:] if e != old), None),
        30,
    )
    c.wait_full_isr(topic)
    c.note(f"{follower} registered with epoch {old}, then {new}")

    c.pause(follower)
    try:
        without = tuple(sorted((leader, other)))
        c.wait_partitions(
            f"the ISR without the paused {follower}",
            topic,
            lambda v: v[0].isr == without,
            c.lag_s * 2 + 8,
            via=[leader, other],
        )
        assert follower in c.unfenced(leader), f"{follower} was fenced\n{c.story()}"
        ok(c, topic, "second")  # the log end moves past where the real follower stopped
        conn = Connection.connect(c.address(leader))  # the test, playing the follower
        try:
            tid, end = topic_id(conn, topic), log_end(conn, topic)
            deadline = time.monotonic() + STALE_FETCHING_S
            fetches = 0
            while time.monotonic() < deadline:
                fetch_as(conn, follower, old, tid, end)
                fetches += 1
                time.sleep(FETCH_EVERY_S)
            views = c.partitions(topic, [leader])
            assert views[0].isr == without, (
                f"after {fetches} fetches as {follower} at epoch {old} (registered: {new}), "
                f"the ISR is {views[0].isr}\n{c.story()}"
            )
            c.note(f"{fetches} fetches as {follower} at epoch {old}: the ISR stayed {without}")

            def joined() -> bool | None:
                fetch_as(conn, follower, new, tid, end)
                return True if c.partition(topic, 0, [leader]).isr == rc.BROKERS else None

            rc.wait_for(f"{follower} back in the ISR on fetches at epoch {new}", joined, 15)
            c.note(f"fetches as {follower} at epoch {new}: back in the ISR")
        finally:
            conn.close()
    finally:
        c.resume(follower)
    c.wait_full_isr(topic)
    ok(c, topic, "third")
    hws = c.wait_replicas_caught_up(topic, 1)
    problems = c.replica_disagreements(topic, 0, hws[0])
    assert not problems, f"{problems}\n{c.story()}"
