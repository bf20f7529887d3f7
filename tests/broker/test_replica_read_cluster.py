"""``ReadBatches`` and ``runnel replicas verify`` on real broker processes: the shared cluster
of kafka_cluster.py (one controller, brokers 101 and 102).

A topic of two partitions with replication factor 1 (so each partition has one replica,
alternately on each broker) gets records from confluent-kafka in several flushes, hence
several batches per partition. Each replica is then read over real gRPC at its broker's
REPLICATION listener, and what comes back must be what ``runnel log dump`` reads from the
partition's directory on disk; ``runnel replicas verify`` must read every replica and say
that, each being alone, there is nothing to compare it with. A second topic, with
replication factor 2 (a replica on each broker), gets acks=all records: ``verify`` compares
the two replicas batch by batch and finds them equal, and the follower's stream is the
leader's.
"""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
from confluent_kafka import Producer
from kafka_cluster import BROKER_IDS, WAIT_S, KafkaCluster, create_topic, kafka, wait_until_listed
from test_local_cluster import runnel, wait_for

from proto import replica_pb2 as rpb
from proto import replica_pb2_grpc
from runnel.local_cluster import ClusterSpec, Port
from runnel.replica_compare import BatchMeta
from storage.checkpoint import OffsetCheckpointFile
from storage.topic_partition import TopicPartition

__all__ = ["kafka"]  # the fixture

pytestmark = pytest.mark.slow
ROUNDS, RECORDS_PER_ROUND = 5, 4  # per partition; a flush after each round


def produce(kafka: KafkaCluster, topic: str, acks: str = "1") -> None:
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 0, "acks": acks})
    failed: list[Any] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failed.append(error)

    for r in range(ROUNDS):
        for partition in (0, 1):
            for i in range(RECORDS_PER_ROUND):
                value = f"round {r} record {i} of partition {partition}".encode()
                producer.produce(topic, value=value, partition=partition, on_delivery=delivered)
        assert producer.flush(WAIT_S) == 0
    assert not failed, failed


def describe(kafka: KafkaCluster, topic: str) -> dict[str, Any]:
    done = runnel("topics", "describe", topic, "--json", "--data-dir", str(kafka.data_dir))
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def on_disk(kafka: KafkaCluster, topic: str, partition: int) -> list[BatchMeta]:
    """The partition's batches as ``runnel log dump`` reads them from its directory."""
    done = runnel("log", "dump", str(kafka.partition_dir(topic, partition)), "--json")
    assert done.returncode == 0, done.stderr
    out = []
    for line in done.stdout.splitlines():
        b = json.loads(line)
        offsets = b["base_offset"], b["last_offset"]
        out.append(BatchMeta(*offsets, b["leader_epoch"], int(b["crc"], 16), b["size_bytes"]))
    return out


def read_batches(
    kafka: KafkaCluster, broker_id: int, request: rpb.ReadBatchesRequest
) -> list[rpb.ReadBatchesChunk]:
    spec = ClusterSpec.load(kafka.data_dir)
    assert spec is not None
    port = spec.node(broker_id).ports[Port.REPLICATION]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = replica_pb2_grpc.ReplicaReadServiceStub(channel)
        return list(stub.ReadBatches(request, timeout=WAIT_S))


def metas(chunks: list[rpb.ReadBatchesChunk]) -> list[BatchMeta]:
    return [
        BatchMeta(b.base_offset, b.last_offset, b.leader_epoch, b.crc, b.size_bytes)
        for c in chunks
        for b in c.batches
    ]


@pytest.fixture(scope="module")
def topic(kafka: KafkaCluster) -> str:
    name = "replica-read"
    create_topic(kafka, name, partitions=2)
    produce(kafka, name)
    return name


def test_each_replica_streams_what_its_log_holds_on_disk(kafka: KafkaCluster, topic: str) -> None:
    described = describe(kafka, topic)
    records = ROUNDS * RECORDS_PER_ROUND
    for p in described["partitions"]:
        (leader,) = p["replicas"]
        request = rpb.ReadBatchesRequest(topic=topic, partition=p["partition"])
        chunks = read_batches(kafka, leader, request)
        stored = on_disk(kafka, topic, p["partition"])
        assert len(stored) >= ROUNDS and metas(chunks) == stored
        assert all(b.leader_epoch == p["leader_epoch"] for b in stored)
        last = chunks[-1]
        assert (last.broker_id, last.log_start_offset, last.end_reached) == (leader, 0, True)
        assert last.high_watermark == last.log_end_offset == last.next_offset == records


def test_a_broker_without_the_replica_answers_not_found(kafka: KafkaCluster, topic: str) -> None:
    described = describe(kafka, topic)
    for p in described["partitions"]:
        (leader,) = p["replicas"]
        (other,) = set(BROKER_IDS) - {leader}
        request = rpb.ReadBatchesRequest(topic=topic, partition=p["partition"])
        with pytest.raises(grpc.RpcError) as caught:
            read_batches(kafka, other, request)
        error: Any = caught.value
        assert error.code() is grpc.StatusCode.NOT_FOUND
        assert error.details() == f"broker {other} holds no replica of {topic}-{p['partition']}"


def test_another_topic_id_under_the_name_is_not_found(kafka: KafkaCluster, topic: str) -> None:
    p = describe(kafka, topic)["partitions"][0]
    request = rpb.ReadBatchesRequest(topic=topic, partition=0, topic_id=b"\x01" * 16)
    with pytest.raises(grpc.RpcError) as caught:
        read_batches(kafka, p["replicas"][0], request)
    error: Any = caught.value
    assert error.code() is grpc.StatusCode.NOT_FOUND and "of topic id" in error.details()


def test_verify_reads_each_single_replica_and_compares_nothing(
    kafka: KafkaCluster, topic: str
) -> None:
    done = runnel("replicas", "verify", "--topic", topic, "--data-dir", str(kafka.data_dir))
    assert done.returncode == 0, done.stdout + done.stderr  # replication factor 1: no problem
    described = describe(kafka, topic)
    expected = [
        f"{topic}-{p['partition']}: ok: replicas {p['leader']} (leader); "
        "only one replica: nothing to compare"
        for p in described["partitions"]
    ]
    summary = (
        "2 partitions checked, 0 batches compared: "
        "nothing to compare (only one replica of each partition)"
    )
    assert done.stdout.splitlines() == [*expected, summary]


def test_verify_as_json_reports_each_partition_read_and_nothing_compared(
    kafka: KafkaCluster, topic: str
) -> None:
    # This topic only: the cluster is shared, and other tests' topics are theirs to check.
    done = runnel(
        "replicas", "verify", "--topic", topic, "--json", "--data-dir", str(kafka.data_dir)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["partitions_checked"] == 2, report
    ours = report["partitions"]
    assert [(p["topic"], p["partition"]) for p in ours] == [(topic, 0), (topic, 1)]
    records = ROUNDS * RECORDS_PER_ROUND
    for p in ours:
        assert p["ok"] and p["reference"] == p["leader"] and p["divergences"] == []
        assert (p["replicas_read"], p["batches_compared"], p["end_offset"]) == (1, 0, records)


def test_verify_of_an_unknown_topic_fails(kafka: KafkaCluster) -> None:
    done = runnel(
        "replicas", "verify", "--topic", "no-such-topic", "--data-dir", str(kafka.data_dir)
    )
    assert done.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in done.stderr, done.stderr


def test_two_replicas_of_acks_all_records_agree(kafka: KafkaCluster) -> None:
    name = "replica-read-rf2"
    done = runnel(
        "topics", "create", name, "--partitions", "2", "--replication-factor", "2",
        "--data-dir", str(kafka.data_dir),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    wait_until_listed(kafka, name, 2)
    produce(kafka, name, acks="all")  # acknowledged once both replicas have each batch
    every = ROUNDS * RECORDS_PER_ROUND

    # Both brokers, the follower included, checkpoint the high watermark (every 5 s). The
    # follower learns the last HW with its next fetch: once both files say so, verify
    # compares everything.
    def checkpointed() -> bool | None:
        for broker in BROKER_IDS:
            path = kafka.data_dir / f"node-{broker}" / "data" / "replication-offset-checkpoint"
            if not path.exists():
                return None
            hws = OffsetCheckpointFile(path).read()
            if any(hws.get(TopicPartition(name, p)) != every for p in (0, 1)):
                return None
        return True

    wait_for("both brokers to checkpoint the high watermarks", checkpointed, WAIT_S)
    done = runnel(
        "replicas", "verify", "--topic", name, "--json", "--data-dir", str(kafka.data_dir)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] and report["partitions_checked"] == 2
    assert report["batches_compared"] >= 2 * ROUNDS  # a flush per round: a batch each at least
    for partition in (0, 1):
        request = rpb.ReadBatchesRequest(topic=name, partition=partition, start_offset=0)
        streams = [metas(read_batches(kafka, broker, request)) for broker in BROKER_IDS]
        assert streams[0] == streams[1] and len(streams[0]) >= ROUNDS
        assert streams[0][-1].last_offset == every - 1
