"""Followers fetch from their leaders on the inter-broker listener when the brokers name one
(Kafka's ``inter.broker.listener.name``): three real brokers, each with a Kafka listener
INTERNAL beside CLIENT. Clients use CLIENT; replication goes over INTERNAL only, and a
Metadata request on INTERNAL lists every broker's INTERNAL address."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fault_cluster as rc
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from raft.testing.processes import free_ports
from runnel.local_cluster import ClusterSpec

INTERNAL = "INTERNAL"
RECORDS = 300
IDLE_S = 2.0  # followers long-poll every replica_fetch_wait_max_ms (500 ms) meanwhile
_BY_LISTENER = re.compile(
    r'^runnel_kafka_requests_received_total\{listener="(\w+)".*\} (\S+)$', re.M
)


def add_internal_listener(spec: ClusterSpec, only: int | None = None) -> dict[int, int]:
    """Each broker's config (or broker ``only``'s) gains ``INTERNAL://127.0.0.1:<free
    port>`` and names it the inter-broker listener; returns broker id -> that port."""
    brokers = [n for n in spec.nodes() if n.role == "broker" and only in (None, n.node_id)]
    ports = dict(zip((n.node_id for n in brokers), free_ports(len(brokers)), strict=True))
    for node in brokers:
        path = spec.config_path(node.node_id)
        text, count = re.subn(
            r"^listeners = \[(.*)\]$",
            rf'listeners = [\1, "{INTERNAL}://127.0.0.1:{ports[node.node_id]}"]'
            f'\ninter_broker_listener_name = "{INTERNAL}"',
            path.read_text(),
            flags=re.M,
        )
        assert count == 1, path.read_text()
        path.write_text(text)
    return ports


def requests_by_listener(c: rc.Cluster, broker: int) -> dict[str, float]:
    text = c.metrics_text(broker)
    return {name: float(value) for name, value in _BY_LISTENER.findall(text)}


@pytest.fixture
def internal(tmp_path: Path) -> Iterator[tuple[rc.Cluster, dict[int, int]]]:
    ports: dict[int, int] = {}
    cluster = rc.start_cluster(
        tmp_path / "cluster", before_up=lambda spec: ports.update(add_internal_listener(spec))
    )
    try:
        yield cluster, ports
    finally:
        rc.stop_cluster(cluster)
        print(cluster.story())


@pytest.mark.slow
def test_followers_fetch_on_the_inter_broker_listener(
    internal: tuple[rc.Cluster, dict[int, int]],
) -> None:
    c, ports = internal
    topic = "internal-replication"
    views = c.create_topic(topic, len(rc.BROKERS))
    assert {v.leader for v in views} == set(rc.BROKERS), views  # each broker leads one
    producer = Producer({"bootstrap.servers": c.bootstrap, "acks": "all", "linger.ms": 5})
    report = rc.LoadReport()

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        report.acked[message.value().decode()] = (
            message.partition(),
            message.offset(),
            time.monotonic(),
        )

    for i in range(RECORDS):
        report.sent.append(value := f"record {i}")
        producer.produce(topic, value.encode(), partition=i % len(views), on_delivery=delivered)
    assert producer.flush(30) == 0 and len(report.acked) == RECORDS  # acks=all: replicated
    c.wait_full_isr(topic)

    before = {b: requests_by_listener(c, b) for b in rc.BROKERS}
    time.sleep(IDLE_S)
    after = {b: requests_by_listener(c, b) for b in rc.BROKERS}
    for broker in rc.BROKERS:
        assert set(after[broker]) == {"CLIENT", INTERNAL}, after[broker]
        assert after[broker][INTERNAL] > before[broker][INTERNAL], (broker, before, after)
        assert after[broker]["CLIENT"] == before[broker]["CLIENT"], (broker, before, after)

    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{ports[rc.BROKERS[0]]}"})
    listed = admin.list_topics(timeout=10).brokers
    assert {b.id: b.port for b in listed.values()} == ports
    final = rc.check_outcome(c, topic, len(views), [report])  # every replica agrees
    assert sum(len(records) for records in final.values()) == RECORDS


@pytest.mark.slow
def test_a_leader_without_the_inter_broker_listener_is_named_once(tmp_path: Path) -> None:
    """A misconfiguration: only broker 101 names INTERNAL. Following the other leaders it
    finds no INTERNAL listener to dial, and says so once per leader, naming the setting."""
    alone = rc.BROKERS[0]
    cluster = rc.start_cluster(
        tmp_path / "cluster", before_up=lambda spec: add_internal_listener(spec, alone)
    )
    try:
        views = cluster.create_topic("misconfigured", len(rc.BROKERS), min_insync=1)
        others = {v.leader for v in views} - {alone}
        assert others, views

        def said() -> list[str] | None:
            log = cluster.spec.log_path(alone).read_text().splitlines()
            return [line for line in log if "registered no listener INTERNAL" in line] or None

        rc.wait_for(
            "broker 101 to name the leaders it cannot dial",
            lambda: len(said() or []) >= len(others) or None,
            30,
        )
        time.sleep(2)  # fetches go on failing meanwhile: still one line per leader
        lines = said() or []
        named = sorted(
            int(m[1]) for line in lines if (m := re.search(r"broker (\d+) registered no", line))
        )
        assert named == sorted(others), lines
        assert all("inter_broker_listener_name" in line for line in lines), lines
    finally:
        rc.stop_cluster(cluster)
        print(cluster.story())
