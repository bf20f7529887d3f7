"""``runnel replicas verify`` without ``--topic`` checks every topic of a real cluster
(``fault_cluster.py``: 1 controller, 3 brokers): a topic with replication factor 3 and one
with replication factor 1, both given acks=all records in several flushes (several batches
per partition). Every partition of both topics is compared, up to its last record, and
found in agreement (exit 0). Then one broker is killed: every partition with a replica on it
is reported NOT CHECKED, the others still ok, and the command exits 1.

(``--topic`` on the shared two-broker cluster: tests/broker/test_replica_read_cluster.py.)
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import fault_cluster as rc
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic
from test_local_cluster import runnel

replication_cluster = rc.replication_cluster

PARTITIONS = 2
ROUNDS, RECORDS_PER_ROUND = 4, 5  # per partition; a flush after each round
RECORDS = ROUNDS * RECORDS_PER_ROUND  # per partition
WAIT_S = 30.0
TOPICS = {"verify-all-rf3": 3, "verify-all-rf1": 1}  # name: replication factor


def verify(c: rc.Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """``runnel replicas verify`` of every topic (no ``--topic``)."""
    return runnel("replicas", "verify", *args, "--data-dir", str(c.spec.data_dir))


def create_rf1_topic(c: rc.Cluster, name: str) -> None:
    admin = c.admin()  # it must outlive the future
    new = NewTopic(name, num_partitions=PARTITIONS, replication_factor=1)
    admin.create_topics([new], operation_timeout=20)[name].result(timeout=WAIT_S)
    c.wait_partitions(
        f"{name}: a leader for every partition", name, lambda v: all(p.leader > 0 for p in v), 30
    )


def produce(c: rc.Cluster) -> None:
    producer = Producer(
        {"bootstrap.servers": c.bootstrap, "acks": "all", "linger.ms": 0, "logger": rc.NULL_LOGGER}
    )
    failed: list[Any] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failed.append(error)

    for r in range(ROUNDS):
        for topic in TOPICS:
            for partition in range(PARTITIONS):
                for i in range(RECORDS_PER_ROUND):
                    value = f"{topic} round {r} record {i} of partition {partition}".encode()
                    producer.produce(topic, value, partition=partition, on_delivery=delivered)
        assert producer.flush(WAIT_S) == 0
    assert not failed, failed


def compared_to_the_end(c: rc.Cluster) -> dict[str, Any]:
    """verify --json, until every partition's replicas are compared up to its last record
    (a follower learns the last high watermark with its next fetch); each run must pass."""

    def probe() -> dict[str, Any] | None:
        done = verify(c, "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        report: dict[str, Any] = json.loads(done.stdout)
        ends = [(p["start_offset"], p["end_offset"]) for p in report["partitions"]]
        return report if all(end == (0, RECORDS) for end in ends) else None

    return rc.wait_for("verify to compare every record of every partition", probe, WAIT_S, 0.5)


def text_report(done: subprocess.CompletedProcess[str]) -> tuple[dict[str, str], list[str], str]:
    """verify's text: {"topic-partition": its line}, the indented lines, the summary."""
    *lines, summary = done.stdout.splitlines()
    heads = {line.split(": ")[0]: line for line in lines if not line.startswith("  ")}
    return heads, [line for line in lines if line.startswith("  ")], summary


@pytest.mark.slow
def test_verify_without_a_topic_checks_every_topic(replication_cluster: rc.Cluster) -> None:
    c = replication_cluster
    rf3, rf1 = TOPICS
    c.create_topic(rf3, PARTITIONS)
    create_rf1_topic(c, rf1)
    produce(c)

    report = compared_to_the_end(c)
    partitions = {f"{p['topic']}-{p['partition']}": p for p in report["partitions"]}
    assert sorted(partitions) == sorted(f"{t}-{p}" for t in TOPICS for p in range(PARTITIONS))
    for p in partitions.values():
        assert len(p["replicas"]) == TOPICS[p["topic"]] and p["ok"] and not p["divergences"], p
        assert p["replicas_read"] == TOPICS[p["topic"]], p
        if p["replicas_read"] > 1:  # a flush per round: a batch each at least
            assert p["batches_compared"] >= ROUNDS, p
        else:  # a single replica: nothing compared
            assert p["batches_compared"] == 0, p

    done = verify(c)
    assert done.returncode == 0, done.stdout + done.stderr
    heads, details, summary = text_report(done)
    assert sorted(heads) == sorted(partitions) and details == [], done.stdout
    for name, p in partitions.items():
        compared = f"offsets [0, {RECORDS}), {p['batches_compared']} batches compared"
        if p["replicas_read"] == 1:
            compared = "only one replica: nothing to compare"
        assert heads[name].startswith(f"{name}: ok: replicas ") and compared in heads[name]
    total = report["batches_compared"]
    checked = f"{len(partitions)} partitions checked"
    alone = f"{PARTITIONS} with only one replica, nothing to compare"
    assert summary == f"{checked}, {total} batches compared: all replicas agree; {alone}"

    # A broker that is gone: its replicas cannot be read, so nothing is known of them.
    victim = partitions[f"{rf1}-0"]["replicas"][0]
    c.kill(victim)
    done = verify(c)
    assert done.returncode == 1, done.stdout + done.stderr
    heads, details, summary = text_report(done)
    with_victim = [name for name, p in partitions.items() if victim in p["replicas"]]
    for name in partitions:
        status = "NOT CHECKED" if name in with_victim else "ok"
        assert heads[name].startswith(f"{name}: {status}: replicas "), done.stdout
    assert len(details) == len(with_victim), done.stdout
    assert all(line.startswith(f"  replica {victim} not checked: ") for line in details)
    alone = [n for n, p in partitions.items() if p["replicas_read"] == 1 and n not in with_victim]
    tail = f"{len(with_victim)} with replicas not checked"
    tail += f"; {len(alone)} with only one replica, nothing to compare" if alone else ""
    assert summary.endswith(f": {tail}"), summary
