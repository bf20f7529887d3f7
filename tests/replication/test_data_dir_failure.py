"""A broker whose data directory fails stops, and its partitions move to in-sync replicas
(broker/runtime.py): real processes, a real full disk.

Broker 101's data directory is a small tmpfs mounted before the cluster starts; a
partition it leads gets large acks=all records until the disk is full. The write that
fails takes the directory offline; the broker must then shut down under control and exit
(status 1, said in its log), the controller must hand its leaderships to the other in-sync
replicas, every acknowledged record must be readable from the new leader exactly once, and
producing must work again. Started again on the still-full disk, it stops again.

Mounting needs root (or CAP_SYS_ADMIN): without it the test skips and says so.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fault_cluster as rc
import pytest
from confluent_kafka import KafkaError, Producer
from support import fill, tmpfs

from runnel.local_cluster import ClusterSpec

FAILING = 101  # the broker whose data directory is a small tmpfs
TMPFS_MB = 24
VALUE_BYTES = 64 * 1024
MAX_RECORDS = 3 * TMPFS_MB * 1024 * 1024 // VALUE_BYTES  # well past a full disk
TOPIC = "full-disk"
PARTITIONS = 3


@pytest.fixture
def full_disk_cluster(tmp_path: Path) -> Iterator[Any]:
    with contextlib.ExitStack() as mounts:

        def before_up(spec: ClusterSpec) -> None:
            mounts.enter_context(tmpfs(spec.node_dir(FAILING) / "data", TMPFS_MB))

        cluster = None
        try:
            cluster = rc.start_cluster(tmp_path / "cluster", before_up=before_up)
            yield cluster
        finally:
            if cluster is not None:
                rc.stop_cluster(cluster)
                print(cluster.story())
                for node in cluster.spec.nodes():
                    print(cluster.log_excerpt(node.node_id))


@pytest.mark.slow
def test_a_broker_whose_data_dir_fails_stops_and_its_partitions_move(
    full_disk_cluster: Any,
) -> None:
    c = full_disk_cluster
    views = c.create_topic(TOPIC, PARTITIONS)
    led = [v.partition for v in views if v.leader == FAILING]
    assert led, f"broker {FAILING} leads no partition of {views}"
    partition = led[0]
    c.note(f"filling {TOPIC}-{partition}, led by broker {FAILING}")

    acked: dict[str, int] = {}
    failed: Counter[str] = Counter()

    def report(error: KafkaError | None, message: Any) -> None:
        value = message.value()[:16].decode()
        if error is None:
            acked[value] = message.offset()
        else:
            failed[error.name()] += 1

    producer = Producer(
        {
            "bootstrap.servers": c.bootstrap,
            "acks": "all",
            "enable.idempotence": True,  # retries across the leader change stay exactly once
            "linger.ms": 5,
            "message.timeout.ms": 60_000,
            "topic.metadata.refresh.interval.ms": 1000,
            "logger": rc.NULL_LOGGER,
            "error_cb": lambda _: None,
        }
    )
    padding = b"x" * (VALUE_BYTES - 16)
    deadline = time.monotonic() + 90
    sent = 0
    while c.pid(FAILING) is not None and sent < MAX_RECORDS:
        assert time.monotonic() < deadline, f"broker {FAILING} still runs\n{c.story()}"
        try:
            producer.produce(TOPIC, f"v{sent:015d}".encode() + padding, partition=partition,
                             on_delivery=report)  # fmt: skip
            sent += 1
        except BufferError:
            pass
        producer.poll(0.01)
    c.note(f"sent {sent}; broker {FAILING} running: {c.pid(FAILING) is not None}")
    assert sent < MAX_RECORDS, f"{sent} records did not fill a {TMPFS_MB} MB disk\n{c.story()}"
    rc.wait_for(f"broker {FAILING} to exit", lambda: True if c.pid(FAILING) is None else None, 60)

    log = c.spec.log_path(FAILING).read_text(errors="replace")
    assert "level=CRITICAL" in log and f"data directory {c.spec.node_dir(FAILING)}" in log, log[
        -3000:
    ]
    assert "stopped after a fatal error" in log, log[-3000:]

    survivors = [b for b in rc.BROKERS if b != FAILING]
    moved = c.wait_partitions(
        f"{TOPIC}: no partition led by broker {FAILING}",
        TOPIC,
        lambda v: all(p.leader in survivors for p in v),
        30,
        via=survivors,
    )
    c.note(f"leaders after the failure: {[p.leader for p in moved]}")

    # Producing works again, and the producer's outstanding records get their answers.
    for n in range(20):
        producer.produce(TOPIC, f"after{n:011d}".encode() + padding, partition=partition,
                         on_delivery=report)  # fmt: skip
    assert producer.flush(60) == 0, f"undelivered records\n{c.story()}"
    assert all(f"after{n:011d}" in acked for n in range(20)), (failed, c.story())
    c.note(f"acked {len(acked)} of {sent + 20}; failures {dict(failed)}")

    records = c.read_all(TOPIC, PARTITIONS, timeout_s=60)[partition]
    seen = Counter(value[:16] for _, value in records)
    lost = [v for v in acked if seen[v] == 0]
    twice = [v for v, n in seen.items() if n > 1]
    assert not lost and not twice, (
        f"lost {len(lost)} acknowledged ({lost[:5]}), duplicated {twice[:5]}\n{c.story()}"
    )
    offsets = {value[:16]: offset for offset, value in records}
    moved_offsets = [v for v, o in acked.items() if offsets[v] != o]
    assert not moved_offsets, f"acknowledged at another offset: {moved_offsets[:5]}"

    # With the disk full to the last block, a restart stops again, whichever write fails
    # first: the metadata log's (while it waits to be unfenced), loading the logs, or its
    # first follower append.
    fill(c.spec.node_dir(FAILING) / "data")
    position = c.log_size(FAILING)
    pid = c.start(FAILING)
    rc.wait_for("the restarted broker to stop again", lambda: c.exit_code(pid), 60)
    again = "\n".join(c.log_since(FAILING, position))
    assert c.exit_code(pid) == 1, again[-3000:]
    assert "cannot start" in again or "stopped after a fatal error" in again, again[-3000:]
