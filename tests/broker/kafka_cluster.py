"""What the Kafka-client tests share: one local cluster (1 controller, 2 brokers), the records
they produce, how they compare what came back, and how they read what the brokers stored.

The cluster is started by ``runnel cluster up --once`` the first time a test asks for the
``kafka`` fixture and stopped at the end of the session, so each pytest process (each xdist
worker) runs one cluster of its own, on ports of its own. Importing the fixture into several
test modules makes several session fixtures, so the cluster itself is kept in this module and
the first one to finish stops it. Whatever ``cluster down`` leaves running is kill -9'd,
found by its pid file. Every test uses topics of its own; the two brokers lead alternate
partitions, so the clients must route each request to the right one.

Records (:class:`Sent`) carry a key on even indexes only, several headers (a binary value,
a repeated key, or none at all) and an explicit timestamp, so a client that drops or mangles
any of them is caught. Values repeat their text so that every codec really shrinks a batch
(librdkafka sends a batch uncompressed when compressing would not shrink it).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pytest
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from test_local_cluster import Cluster, free_base_port, runnel, wait_for

from runnel.local_cluster import process_alive

__all__ = [
    "BROKER_IDS",
    "PARTITIONS",
    "Batch",
    "KafkaCluster",
    "RecordMaker",
    "Sent",
    "Stored",
    "WAIT_S",
    "advertised_versions",
    "assert_offsets_follow_produce_order",
    "assert_same_records",
    "assert_stored_codecs",
    "broker_metadata",
    "by_partition",
    "create_topic",
    "first_offsets_at_or_after",
    "kafka",
    "normal_headers",
    "records_at_or_after",
    "stored_batches",
    "wait_until_listed",
]

BROKER_IDS = (101, 102)
PARTITIONS = 3  # leaders alternate between the brokers: 101, 102, 101 or 102, 101, 102
WAIT_S = 30.0  # the bound on any one wait for records, deliveries or metadata
FIND_COORDINATOR = 10  # Kafka API keys, for reading the ApiVersions table
PRODUCE = 0


@dataclass(frozen=True, slots=True)
class KafkaCluster:
    data_dir: Path
    bootstrap: str  # every broker's client listener, host:port,host:port

    def partition_dir(self, topic: str, partition: int) -> Path:
        """The leader's directory of a replication-factor-1 partition."""
        found = list(self.data_dir.glob(f"node-*/data/{topic}-{partition}"))
        assert len(found) == 1, f"{topic}-{partition}: expected one replica dir, found {found}"
        return found[0]


_running: list[Cluster] = []  # at most one: this process's cluster while it runs
_bootstrap: list[str] = []


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    if not _running:
        _start(tmp_path_factory.mktemp("kafka-cluster"))
    yield KafkaCluster(_running[0].data_dir, _bootstrap[0])
    if _running:
        _stop(_running.pop())


def _start(data_dir: Path) -> None:
    cluster = Cluster(data_dir / "cluster", free_base_port(3))
    _running.append(cluster)
    try:
        bootstrap = cluster.up_two_brokers()  # serving at once: test_kafka_clients.py checks
    except BaseException:
        _stop(_running.pop())
        raise
    _bootstrap[:] = [bootstrap]


def _stop(cluster: Cluster) -> None:
    try:
        cluster.run("cluster", "down")
    finally:  # whatever is left: kill -9, found by pid file
        for pid in cluster.pids():
            if process_alive(pid, str(cluster.data_dir)) or process_alive(pid, "cluster\0up"):
                os.kill(pid, signal.SIGKILL)


# -- records -----------------------------------------------------------------------------------

Headers = tuple[tuple[str, bytes | None], ...]


class Sent(NamedTuple):
    key: bytes | None
    value: bytes
    headers: Headers
    timestamp_ms: int


class Stored(NamedTuple):
    partition: int
    offset: int
    record: Sent


class RecordMaker:
    """Records with strictly increasing timestamps (from ten minutes ago, one ms apart), so
    that within each partition timestamps grow with offsets whatever the partitioner does."""

    def __init__(self) -> None:
        self.next_ms = int(time.time() * 1000) - 600_000

    def make(self, label: str, count: int) -> list[Sent]:
        out = []
        for i in range(count):
            headers: Headers = (("label", label.encode()), ("index", str(i).encode()))
            if i % 3 == 0:
                headers += (("binary", b"\x00\xff\x80"),)
            if i % 5 == 0:
                headers += (("twice", b"1"), ("twice", b"2"))
            if i % 7 == 6:
                headers = ()
            key = f"key-{i % 3}".encode() if i % 2 == 0 else None
            value = (f"{label} record {i:04d}; " * 8).encode()
            out.append(Sent(key, value, headers, self.next_ms))
            self.next_ms += 1
        return out


def normal_headers(headers: Iterable[tuple[str, bytes | None]] | None) -> Headers:
    """Headers as each client's consumer gives them (None, a list or a tuple) -> a tuple."""
    return tuple((k, v) for k, v in headers or ())


def by_partition(records: Iterable[Stored]) -> dict[int, list[Stored]]:
    """Records grouped by partition, in the order given."""
    out: dict[int, list[Stored]] = {}
    for r in records:
        out.setdefault(r.partition, []).append(r)
    return out


def assert_offsets_follow_produce_order(delivered: list[Stored]) -> None:
    """``delivered`` is in produce order, for a topic nobody else writes: each partition's
    offsets must be 0, 1, 2, ... in that order, and each key must stay in one partition."""
    for partition, records in by_partition(delivered).items():
        offsets = [r.offset for r in records]
        assert offsets == list(range(len(records))), f"partition {partition}: {offsets}"
    partitions_of_key: dict[bytes, set[int]] = {}
    for r in delivered:
        if r.record.key is not None:
            partitions_of_key.setdefault(r.record.key, set()).add(r.partition)
    assert all(len(p) == 1 for p in partitions_of_key.values()), partitions_of_key


def assert_same_records(consumed: list[Stored], expected: list[Stored]) -> None:
    """``consumed`` (in the order the consumer gave them) holds exactly ``expected``, each
    partition's in offset order, with equal keys, values, headers and timestamps."""
    got = by_partition(consumed)
    want = by_partition(sorted(expected, key=lambda r: (r.partition, r.offset)))
    assert sorted(got) == sorted(want), f"partitions: got {sorted(got)}, want {sorted(want)}"
    for partition, records in want.items():
        seen = got[partition]
        for i, (g, w) in enumerate(zip(seen, records, strict=False)):
            assert g == w, f"partition {partition}, record #{i}:\n got  {g}\n want {w}"
        assert len(seen) == len(records), (
            f"partition {partition}: got {len(seen)} records, want {len(records)}; "
            f"offsets got {[r.offset for r in seen]}"
        )


def records_at_or_after(delivered: list[Stored], timestamp_ms: int) -> list[Stored]:
    return [r for r in delivered if r.record.timestamp_ms >= timestamp_ms]


def first_offsets_at_or_after(delivered: list[Stored], timestamp_ms: int) -> dict[int, int]:
    """Per partition, the offset offsets_for_times must answer (partitions with none left out)."""
    out: dict[int, int] = {}
    for r in records_at_or_after(delivered, timestamp_ms):
        out[r.partition] = min(out.get(r.partition, r.offset), r.offset)
    return out


# -- what the brokers stored -------------------------------------------------------------------


class Batch(NamedTuple):
    partition: int
    base_offset: int
    last_offset: int
    codec: str
    producer_id: int
    base_sequence: int
    timestamp_type: str


def stored_batches(kafka: KafkaCluster, topic: str, partitions: int) -> list[Batch]:
    """Every batch of the topic, read from its partition dirs with ``runnel log dump``."""
    out = []
    for p in range(partitions):
        done = runnel("log", "dump", str(kafka.partition_dir(topic, p)), "--json")
        assert done.returncode == 0, done.stderr
        for line in done.stdout.splitlines():
            b = json.loads(line)
            assert b["crc_valid"], b
            out.append(
                Batch(
                    p, b["base_offset"], b["last_offset"], b["codec"], b["producer_id"],
                    b["base_sequence"], b["timestamp_type"],
                )
            )  # fmt: skip
    return out


def assert_stored_codecs(
    kafka: KafkaCluster,
    topic: str,
    produced: Mapping[str, Iterable[Stored | tuple[int, int]]],
    stored_codec: dict[str, str],
) -> list[Batch]:
    """``produced`` maps a label (each produced with one codec) to where its records are,
    (partition, offset); each batch on disk must hold records of one label only, compressed
    with ``stored_codec[label]``."""
    label_at = {(r[0], r[1]): label for label, rs in produced.items() for r in rs}
    batches = stored_batches(kafka, topic, PARTITIONS)
    seen: dict[str, set[str]] = {}
    for b in batches:
        labels = {label_at[b.partition, o] for o in range(b.base_offset, b.last_offset + 1)}
        assert len(labels) == 1, f"{b} holds records of {labels}"
        seen.setdefault(labels.pop(), set()).add(b.codec)
    assert seen == {label: {stored_codec[label]} for label in produced}, seen
    return batches


class MetadataView(NamedTuple):
    brokers: list[int]
    controller_id: int
    topics: dict[str, int]  # name: partition count


def broker_metadata(address: str) -> MetadataView:
    """One broker's Metadata v12 answer (all topics), asked for by hand with kafka-python's
    protocol classes (an independent codec)."""
    request = MetadataRequest[12](
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    request.with_header(correlation_id=1, client_id="runnel-tests")
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as s:
        s.sendall(bytes(request.encode(header=True, framed=True)))
        reader = s.makefile("rb")
        (size,) = struct.unpack(">i", reader.read(4))
        response = MetadataResponse.decode(reader.read(size), version=12, header=True)
    return MetadataView(
        [b.node_id for b in response.brokers],
        response.controller_id,
        {t.name: len(t.partitions) for t in response.topics if t.error_code == 0},
    )


def create_topic(kafka: KafkaCluster, name: str, partitions: int = PARTITIONS) -> None:
    """With ``runnel topics create``; returns once every broker lists the topic."""
    done = runnel(
        "topics", "create", name, "--partitions", str(partitions), "--replication-factor", "1",
        "--data-dir", str(kafka.data_dir),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    wait_until_listed(kafka, name, partitions)


def wait_until_listed(kafka: KafkaCluster, name: str, partitions: int) -> None:
    """Until every broker lists ``name`` with its partitions. The broker that handled a
    CreateTopics answers once it shows the topic; the others apply the same committed
    record a moment later (as Kafka's brokers do), and a client may ask any of them."""

    def listed() -> bool | None:
        views = [broker_metadata(a) for a in kafka.bootstrap.split(",")]
        return all(v.topics.get(name) == partitions for v in views) or None

    wait_for(f"every broker to list {name}", listed, WAIT_S)


def advertised_versions(bootstrap: str) -> dict[int, tuple[int, int]]:
    """The first broker's ApiVersions table, {api key: (min, max)}, asked for at v0 by hand
    (independent of every client under test)."""
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as s:
        client = b"runnel-tests"
        body = struct.pack(">hhih", 18, 0, 1, len(client)) + client  # key, version, id
        s.sendall(struct.pack(">i", len(body)) + body)
        reader = s.makefile("rb")
        (size,) = struct.unpack(">i", reader.read(4))
        data = reader.read(size)
    _, error, count = struct.unpack_from(">ihi", data)
    assert error == 0, error
    keys = struct.iter_unpack(">hhh", data[10 : 10 + 6 * count])
    return {key: (low, high) for key, low, high in keys}
