"""One record batch bigger than a follower's whole Fetch records limit still replicates, on
real processes (1 controller, 3 brokers: ``fault_cluster.py``).

A leader answers a follower's Fetch with the first partition's first batch whole, however
big (KIP-74), so the follower's connection must take an answer that large. With the
default fetch limits (``replica_fetch_max_bytes`` 1 MiB per partition,
``replica_fetch_response_max_bytes`` 10 MiB per fetch) the fetcher used to take at most the
records' limit and 1 MiB: one batch of ~12 MiB then failed every fetch from that leader
for good (the same request again after each reconnection), and an acks=all write of it
never committed. ``tests/broker/test_replica_fetcher_connection.py`` checks the limit
against a scripted leader; here the brokers are real and only the topic's
``max.message.bytes`` is raised (the brokers keep every default fetch and request limit:
``socket_request_max_bytes`` is 100 MiB).

One topic of one partition, replication factor 3, min.insync.replicas 2. A confluent-kafka
producer (acks=all, no retries) writes one ~12 MiB record, alone in its batch, and then a
small one: both must be acknowledged, every replica must hold both batches on disk, equal
below the high watermark, and ``runnel replicas verify`` must compare both batches on all
three replicas (it compares below the smallest high watermark, so a stuck follower would
narrow its range rather than fail it).
"""

from __future__ import annotations

import json
import os
from typing import Any

import fault_cluster as rc
import pytest
from confluent_kafka import KafkaError, Producer
from test_local_cluster import runnel

replication_cluster = rc.replication_cluster
Cluster = rc.Cluster

MIB = 1 << 20
BIG_VALUE_BYTES = 12 * MIB  # over the default records limit (10 MiB) plus the old 1 MiB slack
TOPIC_MAX_MESSAGE_BYTES = 16 * MIB  # the topic's max.message.bytes: room for the big batch
OLD_RESPONSE_LIMIT_BYTES = 10 * MIB + MIB  # the default records limit and the old slack
CLIENT_MAX_BYTES = 32 * MIB  # the producer's request and batch limits, beyond the big record
DELIVERY_TIMEOUT_S = 60  # each produce's delivery report (the flush waits 10 s more)
VERIFY_TIMEOUT_S = 30  # the followers to learn the high watermark (their next fetch)


def produce_one(c: Cluster, topic: str, value: bytes) -> int:
    """One acks=all record to partition 0, alone in its batch and not retried: its offset;
    AssertionError with the error otherwise."""
    producer = Producer(
        {
            "bootstrap.servers": c.bootstrap,
            "acks": "all",
            "enable.idempotence": False,
            "retries": 0,
            "linger.ms": 0,
            "compression.type": "none",
            "message.max.bytes": CLIENT_MAX_BYTES,
            "batch.size": CLIENT_MAX_BYTES,
            "request.timeout.ms": 30_000,  # the broker's acks=all wait (the Produce timeout)
            "message.timeout.ms": DELIVERY_TIMEOUT_S * 1000,
            "logger": rc.NULL_LOGGER,
        }
    )
    outcome: list[tuple[KafkaError | None, int]] = []

    def delivered(error: KafkaError | None, message: Any) -> None:
        outcome.append((error, message.offset()))

    producer.produce(topic, value, partition=0, on_delivery=delivered)
    left = producer.flush(DELIVERY_TIMEOUT_S + 10)
    assert left == 0 and len(outcome) == 1, f"no delivery report for {len(value)} bytes"
    error, offset = outcome[0]
    what = "acknowledged at " + str(offset) if error is None else f"failed: {error}"
    c.note(f"a {len(value)}-byte record {what}")
    assert error is None, f"the {len(value)}-byte record: {error}\n{c.story()}"
    return int(offset)


def verified(c: Cluster, topic: str) -> dict[str, Any] | None:
    """``runnel replicas verify --json`` for the topic once it compares both batches on
    every replica, or as soon as it finds a divergence (None until then)."""
    done = runnel(
        "replicas", "verify", "--topic", topic, "--json", "--data-dir", str(c.spec.data_dir)
    )
    try:
        report: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        c.note(f"replicas verify: exit {done.returncode}: {done.stdout}{done.stderr}")
        return None
    diverged = any(p["divergences"] for p in report["partitions"])
    return report if diverged or report["batches_compared"] == 2 else None


def batch_sizes(c: Cluster, broker: int, topic: str) -> dict[int, int]:
    """Base offset -> size of each batch of the broker's replica of partition 0, as
    ``runnel log dump`` reads them from disk."""
    done = runnel("log", "dump", str(c.partition_dir(broker, topic, 0)), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    batches = [json.loads(line) for line in done.stdout.splitlines()]
    return {b["base_offset"]: b["size_bytes"] for b in batches}


@pytest.mark.slow
def test_a_batch_over_the_followers_fetch_limit_is_replicated_and_replication_goes_on(
    replication_cluster: Cluster,
) -> None:
    c, topic = replication_cluster, "big-batch"
    c.create_topic(topic, 1, configs={"max.message.bytes": str(TOPIC_MAX_MESSAGE_BYTES)})
    big = os.urandom(BIG_VALUE_BYTES)  # incompressible, and a CRC that tells copies apart
    assert produce_one(c, topic, big) == 0
    assert produce_one(c, topic, b"after the big batch") == 1

    views = c.wait_full_isr(topic)
    assert views[0].isr == rc.BROKERS, views
    hws = c.wait_replicas_caught_up(topic, 1)
    assert hws == {0: 2}, hws
    problems = c.replica_disagreements(topic, 0, 2)
    assert not problems, "\n".join(problems) + f"\n{c.story()}"
    for broker in rc.BROKERS:
        sizes = batch_sizes(c, broker, topic)
        assert list(sizes) == [0, 1] and sizes[0] > OLD_RESPONSE_LIMIT_BYTES, (broker, sizes)

    report = rc.wait_for(
        "replicas verify to compare both batches", lambda: verified(c, topic), VERIFY_TIMEOUT_S
    )
    [partition] = report["partitions"]
    assert report["ok"] and partition["divergences"] == [], report
    assert partition["not_checked"] == [] and sorted(partition["replicas"]) == list(rc.BROKERS)
    assert (partition["start_offset"], partition["end_offset"]) == (0, 2), report
