"""A topic deleted and created again under its name while one of its replicas' brokers is
away (Kafka's KIP-516 case), on real processes: when that broker comes back, its log of the
old topic (same directory name, ``name-0``) must not be taken for the new topic's. The old
log holds more records than the new topic has, at the same leader epoch 0 and in batches of
the same 100 records, so a follower that kept it would be told to truncate to the end of the
new leader's epoch 0, a batch boundary of its own log, and would keep old records below the
new high watermark. The broker knows it from ``partition.metadata`` (the old topic id):

- paused (SIGSTOP) and resumed: the metadata it catches up on shows the topic deleted (the
  log goes) and created again, or at once under a new id (the log is replaced);
- killed and started again: the first image it applies finds the log a stray, and it is
  deleted before the new replica is made.

Either way the replicas then agree, batch for batch, and a consumer reads the new records
only. The session timeout is long (15 s) so that the away broker is still registered and
unfenced when the topic is created again, and gets one of its replicas (three replicas on
three brokers).
"""

from __future__ import annotations

from typing import Any

import fault_cluster as rc
import pytest
from confluent_kafka.admin import NewTopic

from broker.replica_manager import read_partition_metadata

replication_cluster = rc.replication_cluster
TOPIC = "reborn"
SESSION_MS = 15_000
# No preferred-leader rebalancing: the away broker is the new topic's first replica, and a
# rebalance moving leadership to it while "after" is produced failed that acks=all write on
# the old leader after its append, and the (not idempotent) producer's retry appended it
# again on the new one (HW 300, not 200; seen once, 2026-11-25): Kafka's at-least-once, not
# what this test looks at.
LONG_SESSION = rc.with_settings(
    controller={"broker_session_timeout_ms": SESSION_MS, "auto_leader_rebalance_enable": "false"}
)


def produce(c: Any, values: list[str], per_batch: int = 100) -> None:
    """acks=all to partition 0, in order, ``per_batch`` values at a time (a flush each: a
    batch each); every value must be acknowledged."""
    errors: list[str] = []
    producer = c.acks_all_producer()
    for start in range(0, len(values), per_batch):
        for value in values[start : start + per_batch]:
            producer.produce(
                TOPIC,
                value.encode(),
                partition=0,
                on_delivery=lambda e, m: errors.append(f"{m.value()!r}: {e}") if e else None,
            )
        left = producer.flush(40)
        assert left == 0 and not errors, (left, errors[:5], c.story())


def topic_id(c: Any, broker: int) -> bytes:
    """The topic id in the broker's ``partition.metadata`` of partition 0."""
    found = read_partition_metadata(c.partition_dir(broker, TOPIC, 0))
    assert found is not None, c.story()
    return found


def delete_topic(c: Any, via: list[int]) -> None:
    admin = c.admin(via)  # it must outlive the future
    admin.delete_topics([TOPIC], operation_timeout=20)[TOPIC].result(timeout=30)
    rc.wait_for(
        f"{TOPIC} gone from the metadata of {via}",
        lambda: True if all(TOPIC not in c.metadata(b).topics for b in via) else None,
        20,
    )


def create_topic(c: Any, via: list[int]) -> None:
    config = {"min.insync.replicas": "2"}
    new = NewTopic(TOPIC, num_partitions=1, replication_factor=3, config=config)
    admin = c.admin(via)
    admin.create_topics([new], operation_timeout=20)[TOPIC].result(timeout=30)


@pytest.mark.slow
@pytest.mark.parametrize("away", ["paused", "killed"])
@LONG_SESSION
def test_a_broker_away_while_its_topic_is_deleted_and_created_again_keeps_no_old_record(
    replication_cluster: Any, away: str
) -> None:
    c = replication_cluster
    [view] = c.create_topic(TOPIC, 1)
    old_values = [f"old-{i}" for i in range(600)]
    produce(c, old_values)
    c.wait_replicas_caught_up(TOPIC, 1)
    gone = next(b for b in view.replicas if b != view.leader)
    others = [b for b in rc.BROKERS if b != gone]
    old_id = topic_id(c, gone)
    log_position = c.log_size(gone)

    if away == "paused":
        c.pause(gone)
    else:
        c.kill(gone)
    c.note(f"broker {gone} {away}, holding {len(old_values)} records of topic id {old_id.hex()}")
    delete_topic(c, others)
    create_topic(c, others)  # before the session ends: `gone` is still a live broker
    views = c.wait_partitions(
        f"{TOPIC} created again on all three brokers, led by one of {others}",
        TOPIC,
        lambda v: v[0].leader in others and set(v[0].replicas) == set(rc.BROKERS),
        20,
        via=others,
    )
    new_id = topic_id(c, views[0].leader)
    assert new_id != old_id, (new_id, old_id)
    c.note(f"{TOPIC} created again: topic id {new_id.hex()}, replicas {views[0].replicas}")
    before = [f"new-{i}" for i in range(100)]  # fewer than the old topic had
    produce(c, before)  # acknowledged by the other two once `gone` leaves the ISR

    if away == "paused":
        c.resume(gone)
    else:
        c.start(gone)
    c.wait_full_isr(TOPIC, 60)
    after = [f"after-{i}" for i in range(100)]
    produce(c, after)
    hws = c.wait_replicas_caught_up(TOPIC, 1, 60)
    assert hws[0] == len(before) + len(after), (hws, c.story())
    disagreements = c.replica_disagreements(TOPIC, 0, hws[0])
    assert not disagreements, "\n".join(disagreements) + c.story()
    values = [value for _, value in c.read_all(TOPIC, 1)[0]]
    assert values == [*before, *after], (values[:5], c.story())

    assert topic_id(c, gone) == new_id
    said = "\n".join(c.log_since(gone, log_position))
    if away == "killed":  # the first image after the restart finds the old log a stray
        assert "deleting stray log" in said, c.log_excerpt(gone)
    else:  # the deletion and the creation in one image, or in two
        assert "deleted and created again" in said or f"deleted {TOPIC}-0" in said, said
