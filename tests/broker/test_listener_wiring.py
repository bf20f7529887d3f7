"""A broker's Kafka listeners, each with its own dispatcher (``broker/runtime.py``), on a real
``runnel node`` process: a combined controller + broker with a client listener CLIENT and an
inter-broker listener INTERNAL, each advertised under a host name of its own (not the address
it binds), so an answer shows which listener's registration it came from.

A Metadata request on each listener (kafka-python's codec, independent of runnel's) must
name the broker at that listener's advertised address, and the node's metrics must count
each listener's requests apart. (Followers fetching on INTERNAL across three brokers, and
Metadata on INTERNAL there: tests/replication/test_inter_broker_listener.py.)
"""

from __future__ import annotations

import re
import signal
import socket
import struct
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kafka.protocol.metadata import MetadataRequest, MetadataResponse
from support import write_combined_node_config

from raft.testing.processes import kill, spawn_python

WAIT_S = 60.0  # the node's start, its stop, one request's answer
METADATA = 3  # Kafka's API key
ADVERTISED_HOSTS = {"CLIENT": "client.runnel.test", "INTERNAL": "internal.runnel.test"}
_RECEIVED = re.compile(
    r'^runnel_kafka_requests_received_total\{listener="(\w+)",node_id="1"\} (\S+)$', re.M
)
_SERVED = re.compile(
    r'^runnel_kafka_requests_served_total\{api_key="(\d+)",node_id="1"\} (\S+)$', re.M
)


@dataclass(frozen=True, slots=True)
class Node:
    ports: dict[str, int]  # listener name (and METRICS) -> the port bound on 127.0.0.1
    log: Path


def write_config(tmp_path: Path) -> tuple[Path, dict[str, int]]:
    def settings(ports: dict[str, int]) -> str:
        advertised = ", ".join(f'"{n}://{h}:{ports[n]}"' for n, h in ADVERTISED_HOSTS.items())
        return f'advertised_listeners = [{advertised}]\ninter_broker_listener_name = "INTERNAL"\n'

    listeners = ("CLIENT", "CONTROLLER", "INTERNAL", "METRICS")
    return write_combined_node_config(tmp_path, listeners, settings)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    """The node, ready (it says so once it serves Kafka clients); stopped by SIGTERM after the
    test (exit status 0), kill -9'd if it does not stop."""
    config, ports = write_config(tmp_path)
    log = tmp_path / "node.log"
    proc = spawn_python(["-m", "runnel", "node", "--config", str(config)], log)
    try:
        _until_ready(proc, log)
        yield Node(ports, log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=WAIT_S) == 0, log.read_text(errors="replace")[-3000:]
    finally:
        kill(proc)


def _until_ready(proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while "ready node 1" not in log.read_text(errors="replace"):
        tail = log.read_text(errors="replace")[-3000:]
        assert proc.poll() is None, f"the node exited with {proc.returncode}:\n{tail}"
        assert time.monotonic() < deadline, f"the node was not ready within {WAIT_S} s:\n{tail}"
        time.sleep(0.05)


def metadata_brokers(port: int) -> list[tuple[int, str, int]]:
    """The brokers (id, host, port) of a Metadata v12 answer from 127.0.0.1:``port``."""
    request = MetadataRequest[12](
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    request.with_header(correlation_id=1, client_id="runnel-tests")
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as s:
        s.sendall(bytes(request.encode(header=True, framed=True)))
        reader = s.makefile("rb")
        (size,) = struct.unpack(">i", reader.read(4))
        response = MetadataResponse.decode(reader.read(size), version=12, header=True)
    return [(b.node_id, b.host, b.port) for b in response.brokers]


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT_S) as response:
        text: str = response.read().decode()
    return text


@pytest.mark.slow
def test_each_listener_answers_with_its_own_addresses_and_counts_its_own_requests(
    node: Node,
) -> None:
    asked = {"CLIENT": 1, "INTERNAL": 2}  # Metadata requests per listener: told apart below
    for name, count in asked.items():
        for _ in range(count):
            expected = [(1, ADVERTISED_HOSTS[name], node.ports[name])]
            assert metadata_brokers(node.ports[name]) == expected, name

    metrics = scrape(node.ports["METRICS"])
    received = {name: float(value) for name, value in _RECEIVED.findall(metrics)}
    assert received == {name: float(count) for name, count in asked.items()}, metrics
    # Summed over the listeners' dispatchers: each request was counted by one of them.
    served = {int(key): float(value) for key, value in _SERVED.findall(metrics)}
    assert served == {METADATA: float(sum(asked.values()))}, metrics
