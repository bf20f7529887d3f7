"""The runnel cluster bench.produce_consume measures: one controller and one broker (three for
the replication runs), separate processes on 127.0.0.1, as ``runnel cluster up --controllers 1
--brokers N`` starts them.

How this works. A ``runnel.local_cluster.ClusterSpec`` on a free block of ports, run by a
``runnel.supervisor.Supervisor`` with restarts off (a node that dies fails the run), default
settings throughout. The cluster is ready when the first broker's Kafka listener (its CLIENT
port) answers Metadata naming every broker; a topic is ready when Metadata from that broker
shows a leader for each partition and every replica in its ISR. Topics are made with a Kafka
CreateTopics request (replication factor 1 unless asked) to the broker, which forwards it to
the controller. ``stop`` kills every node (SIGTERM, then SIGKILL) and reaps them.
"""

from __future__ import annotations

import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from bench.kafka_load import METADATA_VERSION, Connection, LoadError, partition_leaders
from bench.metadata_cluster import free_base_port
from broker.protocol import ApiKey, ProtocolError
from runnel.local_cluster import ClusterSpec, Port
from runnel.supervisor import Supervisor

__all__ = ["PartitionState", "RunnelCluster", "partition_states"]

POLL_INTERVAL_S = 0.2
CREATE_TOPICS_VERSION = 7
DELETE_TOPICS_VERSION = 5  # names, not ids
LOG_TAIL_BYTES = 3000
BROKER_ID = 101


class PartitionState(NamedTuple):
    """One partition as a broker's Metadata answer shows it."""

    partition: int
    leader: int  # -1: none
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


def partition_states(conn: Connection, topic: str) -> list[PartitionState]:
    """``topic``'s partitions from a Metadata request; LoadError if the topic has an error."""
    request = {"topics": [{"name": topic}], "allow_auto_topic_creation": False}
    (found,) = conn.call(ApiKey.METADATA, METADATA_VERSION, request).topics
    if found.error_code != 0:
        raise LoadError(f"Metadata for {topic}: error code {found.error_code}")
    return [
        PartitionState(p.partition_index, p.leader_id, tuple(p.replica_nodes), tuple(p.isr_nodes))
        for p in found.partitions
    ]


class RunnelCluster:
    """1 controller + ``brokers`` brokers (ids 101, 102, ...). Use from one thread."""

    def __init__(self, root: Path, brokers: int = 1) -> None:
        self.spec = ClusterSpec(1, brokers, root, free_base_port(1 + brokers))
        self.spec.save()
        self.supervisor = Supervisor(self.spec, restart=False)
        self.broker_ids = tuple(range(BROKER_ID, BROKER_ID + brokers))
        self.bootstrap = self.address(BROKER_ID)

    def address(self, broker_id: int) -> str:
        """The broker's Kafka listener."""
        return f"127.0.0.1:{self.spec.node(broker_id).ports[Port.CLIENT]}"

    @property
    def broker_pid(self) -> int:
        pid = self.supervisor.pid(BROKER_ID)
        if pid is None:
            raise RuntimeError("the broker is not running")
        return pid

    def start(self, timeout_s: float) -> None:
        self.supervisor.start()
        deadline = time.monotonic() + timeout_s
        while not self._broker_answers():
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no Metadata from the broker within {timeout_s} s")
            time.sleep(POLL_INTERVAL_S)

    def _broker_answers(self) -> bool:
        try:
            conn = Connection.connect(self.bootstrap)
        except OSError:
            return False
        try:
            response = conn.call(ApiKey.METADATA, 12, {"topics": []})
            return set(self.broker_ids) <= {b.node_id for b in response.brokers}
        except (OSError, LoadError, ProtocolError):  # not up yet, or not ours on that port
            return False
        finally:
            conn.close()

    def metrics_text(self, broker_id: int) -> str:
        """The broker's Prometheus endpoint, as text."""
        port = self.spec.node(broker_id).ports[Port.METRICS]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            return str(answer.read().decode())

    def check_alive(self) -> None:
        died = self.supervisor.poll()  # restarts are off: only deaths
        if died:
            raise RuntimeError("; ".join(line for _, line in died) + "\n" + self.log_tail())

    def delete_topics(self, names: list[str], timeout_s: float) -> None:
        """Delete ``names`` with one Kafka DeleteTopics request (answered once committed and
        seen by the broker asked)."""
        request = {"topic_names": names, "timeout_ms": int(timeout_s * 1000)}
        conn = Connection.connect(self.bootstrap)
        try:
            response = conn.call(ApiKey.DELETE_TOPICS, DELETE_TOPICS_VERSION, request)
        finally:
            conn.close()
        failed = [f"{t.name}: {t.error_code}" for t in response.responses if t.error_code]
        if failed:
            raise RuntimeError(f"DeleteTopics: {'; '.join(failed)}")

    def create_topics(
        self,
        topics: dict[str, int],
        timeout_s: float,
        replication_factor: int = 1,
        configs: dict[str, str] | None = None,
    ) -> None:
        """Create ``topics`` (name -> partitions) with one Kafka CreateTopics request to the
        broker, then wait until each partition has a leader and a full ISR."""
        entries = [{"name": k, "value": v} for k, v in (configs or {}).items()]
        request = {
            "topics": [
                {
                    "name": name,
                    "num_partitions": n,
                    "replication_factor": replication_factor,
                    "configs": entries,
                }
                for name, n in topics.items()
            ],
            "timeout_ms": int(timeout_s * 1000),
        }
        conn = Connection.connect(self.bootstrap)
        try:
            response = conn.call(ApiKey.CREATE_TOPICS, CREATE_TOPICS_VERSION, request)
        finally:
            conn.close()
        failed = [
            f"{t.name}: {t.error_code} {t.error_message}" for t in response.topics if t.error_code
        ]
        if failed:
            raise RuntimeError(f"CreateTopics: {'; '.join(failed)}")
        deadline = time.monotonic() + timeout_s
        for name, partitions in topics.items():
            while not self._has_leaders(name, partitions, replication_factor):
                self.check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"topic {name} has no leaders after {timeout_s} s")
                time.sleep(POLL_INTERVAL_S)

    def _has_leaders(self, topic: str, partitions: int, replication_factor: int) -> bool:
        conn = Connection.connect(self.bootstrap)
        try:
            if len(partition_leaders(conn, topic)) != partitions:
                return False
            if replication_factor == 1:
                return True
            return all(len(p.isr) == replication_factor for p in partition_states(conn, topic))
        except LoadError:
            return False
        finally:
            conn.close()

    def stop(self) -> None:
        self.supervisor.stop(hurry=lambda: True)

    def log_tail(self) -> str:
        tails = []
        for node in self.spec.nodes():
            path = self.spec.log_path(node.node_id)
            if path.exists():
                text = path.read_bytes()[-LOG_TAIL_BYTES:].decode(errors="replace")
                tails.append(f"--- {path}\n{text}")
        return "\n".join(tails)


@contextmanager
def stopped_after(cluster: RunnelCluster) -> Iterator[RunnelCluster]:
    """Stops ``cluster`` when the block ends; if it ends in an error, first prints the tail
    of the nodes' logs (what the nodes said about it)."""
    try:
        yield cluster
    except BaseException:
        print(cluster.log_tail(), file=sys.stderr)
        raise
    finally:
        cluster.stop()
