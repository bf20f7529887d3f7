"""A compacted topic's replicas, compacted each by its own broker, on real processes: a
follower is killed while the leader goes on taking overwrites of the same keys and compacts
them; it comes back with a broker config whose maintenance pass will not come again during
the test, so its replica stays compacted only as far as its own first pass (at start-up)
took it, while the leader's dropped the records the later overwrites replaced. Below the
leader's ``compacted_below`` the replicas' batches then differ, and that is no divergence:
``runnel replicas verify`` compares them there by offsets and leader epochs only and byte
for byte above it (exit 0), every replica's records give the same table of latest values
per key as the producer's, and so does a consumer.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import fault_cluster as rc
from test_local_cluster import runnel

from runnel.segment_reader import find_segments
from storage.checkpoint import OffsetCheckpointFile
from storage.log_manager import CLEANER_CHECKPOINT
from storage.records import iter_decoded
from storage.topic_partition import TopicPartition

replication_cluster = rc.replication_cluster
TOPIC = "table"
KEYS = 50
PER_ROUND = 500
SEGMENT_MS = 1000  # rounds a little further apart than this each start a segment
WAIT_S = 60.0
MAINTENANCE_MS = 300
NEVER_MS = 600_000


def produce_round(c: rc.Cluster, round_number: int, table: dict[str, str]) -> None:
    """``PER_ROUND`` keyed records over ``KEYS`` keys with acks=all, every one acknowledged;
    ``table`` gets each key's latest value."""
    errors: list[str] = []
    producer = c.acks_all_producer()
    for i in range(PER_ROUND):
        key, value = f"k{i % KEYS:03d}", f"round {round_number} record {i} " + "x" * 80
        producer.produce(
            TOPIC,
            value.encode(),
            key.encode(),
            partition=0,
            on_delivery=lambda e, m: errors.append(f"{m.key()!r}: {e}") if e else None,
        )
        table[key] = value
    left = producer.flush(WAIT_S)
    assert left == 0 and not errors, (left, errors[:5], c.story())


def compacted_below(c: rc.Cluster, broker: int) -> int:
    """The broker's cleaner checkpoint for the partition (0: none written)."""
    path = c.spec.node_dir(broker) / "data" / CLEANER_CHECKPOINT
    return OffsetCheckpointFile(path).read().get(TopicPartition(TOPIC, 0), 0)


def replica_table(c: rc.Cluster, broker: int, below: int) -> dict[str, str]:
    """The latest value per key among the replica's records below ``below``, read from its
    segment files in offset order."""
    table: dict[str, str] = {}
    for segment in find_segments(c.partition_dir(broker, TOPIC, 0)):
        for batch in iter_decoded(Path(segment.path).read_bytes()):
            for record in batch.records:
                if record.offset < below and record.key is not None and record.value is not None:
                    table[record.key.decode()] = record.value.decode()
    return table


def never_maintain(c: rc.Cluster, broker: int) -> None:
    """The broker's next start runs one maintenance pass (at start-up) and then none."""
    path = c.spec.config_path(broker)
    text = path.read_text()
    line = f"log_maintenance_interval_ms = {MAINTENANCE_MS}"
    assert line in text, text
    path.write_text(text.replace(line, f"log_maintenance_interval_ms = {NEVER_MS}"))


def verified(c: rc.Cluster, hw: int) -> dict[str, Any] | None:
    """``runnel replicas verify --json`` of the topic, which must pass (exit 0) every time;
    its partition once the comparison reaches ``hw`` (a follower learns the last high
    watermark with its next fetch), else None."""
    done = runnel(
        "replicas", "verify", "--topic", TOPIC, "--json", "--data-dir", str(c.spec.data_dir)
    )
    assert done.returncode == 0, done.stdout + done.stderr + c.story()
    (partition,) = json.loads(done.stdout)["partitions"]
    found: dict[str, Any] = partition
    return found if found["end_offset"] == hw else None


@rc.with_settings(broker={"log_maintenance_interval_ms": MAINTENANCE_MS})
def test_replicas_compacted_on_their_own_are_not_a_divergence(replication_cluster: Any) -> None:
    c = replication_cluster
    configs = {
        "cleanup.policy": "compact",
        "segment.ms": str(SEGMENT_MS),
        "min.cleanable.dirty.ratio": "0.01",
    }
    [view] = c.create_topic(TOPIC, 1, configs=configs)
    table: dict[str, str] = {}
    for r in range(2):
        produce_round(c, r, table)
        time.sleep(SEGMENT_MS * 1.2 / 1000)
    follower = next(b for b in view.replicas if b != view.leader)
    c.kill(follower)
    c.note(f"follower {follower} killed")
    stopped_at = c.log_ends(TOPIC, 0)[follower]
    for r in range(2, 6):
        produce_round(c, r, table)
        time.sleep(SEGMENT_MS * 1.2 / 1000)
    leader = c.partition(TOPIC, 0).leader
    reached = rc.wait_for(
        f"leader {leader} to compact beyond offset {stopped_at}",
        lambda: compacted_below(c, leader) if compacted_below(c, leader) > stopped_at else None,
        WAIT_S,
    )
    c.note(
        f"leader {leader} compacted below {reached}; follower {follower} stopped at {stopped_at}"
    )

    never_maintain(c, follower)
    c.start(follower)
    c.wait_full_isr(TOPIC, WAIT_S)
    produce_round(c, 6, table)
    hw = c.wait_replicas_caught_up(TOPIC, 1, WAIT_S)[0]

    # The scenario holds what it is about: below the leader's point the replicas differ.
    assert c.replica_disagreements(TOPIC, 0, hw), c.story()
    partition = rc.wait_for(
        f"replicas verify to compare {TOPIC}-0 up to {hw}", lambda: verified(c, hw), WAIT_S, 0.5
    )
    assert partition["start_offset"] == 0, partition
    assert partition["compacted_below"] >= reached, (partition, c.story())
    assert partition["batches_compared"] > 0, partition
    assert partition["replicas_read"] == 3, partition
    for broker in rc.BROKERS:
        assert replica_table(c, broker, hw) == table, (broker, c.story())
    read = c.read_all(TOPIC, 1)[0]
    consumed: dict[str, str] = {}
    for _, value in read:
        consumed[f"k{int(value.split()[3]) % KEYS:03d}"] = value
    assert consumed == table, c.story()
