"""The processes bench.raft talks to, and how it talks to them.

How this works. ``Cluster`` starts three ``raft.testing.counter_node`` voters on 127.0.0.1
(real gRPC between them, real files, the default Raft timeouts) and finds the leader by asking
each node ``STATUS`` over its line protocol (``Connection``). ``BaselineServer`` starts
``python -m bench.raft --baseline-server LINE_PORT GRPC_PORT``, which runs ``baseline_server``:
the node's own line server answering ``OK <n>`` at once, and a ``RaftService`` that only
acknowledges. ``cpu_seconds`` reads a process's CPU time from /proc.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc
import grpc.aio

from bench.raft_figures import (
    CATCH_UP_TIMEOUT_S,
    ELECTION_TIMEOUT_MS,
    FETCH_TIMEOUT_MS,
    NODE_IDS,
    POLL_INTERVAL_S,
    REQUEST_TIMEOUT_S,
    SNAPSHOT_EVERY_RECORDS,
    START_TIMEOUT_S,
    STATUS_TIMEOUT_S,
)
from proto import raft_pb2 as pb
from proto import raft_pb2_grpc
from raft.testing.counter_node import serve_lines
from raft.testing.processes import free_ports, kill, spawn_counter_node, spawn_python

T = TypeVar("T")


# --- the line protocol --------------------------------------------------------------------


class Connection:
    """One client connection speaking the counter node's line protocol."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, timeout_s: float = REQUEST_TIMEOUT_S) -> Connection:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def ask(self, line: bytes, timeout_s: float = REQUEST_TIMEOUT_S) -> str:
        self.writer.write(line)
        async with asyncio.timeout(timeout_s):
            reply = await self.reader.readline()
        if not reply:
            raise ConnectionError("the node closed the connection")
        return reply.decode().strip()

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


async def ask_once(port: int, line: bytes, timeout_s: float) -> str | None:
    """One request on a fresh connection; None when the node does not answer in time."""
    try:
        async with asyncio.timeout(timeout_s):
            conn = await Connection.open(port, timeout_s)
            try:
                return await conn.ask(line, timeout_s)
            finally:
                await conn.close()
    except (OSError, TimeoutError):
        return None


# --- processes ----------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Node:
    node_id: int
    voters: str
    client_port: int
    data_dir: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = spawn_counter_node(
            self.node_id,
            self.voters,
            self.client_port,
            self.data_dir,
            election_timeout_ms=ELECTION_TIMEOUT_MS,
            fetch_timeout_ms=FETCH_TIMEOUT_MS,
            snapshot_every=SNAPSHOT_EVERY_RECORDS,
        )

    def kill(self) -> None:
        kill(self.proc)
        self.proc = None

    async def status(self) -> list[str] | None:
        """STATUS fields (role, epoch, leader, hw, counter) or None if it does not answer."""
        reply = await ask_once(self.client_port, b"STATUS\n", STATUS_TIMEOUT_S)
        if reply is None or not reply.startswith("STATUS "):
            return None
        return reply.split()[1:]


@dataclass
class Cluster:
    root: Path
    nodes: dict[int, Node] = field(default_factory=dict)

    def start(self) -> None:
        ports = free_ports(2 * len(NODE_IDS))
        voters = ",".join(f"{i}@127.0.0.1:{ports[k]}" for k, i in enumerate(NODE_IDS))
        for k, i in enumerate(NODE_IDS):
            self.nodes[i] = Node(i, voters, ports[len(NODE_IDS) + k], self.root / f"node-{i}")
        for node in self.nodes.values():
            node.start()

    def stop(self) -> None:
        for node in self.nodes.values():
            node.kill()

    async def leader_status(self, exclude: int | None = None) -> tuple[Node, int] | None:
        """The one node that says it is leader, and its epoch (None if none or several)."""
        candidates = [n for i, n in self.nodes.items() if i != exclude]
        statuses = await asyncio.gather(*(n.status() for n in candidates))
        leaders = [
            (n, int(s[1]))
            for n, s in zip(candidates, statuses, strict=True)
            if s and s[0] == "leader"
        ]
        return leaders[0] if len(leaders) == 1 else None

    async def leader(self, exclude: int | None = None) -> Node | None:
        found = await self.leader_status(exclude)
        return found[0] if found is not None else None

    async def wait_leader(self, timeout_s: float = START_TIMEOUT_S) -> Node:
        return await poll(self.leader, "a leader", timeout_s)

    async def wait_caught_up(self, timeout_s: float = CATCH_UP_TIMEOUT_S) -> None:
        """Every node up, one leader, and the same counter everywhere."""

        async def caught_up() -> bool:
            statuses = await asyncio.gather(*(n.status() for n in self.nodes.values()))
            if any(s is None for s in statuses):
                return False
            roles = sorted(s[0] for s in statuses if s is not None)
            counters = {s[4] for s in statuses if s is not None}
            return roles == ["follower", "follower", "leader"] and len(counters) == 1

        await poll(caught_up, "every node caught up", timeout_s)

    def log_tail(self, lines: int = 20) -> str:
        out = []
        for node_id in self.nodes:
            path = self.root / f"node-{node_id}.log"
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- node {node_id} ---\n" + "\n".join(tail))
        return "\n".join(out)


async def poll(check: Callable[[], Awaitable[T | None]], what: str, timeout_s: float) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = await check()
        if result:
            return result
        await asyncio.sleep(POLL_INTERVAL_S)
    raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")


# --- baseline -----------------------------------------------------------------------------


class _AckServicer(raft_pb2_grpc.RaftServiceServicer):
    """``RaftService.Send`` that only acknowledges: the transport's bare round trip."""

    async def Send(  # the name is the RPC's
        self, request: pb.Envelope, context: grpc.aio.ServicerContext[pb.Envelope, pb.Ack]
    ) -> pb.Ack:
        return pb.Ack()


async def baseline_server(line_port: int, grpc_port: int) -> None:
    """The trivial peer: the node's own pipelined line server (``serve_lines``) answering
    ``OK <n>`` at once on ``line_port``, and a gRPC ``RaftService`` that acknowledges on
    ``grpc_port``."""
    count = 0

    async def answer(words: list[str]) -> str:
        nonlocal count
        count += 1
        return f"OK {count}"

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_lines(reader, writer, answer)

    rpc = grpc.aio.server()
    raft_pb2_grpc.add_RaftServiceServicer_to_server(_AckServicer(), rpc)
    rpc.add_insecure_port(f"127.0.0.1:{grpc_port}")
    await rpc.start()
    server = await asyncio.start_server(client, "127.0.0.1", line_port)
    async with server:
        await server.serve_forever()


async def wait_listening(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    async def listening() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            conn = await Connection.open(port, STATUS_TIMEOUT_S)
        except (OSError, TimeoutError):
            return False
        await conn.close()
        return True

    await poll(listening, what, START_TIMEOUT_S)


@dataclass
class BaselineServer:
    """The ``--baseline-server`` process: line echo and gRPC acknowledgements."""

    root: Path
    line_port: int = 0
    grpc_port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        self.line_port, self.grpc_port = free_ports(2)
        self.proc = spawn_python(
            ["-m", "bench.raft", "--baseline-server", str(self.line_port), str(self.grpc_port)],
            self.root / "baseline-server.log",
        )
        await wait_listening(self.line_port, self.proc, "the baseline server")

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("the baseline server is not running")
        return self.proc.pid

    def stop(self) -> None:
        kill(self.proc)
        self.proc = None
