"""Three real voter processes on 127.0.0.1 (gRPC between them, files on disk) running a
replicated counter: kill -9 of the leader, restart and catch-up, and a node wiped of its data
rejoining through a snapshot."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raft.testing.processes import free_ports, kill, spawn_counter_node

TIMEOUT_S = 30


class Node:
    def __init__(self, node_id: int, voters: str, client_port: int, data_dir: Path) -> None:
        self.node_id, self.voters, self.client_port, self.data_dir = (
            node_id,
            voters,
            client_port,
            data_dir,
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = spawn_counter_node(
            self.node_id,
            self.voters,
            self.client_port,
            self.data_dir,
            election_timeout_ms=300,
            fetch_timeout_ms=1200,
            snapshot_every=5,
        )

    def kill(self) -> None:
        kill(self.proc)
        self.proc = None

    def ask(self, line: str, timeout_s: float = 5.0) -> str | None:
        """One request; None when the node does not answer (down or starting)."""
        try:
            with socket.create_connection(("127.0.0.1", self.client_port), timeout_s) as s:
                s.settimeout(timeout_s)
                s.sendall(line.encode() + b"\n")
                reply = b""
                while not reply.endswith(b"\n"):
                    chunk = s.recv(4096)
                    if not chunk:
                        return None
                    reply += chunk
                return reply.decode().strip()
        except OSError:
            return None


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[dict[int, Node]]:
    ports = free_ports(6)
    voters = ",".join(f"{i}@127.0.0.1:{ports[i - 1]}" for i in (1, 2, 3))
    cluster = {i: Node(i, voters, ports[2 + i], tmp_path / f"node-{i}") for i in (1, 2, 3)}
    try:
        for node in cluster.values():
            node.start()
        yield cluster
    finally:
        for node in cluster.values():
            node.kill()


def wait_for(predicate, what: str, timeout_s: float = TIMEOUT_S):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def leader_of(cluster: dict[int, Node], exclude: int | None = None) -> Node | None:
    leaders = []
    for node_id, node in cluster.items():
        status = node.ask("STATUS", 1.0) if node_id != exclude else None
        if status is not None and status.split()[1] == "leader":
            leaders.append(node)
    return leaders[0] if len(leaders) == 1 else None


def counter_of(node: Node) -> int | None:
    status = node.ask("STATUS", 1.0)
    return int(status.split()[5]) if status is not None else None


def test_kill_restart_and_rejoin_through_a_snapshot(nodes: dict[int, Node]) -> None:
    leader = wait_for(lambda: leader_of(nodes), "a leader")
    for _ in range(4):
        assert leader.ask("INCR 3", 10).startswith("OK ")  # type: ignore[union-attr]
    assert leader.ask("GET") == f"VALUE 12 {leader.ask('STATUS').split()[4]}"  # type: ignore[union-attr]

    old = leader.node_id
    leader.kill()  # kill -9 the leader: a new one must commit (how fast: bench.raft)
    leader = wait_for(lambda: leader_of(nodes, exclude=old), "a new leader")
    assert leader.ask("INCR 3", 10).startswith("OK ")  # type: ignore[union-attr]
    assert leader.ask("GET").split()[1] == "15"  # type: ignore[union-attr]

    nodes[old].start()  # the killed node restarts from its files and catches up
    wait_for(lambda: counter_of(nodes[old]) == 15, "the restarted node to catch up")
    assert nodes[old].ask("INCR 1").startswith("NOTLEADER ")  # type: ignore[union-attr]

    victim = next(n for n in nodes.values() if n.node_id != leader.node_id)
    victim.kill()
    shutil.rmtree(victim.data_dir)  # wiped: it can only come back through a snapshot
    victim.start()
    wait_for(lambda: counter_of(victim) == 15, "the wiped node to rejoin")
    # It came back through FetchSnapshot: its log starts after the snapshot, not at 0.
    segments = sorted((victim.data_dir / "__cluster_metadata-0").glob("*.log"))
    assert segments and int(segments[0].name[:20]) > 0
    assert leader.ask("INCR 2").startswith("OK ")  # type: ignore[union-attr]
    for node in nodes.values():
        wait_for(lambda node=node: counter_of(node) == 17, f"node {node.node_id} at 17")
