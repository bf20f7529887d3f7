"""DeleteRecords inside a batch, with a replica far behind it, on real processes.

A follower is killed and fenced out of the ISR; the others take more records; DeleteRecords
moves the log start to an offset inside one of the batches the follower never had (the
answer does not wait for a fenced replica). Started again, the follower's fetch is below the
leader's log start: it restarts its log there, empty, and the leader's next answer begins
with the batch holding that offset, from an earlier base offset. The follower must start its
log at that base and catch up (as Kafka's does); before it did, it refused the batch at every
fetch and never came back into the ISR. Then every replica holds the same batches from that
one on, ``runnel replicas verify`` agrees, and a consumer reads from the new log start.
"""

from __future__ import annotations

from typing import Any

import fault_cluster as rc
from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from test_local_cluster import runnel

replication_cluster = rc.replication_cluster
TOPIC = "purged"
WAIT_S = 60.0


def produce(c: rc.Cluster, count: int, label: str) -> None:
    """``count`` records with acks=all, every one acknowledged."""
    errors: list[str] = []
    producer = c.acks_all_producer()
    for i in range(count):
        producer.produce(
            TOPIC,
            f"{label} {i} ".encode() * 10,
            partition=0,
            on_delivery=lambda e, m: errors.append(str(e)) if e else None,
        )
    left = producer.flush(WAIT_S)
    assert left == 0 and not errors, (left, errors[:5], c.story())


def first_offset_read(c: rc.Cluster) -> int:
    consumer = c.consumer()
    try:
        consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
        message = rc.wait_for("a record from the beginning", lambda: consumer.poll(0.5), WAIT_S)
        assert message.error() is None, message.error()
        return int(message.offset())
    finally:
        c.close_consumer(consumer, "first_offset_read")


def test_a_follower_behind_a_deletion_inside_a_batch_catches_up(replication_cluster: Any) -> None:
    c = replication_cluster
    [view] = c.create_topic(TOPIC, 1)
    produce(c, 20, "before")
    follower = next(b for b in view.replicas if b != view.leader)
    c.kill(follower)
    others = [b for b in rc.BROKERS if b != follower]
    c.wait_partitions(
        f"{follower} out of the ISR", TOPIC, lambda v: follower not in v[0].isr, WAIT_S, via=others
    )
    stopped_at = c.log_ends(TOPIC, 0)[follower]
    produce(c, 300, "after")
    leader = c.partition(TOPIC, 0, via=others).leader
    inside = next(
        b
        for b in c.stored_batches(leader, TOPIC, 0)
        if b.base_offset >= stopped_at and b.last_offset > b.base_offset
    )
    start = inside.base_offset + 1  # inside a batch the follower never had
    c.note(f"follower {follower} stopped at {stopped_at}; deleting below {start} ({inside})")
    admin = c.admin(via=others)  # it must outlive the future
    asked = TopicPartition(TOPIC, 0, start)
    done = admin.delete_records([asked], operation_timeout=30)[asked].result(WAIT_S)
    assert done.low_watermark == start, (done.low_watermark, c.story())

    c.start(follower)
    c.wait_full_isr(TOPIC, WAIT_S)
    c.wait_replicas_caught_up(TOPIC, 1, WAIT_S)
    held = {b: c.stored_batches(b, TOPIC, 0) for b in rc.BROKERS}
    assert held[follower][0].base_offset == inside.base_offset, (held[follower][:2], c.story())
    from_inside = {
        b: [x for x in batches if x.base_offset >= inside.base_offset]
        for b, batches in held.items()
    }
    assert from_inside[follower] == from_inside[leader], c.story()
    verify = runnel("replicas", "verify", "--topic", TOPIC, "--data-dir", str(c.spec.data_dir))
    assert verify.returncode == 0, verify.stdout + verify.stderr + c.story()
    assert first_offset_read(c) == start
