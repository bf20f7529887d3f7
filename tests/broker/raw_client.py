"""A blocking raw-protocol Kafka client for tests, and what the tests that use it need of the
shared cluster.

How this works. ``RawClient`` is one TCP connection: ``request`` encodes a request with
runnel's own codec, sends it and reads the framed answer (a 4-byte size, then the frame),
every read bounded by a timeout; ``send_raw`` and ``read_frame`` let a test write any bytes
and read whatever comes back, and ``closed_by_peer`` tells whether the broker dropped the
connection. Nothing here retries or hides an error: a test sees exactly what the broker did.

``SharedCluster`` wraps the ``kafka`` fixture's cluster (tests/broker/kafka_cluster.py: one
controller and brokers 101 and 102, in their own processes, one cluster per pytest process)
with each broker's client port, its node log (``LogWatch`` reads what a log gained since a
mark) and its pid.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import socket
import struct
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka_cluster import KafkaCluster
from test_local_cluster import Cluster, wait_for

from broker.protocol import ApiKey, ErrorCode, decode_response, encode_request
from runnel.local_cluster import process_alive

__all__ = [
    "BROKERS",
    "ConnectionClosed",
    "LogWatch",
    "RawClient",
    "SharedCluster",
    "fetch_body",
    "unique_topic",
]

BROKERS = (101, 102)
IO_TIMEOUT_S = 15.0  # one request's answer; the broker answers in milliseconds
_SIZE = struct.Struct(">i")
_correlation_ids = itertools.count(1)


class ConnectionClosed(Exception):
    """The broker closed the connection (EOF or reset) before a whole frame arrived."""


class RawClient:
    """One blocking connection to a broker. Not thread-safe."""

    def __init__(self, port: int, *, host: str = "127.0.0.1", timeout_s: float = IO_TIMEOUT_S):
        self.port = port
        self.timeout_s = timeout_s
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.settimeout(timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    # -- bytes -------------------------------------------------------------------------------
    def send_raw(self, data: bytes | bytearray | memoryview) -> None:
        self.sock.sendall(data)

    def send_parts(self, parts: list[Any]) -> None:
        self.sock.sendall(b"".join(bytes(p) for p in parts))

    def _read_exactly(self, count: int) -> bytes:
        chunks, left = [], count
        while left:
            try:
                chunk = self.sock.recv(min(left, 1 << 20))
            except ConnectionResetError as e:
                raise ConnectionClosed(f"reset after {count - left} of {count} bytes") from e
            if not chunk:
                raise ConnectionClosed(f"EOF after {count - left} of {count} bytes")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def read_frame(self, timeout_s: float | None = None) -> bytes:
        """The next response frame without its size prefix. Raises ConnectionClosed, or
        TimeoutError when nothing complete arrives within the timeout."""
        if timeout_s is not None:
            self.sock.settimeout(timeout_s)
        try:
            (size,) = _SIZE.unpack(self._read_exactly(4))
            return self._read_exactly(size)
        finally:
            self.sock.settimeout(self.timeout_s)

    def half_close(self) -> None:
        """Send EOF (the broker reads it after what was sent); quiet if already closed."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)

    def closed_by_peer(self, timeout_s: float = IO_TIMEOUT_S) -> bool:
        """True once the broker has closed this connection (any unread bytes are dropped);
        False if it is still open after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        try:
            while (left := deadline - time.monotonic()) > 0:
                self.sock.settimeout(left)
                if not self.sock.recv(65536):
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
        finally:
            self.sock.settimeout(self.timeout_s)
        return False

    # -- requests ----------------------------------------------------------------------------
    def send_request(
        self, api_key: int, version: int, body: dict[str, Any], *, client_id: str = "raw-test"
    ) -> int:
        correlation_id = next(_correlation_ids)
        self.send_parts(encode_request(api_key, version, correlation_id, client_id, body))
        return correlation_id

    def receive(self, api_key: int, version: int, correlation_id: int) -> Any:
        got, value = decode_response(api_key, version, self.read_frame())
        assert got == correlation_id, f"correlation id {got}, expected {correlation_id}"
        return value

    def request(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        return self.receive(api_key, version, self.send_request(api_key, version, body))

    # -- the requests the tests use ------------------------------------------------------------
    def metadata(self, topics: list[str] | None = None, version: int = 12) -> Any:
        wanted = None if topics is None else [{"name": t} for t in topics]
        return self.request(ApiKey.METADATA, version, {"topics": wanted})

    def api_versions(self, version: int = 3) -> Any:
        body = {"client_software_name": "raw-test", "client_software_version": "1"}
        return self.request(ApiKey.API_VERSIONS, version, body)

    def create_topic(
        self,
        name: str,
        partitions: int,
        replication_factor: int,
        configs: dict[str, str] | None = None,
    ) -> None:
        topic = {
            "name": name,
            "num_partitions": partitions,
            "replication_factor": replication_factor,
            "assignments": [],
            "configs": [{"name": k, "value": v} for k, v in (configs or {}).items()],
        }
        answer = self.request(ApiKey.CREATE_TOPICS, 7, {"topics": [topic], "timeout_ms": 30000})
        (result,) = answer.topics
        assert result.error_code == ErrorCode.NONE, (name, result.error_code, result.error_message)

    def produce(
        self,
        topic: str,
        partitions: dict[int, bytes | None],
        *,
        version: int = 9,
        acks: int = -1,
    ) -> dict[int, Any]:
        """Each partition's answer, by index."""
        (response,) = self.produce_answer(topic, partitions, version=version, acks=acks).responses
        assert response.name == topic
        return {p.index: p for p in response.partition_responses}

    def produce_answer(
        self,
        topic: str,
        partitions: dict[int, bytes | None],
        *,
        version: int = 9,
        acks: int = -1,
    ) -> Any:
        """The whole Produce answer."""
        body = {
            "transactional_id": None,
            "acks": acks,
            "timeout_ms": 10000,
            "topic_data": [
                {
                    "name": topic,
                    "partition_data": [{"index": i, "records": r} for i, r in partitions.items()],
                }
            ],
        }
        return self.request(ApiKey.PRODUCE, version, body)

    def list_offset(
        self, topic: str, partition: int, *, timestamp: int = -1, leader_epoch: int = -1
    ) -> Any:
        """ListOffsets v7 for one partition (latest by default): its answer."""
        body = {
            "replica_id": -1,
            "isolation_level": 0,
            "topics": [
                {
                    "name": topic,
                    "partitions": [
                        {
                            "partition_index": partition,
                            "current_leader_epoch": leader_epoch,
                            "timestamp": timestamp,
                        }
                    ],
                }
            ],
        }
        answer = self.request(ApiKey.LIST_OFFSETS, 7, body)
        return answer.topics[0].partitions[0]

    def fetch(
        self,
        partitions: list[tuple[str, int, int]],
        *,
        version: int = 12,
        max_wait_ms: int = 0,
        min_bytes: int = 1,
        max_bytes: int = 50 * 1024 * 1024,
        partition_max_bytes: int = 1024 * 1024,
        leader_epoch: int = -1,
    ) -> Any:
        """One Fetch for (topic, partition, offset) triples; the whole response."""
        return self.request(
            ApiKey.FETCH,
            version,
            fetch_body(
                partitions,
                max_wait_ms=max_wait_ms,
                min_bytes=min_bytes,
                max_bytes=max_bytes,
                partition_max_bytes=partition_max_bytes,
                leader_epoch=leader_epoch,
            ),
        )


def fetch_body(
    partitions: list[tuple[str, int, int]],
    *,
    max_wait_ms: int = 0,
    min_bytes: int = 1,
    max_bytes: int = 50 * 1024 * 1024,
    partition_max_bytes: int = 1024 * 1024,
    leader_epoch: int = -1,
) -> dict[str, Any]:
    topics: dict[str, list[dict[str, Any]]] = {}
    for topic, index, offset in partitions:
        topics.setdefault(topic, []).append(
            {
                "partition": index,
                "current_leader_epoch": leader_epoch,
                "fetch_offset": offset,
                "last_fetched_epoch": -1,
                "log_start_offset": -1,
                "partition_max_bytes": partition_max_bytes,
            }
        )
    return {
        "replica_id": -1,
        "max_wait_ms": max_wait_ms,
        "min_bytes": min_bytes,
        "max_bytes": max_bytes,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [{"topic": t, "partitions": p} for t, p in topics.items()],
        "forgotten_topics_data": [],
        "rack_id": "",
    }


def unique_topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -- the node logs -------------------------------------------------------------------------------

_RECORD_START = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ level=(\w+) ")


@dataclass
class LogWatch:
    """Reads what a node's log gained since ``mark`` (whole records, tracebacks included)."""

    path: Path
    start: int = 0

    def mark(self) -> LogWatch:
        self.start = self.path.stat().st_size if self.path.exists() else 0
        return self

    def text(self) -> str:
        with open(self.path, "rb") as f:
            f.seek(self.start)
            return f.read().decode("utf-8", "replace")

    def records(self, level: str | None = None) -> list[str]:
        """Each log record since the mark (a record's continuation lines, such as a
        traceback, stay with it), of ``level`` if given."""
        out: list[str] = []
        for line in self.text().splitlines():
            if _RECORD_START.match(line) or not out:
                out.append(line)
            else:
                out[-1] += "\n" + line
        if level is None:
            return out
        return [r for r in out if (m := _RECORD_START.match(r)) and m.group(1) == level]

    def wait_for(self, pattern: str, timeout_s: float = 10.0, level: str = "WARNING") -> str:
        regex = re.compile(pattern)

        def found() -> str | None:
            return next((r for r in self.records(level) if regex.search(r)), None)

        return wait_for(f"a {level} matching {pattern!r} in {self.path}", found, timeout_s)


# -- the cluster -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SharedCluster:
    """The ``kafka`` fixture's cluster (tests/broker/kafka_cluster.py) as these tests use it:
    each broker's client port, node logs and pids, and ``runnel`` commands on its data dir."""

    data_dir: Path
    ports: dict[int, int]

    @classmethod
    def of(cls, kafka: KafkaCluster) -> SharedCluster:
        ports = {b: _client_port(kafka.data_dir / f"node-{b}" / "node.toml") for b in BROKERS}
        return cls(kafka.data_dir, ports)

    @property
    def cluster(self) -> Cluster:
        return Cluster(self.data_dir, 0)  # commands only: it resumes from cluster.json

    def node_log(self, node: int) -> Path:
        return self.data_dir / f"node-{node}" / "node.log"

    def watch(self, node: int) -> LogWatch:
        return LogWatch(self.node_log(node)).mark()

    def client(self, broker: int = BROKERS[0]) -> RawClient:
        return RawClient(self.ports[broker])

    def pid(self, node: int) -> int:
        return int((self.data_dir / f"node-{node}" / "node.pid").read_text())

    def alive(self, node: int) -> bool:
        return process_alive(self.pid(node), str(self.data_dir))

    def leaders(self, topic: str, timeout_s: float = 30.0) -> dict[int, tuple[int, int]]:
        """partition -> (leader, leader epoch), once every partition has a leader and both
        brokers' metadata agree on it."""

        def probe() -> dict[int, tuple[int, int]] | None:
            views = []
            for broker in BROKERS:
                with self.client(broker) as c:
                    (t,) = c.metadata([topic]).topics
                if t.error_code != ErrorCode.NONE or not t.partitions:
                    return None
                views.append(
                    {p.partition_index: (p.leader_id, p.leader_epoch) for p in t.partitions}
                )
            if views[0] != views[1] or any(leader < 0 for leader, _ in views[0].values()):
                return None
            return views[0]

        return wait_for(f"leaders of {topic}", probe, timeout_s)


def _client_port(node_toml: Path) -> int:
    """The CLIENT listener's port in a node config that ``cluster up`` wrote."""
    match = re.search(r"CLIENT://[^:\"]+:(\d+)", node_toml.read_text())
    assert match, f"no CLIENT listener in {node_toml}"
    return int(match.group(1))
