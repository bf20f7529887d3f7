"""A leader that loses power, on real processes: 1 controller and 3 brokers (``fault_cluster``),
replication factor 3, min.insync.replicas 2, confluent-kafka producing unique values with
acks=all.

A power loss is a kill -9 whose page cache goes too. After the kill the test applies to the
broker's partition logs what a power loss may do (replication/testing/power_loss.py, the
model the replication simulation uses): above each log's checkpointed recovery point,
segments are cut at random bytes, some followed by zeros, and the newest segment files may
vanish. The checkpoints (HW, recovery point, leader epochs) were written with fsync and
stay, so the broker restarts with a HW checkpoint above what its logs still hold. Kafka
promises acks=all records while one in-sync replica keeps its page cache, and here the two
others do: nothing acknowledged may be lost, and the broker must come back into the ISR.
The losses are drawn from a seed the timeline prints; ``POWER_LOSS_SEED=N`` replays one.
"""

from __future__ import annotations

import os
import random
import time

import fault_cluster as rc
import pytest

from replication.testing.power_loss import lose_page_cache
from storage.checkpoint import OffsetCheckpointFile
from storage.log_manager import RECOVERY_POINT_CHECKPOINT
from storage.topic_partition import TopicPartition

replication_cluster = rc.replication_cluster
Cluster = rc.Cluster
PARTITIONS = 3


def lose_power(c: Cluster, broker: int, topic: str, rng: random.Random) -> list[str]:
    """kill -9 the broker, then lose what its page cache held of the topic's logs; returns
    what changed."""
    c.kill(broker)
    data_dir = c.spec.node_dir(broker) / "data"
    flushed = OffsetCheckpointFile(data_dir / RECOVERY_POINT_CHECKPOINT).read()
    changes = []
    for partition in range(PARTITIONS):
        tp = TopicPartition(topic, partition)
        recovery_point = flushed.get(tp, 0)
        lost = lose_page_cache(data_dir / tp.dir_name(), recovery_point, rng)
        changes += [f"p{partition} above {recovery_point}: {change}" for change in lost]
    c.note(f"broker {broker} lost power: {changes}")
    return changes


@pytest.mark.slow
@rc.with_settings(log={"segment_bytes": 32_768})
def test_leaders_that_lose_power_in_turn_lose_no_acknowledged_record(
    replication_cluster: Cluster,
) -> None:
    """Twice: the leader of partition 0 loses power; a new leader takes writes; the broker
    restarts on what survived, truncates, fetches and rejoins the ISR."""
    c, topic = replication_cluster, "power-loss"
    seed = int(os.environ.get("POWER_LOSS_SEED", random.randrange(2**32)))
    c.note(f"power-loss seed {seed} (replay: POWER_LOSS_SEED={seed})")
    rng = random.Random(seed)
    c.create_topic(topic, PARTITIONS)
    load = rc.Continuous(c.bootstrap, topic, PARTITIONS, "power", rc.ONCE)
    changed = []
    with rc.Tail(c, topic, PARTITIONS) as tail, load:
        rc.wait_acks(c, load, 0, 0, 300, "acks before any fault")
        for round_ in (1, 2):
            victim = c.partition(topic, 0).leader
            changed.append(lose_power(c, victim, topic, rng))
            lost_at = time.monotonic()
            new = rc.wait_new_leader(c, topic, 0, victim, c.session_s + 15)
            rc.wait_acks(c, load, lost_at, 0, 100, f"round {round_}: acks from new leader {new}")
            c.start(victim)
            c.wait_full_isr(topic)
            rc.wait_acks(c, load, time.monotonic(), 0, 100, f"round {round_}: acks after restart")
    load.stop()
    tail.stop()
    c.note(f"stopped: {load.report.summary()}; consumer saw {len(tail.seen)} {dict(tail.errors)}")
    assert load.unflushed == 0, load.report.summary()
    assert all(changed), f"a power loss took nothing (seed {seed}): {changed}\n{c.story()}"
    rc.check_outcome(c, topic, PARTITIONS, [load.report], tail=tail)
    assert len(tail.seen) > 0 and len(load.report.acked) > 600, load.report.summary()
