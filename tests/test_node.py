"""``runnel node`` composed in-process: a combined controller + broker node that is the only
voter registers itself, gets unfenced, serves the controller API and Prometheus metrics, and
leaves by controlled shutdown. (Real processes: tests/test_local_cluster.py.)"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path

from support import REPO, write_combined_node_config

from broker.lifecycle import BrokerState
from controller.client import ControllerClient
from proto import controller_pb2 as cpb
from runnel.config import load_config
from runnel.node import RunnelNode


def write_config(tmp_path: Path) -> tuple[Path, int, int]:
    path, ports = write_combined_node_config(
        tmp_path, ("CLIENT", "CONTROLLER", "REPLICATION", "METRICS")
    )
    return path, ports["CONTROLLER"], ports["METRICS"]


# Counts since start-up are counters (``_total``); values "now" stay gauges.
COUNTERS = (
    "runnel_raft_inbox_drops_total", "runnel_raft_learned_peers_forgotten_total",
    *(
        f"runnel_kafka_{name}_total"
        for name in (
            "connections_accepted", "connections_refused", "connections_closed",
            "requests_received", "requests_served", "received_bytes", "sent_bytes",
            "replica_fetches", "replica_full_fetches", "replica_fetch_session_errors",
            "replica_appended_bytes", "replica_truncations", "replica_metadata_rests",
            "isr_changes_proposed", "isr_changes_refused", "isr_change_requests",
            "fetch_session_evictions", "fetch_session_expirations", "request_memory_waits",
        )
    ),
)  # fmt: skip
GAUGES = (
    "runnel_raft_epoch", "runnel_raft_role", "runnel_metadata_partitions",
    "runnel_metadata_offline_partitions",
    "runnel_controller_active", "runnel_broker_state", "runnel_raft_learned_peers",
    *(
        f"runnel_kafka_{name}"
        for name in (
            "connections_open", "fetches_waiting", "partitions", "leaders",
            "under_replicated_partitions", "under_min_isr_partitions", "partitions_following",
            "fetch_sessions", "fetch_session_partitions", "fetch_session_watched_partitions",
            "request_memory_used_bytes", "response_buffered_bytes",
        )
    ),
)  # fmt: skip
OPENMETRICS = "application/openmetrics-text; version=1.0.0"


def scrape(port: int, accept: str | None = None) -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics")
    if accept is not None:
        request.add_header("Accept", accept)
    with urllib.request.urlopen(request, timeout=5) as response:
        text: str = response.read().decode()
    return text


def families(text: str, kind: str) -> dict[str, str]:
    """``# TYPE`` or ``# HELP`` lines (``kind``): metric name -> the rest of the line."""
    lines = (line.split(" ", 3) for line in text.splitlines() if line.startswith(f"# {kind} "))
    return {name: rest for _, _, name, rest in lines}


def assert_types(text: str) -> None:
    types = families(text, "TYPE")
    assert {name: types.get(name) for name in COUNTERS} == dict.fromkeys(COUNTERS, "counter")
    assert {name: types.get(name) for name in GAUGES} == dict.fromkeys(GAUGES, "gauge")
    so_far = [name for name, doc in families(text, "HELP").items() if "so far" in doc]
    assert {name: types[name] for name in so_far} == dict.fromkeys(so_far, "counter")


async def _until(done: Callable[[], bool], timeout_s: float = 10) -> None:
    async with asyncio.timeout(timeout_s):
        while not done():
            await asyncio.sleep(0.02)


def test_a_combined_node_runs_both_roles_and_serves_metrics(tmp_path: Path) -> None:
    path, controller_port, metrics_port = write_config(tmp_path)
    config = load_config(path, {})

    async def main() -> None:
        node = RunnelNode(config)
        client = ControllerClient({1: f"127.0.0.1:{controller_port}"})
        await node.start()
        try:
            assert node.lifecycle is not None
            await node.lifecycle.wait_for(BrokerState.RUNNING, 20)
            request = cpb.CreateTopicsRequest(
                topics=[cpb.CreatableTopic(name="t", num_partitions=2, replication_factor=1)]
            )
            response = await client.call("CreateTopics", request)
            assert [t.error for t in response.topics] == [cpb.NONE]
            metrics = await asyncio.to_thread(scrape, metrics_port)
            assert 'runnel_controller_active{node_id="1"} 1.0' in metrics
            assert 'runnel_broker_state{node_id="1",state="running"} 1.0' in metrics
            assert 'runnel_raft_role{node_id="1",role="leader"} 1.0' in metrics
            assert 'runnel_metadata_partitions{node_id="1"} 2.0' in metrics
            assert 'runnel_metadata_offline_partitions{node_id="1"} 0.0' in metrics
            # the broker's image shows the topic once its logs exist; then metrics say so
            await _until(
                lambda: node.kafka is not None and len(node.kafka.replicas.partitions()) == 2
            )
            metrics = await asyncio.to_thread(scrape, metrics_port)
            assert 'runnel_kafka_leaders{node_id="1"} 2.0' in metrics
            received = 'runnel_kafka_requests_received_total{listener="CLIENT",node_id="1"} 0.0'
            assert received in metrics
            assert 'runnel_kafka_connections_refused_total{node_id="1"} 0.0' in metrics
            assert 'runnel_kafka_connections_closed_total{node_id="1"} 0.0' in metrics
            # one broker, replication factor 1: full ISRs, nothing followed
            assert 'runnel_kafka_under_replicated_partitions{node_id="1"} 0.0' in metrics
            assert 'runnel_kafka_partitions_following{node_id="1"} 0.0' in metrics
            assert 'runnel_kafka_replica_metadata_rests_total{node_id="1"} 0.0' in metrics
            assert 'runnel_kafka_isr_changes_proposed_total{node_id="1"} 0.0' in metrics
            assert 'runnel_kafka_request_memory_waits_total{node_id="1"} 0.0' in metrics
            assert 'runnel_raft_inbox_drops_total{node_id="1",reason="bytes"} 0.0' in metrics
            assert_types(metrics)
            # OpenMetrics (what Prometheus asks for first) names a counter's family without
            # _total, its samples with it, and gives byte counters their unit
            metrics = await asyncio.to_thread(scrape, metrics_port, OPENMETRICS)
            assert "# TYPE runnel_kafka_received_bytes counter" in metrics
            assert "# UNIT runnel_kafka_received_bytes bytes" in metrics
            assert 'runnel_kafka_received_bytes_total{node_id="1"} 0.0' in metrics
            assert "# TYPE runnel_kafka_fetch_sessions gauge" in metrics
        finally:
            await node.stop()  # controlled shutdown first
            await client.close()
        assert node.lifecycle.state is BrokerState.STOPPED

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_node_raises_its_open_file_limit_to_the_hard_one() -> None:
    """In a child process whose soft limit is lowered first (the test's own stays)."""
    code = (
        "import resource\n"
        "from runnel.node import raise_open_file_limit\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 512), hard))\n"
        "assert raise_open_file_limit() == hard\n"
        "assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
