"""The runnel cluster bench.produce_consume measures: one controller and one broker, separate
processes on 127.0.0.1, as ``runnel cluster up --controllers 1 --brokers 1`` starts them.

How this works. A ``runnel.local_cluster.ClusterSpec`` on a free block of ports, run by a
``runnel.supervisor.Supervisor`` with restarts off (a node that dies fails the run), default
settings throughout. The cluster is ready when the broker's Kafka listener (its CLIENT port)
answers Metadata naming itself; a topic is ready when Metadata from the broker shows a
leader for each partition. Topics are made with a Kafka CreateTopics request (replication
factor 1) to the broker, which forwards it to the controller. ``stop`` kills both nodes
(SIGTERM, then SIGKILL) and reaps them.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench.kafka_load import Connection, LoadError, partition_leaders
from bench.metadata_cluster import free_base_port
from broker.protocol import ApiKey
from runnel.local_cluster import ClusterSpec, Port
from runnel.supervisor import Supervisor

__all__ = ["RunnelCluster"]

POLL_INTERVAL_S = 0.2
CREATE_TOPICS_VERSION = 7
LOG_TAIL_BYTES = 3000
BROKER_ID = 101


class RunnelCluster:
    """1 controller + 1 broker. Use from one thread."""

    def __init__(self, root: Path) -> None:
        self.spec = ClusterSpec(1, 1, root, free_base_port(2))
        self.spec.save()
        self.supervisor = Supervisor(self.spec, restart=False)
        self.bootstrap = f"127.0.0.1:{self.spec.node(BROKER_ID).ports[Port.CLIENT]}"

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
            return any(b.node_id == BROKER_ID for b in response.brokers)
        except (OSError, LoadError):
            return False
        finally:
            conn.close()

    def check_alive(self) -> None:
        died = self.supervisor.poll()  # restarts are off: only deaths
        if died:
            raise RuntimeError("; ".join(line for _, line in died) + "\n" + self.log_tail())

    def create_topics(self, topics: dict[str, int], timeout_s: float) -> None:
        """Create ``topics`` (name -> partitions, replication factor 1) with one Kafka
        CreateTopics request to the broker, then wait until the broker leads them all."""
        request = {
            "topics": [
                {"name": name, "num_partitions": n, "replication_factor": 1}
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
            while not self._has_leaders(name, partitions):
                self.check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(f"topic {name} has no leaders after {timeout_s} s")
                time.sleep(POLL_INTERVAL_S)

    def _has_leaders(self, topic: str, partitions: int) -> bool:
        conn = Connection.connect(self.bootstrap)
        try:
            return len(partition_leaders(conn, topic)) == partitions
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
