"""The Raft transport's resource limits in the node config: loaded from ``[raft_transport]``,
checked against each other and against Raft's timeouts, and handed to the parts that
enforce them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support import write_combined_node_config

from runnel.config import ConfigError, load_config
from runnel.node import RunnelNode


def problems(path: Path, env: dict[str, str]) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as caught:
        load_config(path, env)
    return [(p.key, p.message) for p in caught.value.problems]


def test_the_limits_load_from_the_environment(tmp_path: Path) -> None:
    path, _ = write_combined_node_config(tmp_path)
    env = {
        "RUNNEL_RAFT_TRANSPORT__MAX_LEARNED_PEERS": "100",
        "RUNNEL_RAFT_TRANSPORT__LEARNED_PEER_MAX_IDLE_MS": "60000",
        "RUNNEL_RAFT_TRANSPORT__MAX_CONCURRENT_RPCS": "500",
        "RUNNEL_RAFT_TRANSPORT__MAX_INBOX_BYTES": "33554432",
        "RUNNEL_RAFT_TRANSPORT__MAX_CONNECTIONS": "64",
        "RUNNEL_BROKER__REPLICA_READ_MAX_CALLS": "125",  # a quarter of 500 at most
    }
    transport = load_config(path, env).raft_transport
    assert (transport.max_learned_peers, transport.learned_peer_max_idle_ms) == (100, 60_000)
    assert (transport.max_concurrent_rpcs, transport.max_inbox_bytes) == (500, 32 * 1024 * 1024)
    assert transport.max_connections == 64


def test_a_learned_peer_must_outlive_raft_s_fetch_timeout(tmp_path: Path) -> None:
    path, _ = write_combined_node_config(tmp_path)  # fast Raft: fetch_timeout_ms = 600
    found = problems(path, {"RUNNEL_RAFT_TRANSPORT__LEARNED_PEER_MAX_IDLE_MS": "600"})
    assert [key for key, _ in found] == ["raft_transport.learned_peer_max_idle_ms"]
    assert "must exceed raft.fetch_timeout_ms (600)" in found[0][1]
    load_config(path, {"RUNNEL_RAFT_TRANSPORT__LEARNED_PEER_MAX_IDLE_MS": "601"})


def test_replica_reads_may_hold_at_most_a_quarter_of_the_rpc_slots(tmp_path: Path) -> None:
    path, _ = write_combined_node_config(tmp_path)
    env = {"RUNNEL_RAFT_TRANSPORT__MAX_CONCURRENT_RPCS": "400"}
    found = problems(path, env | {"RUNNEL_BROKER__REPLICA_READ_MAX_CALLS": "101"})
    assert [key for key, _ in found] == ["broker.replica_read_max_calls"]
    assert "replica_read_max_calls (101) must be at most a quarter" in found[0][1]
    load_config(path, env | {"RUNNEL_BROKER__REPLICA_READ_MAX_CALLS": "100"})


def test_the_inbox_must_hold_the_largest_message(tmp_path: Path) -> None:
    path, _ = write_combined_node_config(tmp_path)
    found = problems(path, {"RUNNEL_RAFT_TRANSPORT__MAX_INBOX_BYTES": "1048576"})
    assert [key for key, _ in found] == ["raft_transport.max_inbox_bytes"]
    assert "must be at least max_message_bytes" in found[0][1]


def test_a_node_gives_its_raft_node_the_inbox_bound(tmp_path: Path) -> None:
    path, _ = write_combined_node_config(tmp_path)
    env = {
        "RUNNEL_RAFT_TRANSPORT__MAX_INBOX_BYTES": "33554432",
        "RUNNEL_RAFT_TRANSPORT__MAX_CONCURRENT_RPCS": "301",
        "RUNNEL_BROKER__REPLICA_READ_MAX_CALLS": "75",
    }
    config = load_config(path, env)

    async def main() -> None:
        node = RunnelNode(config)
        try:
            assert node.raft.config.max_inbox_bytes == 32 * 1024 * 1024
            # the controller API may hold half the RPC slots waiting for commits
            assert node.controller_service is not None
            assert node.controller_service.max_in_flight_requests == 150
            assert node.transport.config is config.raft_transport
            assert node.replica_read is not None and node.replica_read.max_calls == 75
        finally:
            await node.stop()

    asyncio.run(main())
