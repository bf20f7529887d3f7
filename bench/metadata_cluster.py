"""The local cluster bench.metadata measures, and how it looks at it from outside.

How this works. ``BenchCluster`` is a ``runnel.local_cluster.ClusterSpec`` (controllers 1..C,
brokers 101..100+B, on a free block of ports) run by a ``runnel.supervisor.Supervisor`` with
restarts off: a node that dies fails the run. One more broker than the ``B`` that hold the
topics runs: the *spare*, 101+B, which the benchmark stops (holding nothing) before the
creation and starts again, wiped, for the cold catch-up. Every node gets the benchmark's
``metadata_snapshot_bytes`` through ``RUNNEL_CONTROLLER__METADATA_SNAPSHOT_BYTES`` (the
supervisor passes this process's environment on); nothing else differs from ``runnel cluster
up``. The cluster is read only through the controllers' gRPC API (``DescribeCluster``), the
nodes' files (log, snapshot directory) and /proc (CPU seconds): never through the nodes'
metrics endpoints, whose scrape builds the image from another thread. ``stop`` kills every
node at once (SIGTERM, then SIGKILL) and reaps it: the figures are taken by then.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc.aio

from bench.metadata_figures import DESCRIBE_INTERVAL_S, RPC_TIMEOUT_MS, START_TIMEOUT_S, Params
from bench.raft_cluster import cpu_seconds
from controller.client import ControllerClient, RetryPolicy
from proto import controller_pb2 as cpb
from proto import controller_pb2_grpc
from raft.snapshots import SUFFIX
from runnel.local_cluster import PORTS_PER_NODE, ClusterSpec, ports_in_use
from runnel.supervisor import Supervisor

SNAPSHOT_ENV = "RUNNEL_CONTROLLER__METADATA_SNAPSHOT_BYTES"
# Below the kernel's ephemeral ports (32768-60999 here) and the tests' blocks (20000-32000):
# a broker restarted by a benchmark binds its ports again, and an outgoing connection that
# took one of them in between would fail the run.
PORT_RANGE = (10_000, 20_000)
PORT_ATTEMPTS = 100
LOG_TAIL_BYTES = 3000


def free_base_port(nodes: int) -> int:
    """A base port whose block of ``PORTS_PER_NODE * nodes`` ports is free now."""
    count = PORTS_PER_NODE * nodes
    for _ in range(PORT_ATTEMPTS):
        base = random.randrange(PORT_RANGE[0], PORT_RANGE[1] - count)
        if not ports_in_use(range(base, base + count)):
            return base
    raise RuntimeError(f"no free block of {count} ports in {PORT_RANGE}")


@contextmanager
def snapshot_setting(snapshot_bytes: int) -> Iterator[None]:
    """The nodes' ``metadata_snapshot_bytes`` while the cluster runs (restarts included)."""
    old = os.environ.get(SNAPSHOT_ENV)
    os.environ[SNAPSHOT_ENV] = str(snapshot_bytes)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(SNAPSHOT_ENV, None)
        else:
            os.environ[SNAPSHOT_ENV] = old


class BenchCluster:
    """The cluster under test. Use from one event loop."""

    def __init__(self, root: Path, params: Params) -> None:
        brokers = params.brokers + 1  # the spare
        nodes = params.controllers + brokers
        self.spec = ClusterSpec(params.controllers, brokers, root, free_base_port(nodes))
        self.supervisor = Supervisor(self.spec, restart=False)
        policy = RetryPolicy(timeout_ms=RPC_TIMEOUT_MS, rpc_timeout_ms=RPC_TIMEOUT_MS)
        self.client = ControllerClient(self.spec.controller_addresses(), policy)
        *self.broker_ids, self.spare = [n.node_id for n in self.spec.nodes() if not n.is_controller]

    # -- processes ---------------------------------------------------------------------------
    def start(self) -> list[int]:
        """Start the nodes that do not run (all, the first time); their ids."""
        return self.supervisor.start()

    def check_alive(self) -> None:
        died = self.supervisor.poll()  # restarts are off: only deaths
        if died:
            lines = "; ".join(line for _, line in died)
            raise RuntimeError(f"{lines}\n{self.log_tail([i for i, _ in died])}")

    def stop_node(self, node_id: int, timeout_s: float) -> str:
        """SIGTERM (a broker's controlled shutdown), SIGKILL after ``timeout_s``; how it
        ended."""
        self.supervisor.stop([node_id], timeout_s=timeout_s)
        return self.supervisor.managed[node_id].last_exit

    def wipe(self, node_id: int) -> None:
        """Delete the node's data dir (its metadata log and snapshots) and leave it empty."""
        data = self.spec.node_dir(node_id) / "data"
        shutil.rmtree(data)
        data.mkdir()

    def stop(self) -> None:
        """Every node: SIGTERM, at once SIGKILL, reaped."""
        self.supervisor.stop(hurry=lambda: True)

    async def close(self) -> None:
        await self.client.close()

    def cpu_by_node(self) -> dict[int, float]:
        pids = {i: self.supervisor.pid(i) for i in self.supervisor.managed}
        return {i: cpu_seconds(pid) for i, pid in pids.items() if pid is not None}

    # -- files -------------------------------------------------------------------------------
    def snapshots(self, node_id: int) -> list[Path]:
        """The node's snapshot files, oldest first (names start with the zero-padded end
        offset, see raft/snapshots.py)."""
        directory = self.spec.node_dir(node_id) / "data" / "snapshots"
        return sorted(directory.glob(f"*{SUFFIX}")) if directory.is_dir() else []

    def log_size(self, node_id: int) -> int:
        path = self.spec.log_path(node_id)
        return path.stat().st_size if path.exists() else 0

    def log_says(self, node_id: int, text: str, since: int) -> bool:
        with open(self.spec.log_path(node_id), "rb") as log:
            log.seek(since)
            return text.encode() in log.read()

    def log_tail(self, node_ids: list[int]) -> str:
        tails = []
        for node_id in node_ids:
            path = self.spec.log_path(node_id)
            text = path.read_bytes()[-LOG_TAIL_BYTES:].decode(errors="replace")
            tails.append(f"--- {path}\n{text}")
        return "\n".join(tails)

    # -- the controllers' view ---------------------------------------------------------------
    async def describe(self) -> cpb.DescribeClusterResponse:
        response: cpb.DescribeClusterResponse = await self.client.call(
            "DescribeCluster", cpb.DescribeClusterRequest()
        )
        if response.header.error != cpb.NONE:
            raise RuntimeError(f"DescribeCluster: {response.header}")
        return response

    async def wait_healthy(self) -> cpb.DescribeClusterResponse:
        """Every broker (the spare too) registered and unfenced; the last DescribeCluster
        answer."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            self.check_alive()
            response = await self.describe()
            unfenced = {b.broker_id for b in response.brokers if not b.fenced}
            if unfenced >= {*self.broker_ids, self.spare}:
                return response
            if time.monotonic() > deadline:
                raise TimeoutError(f"brokers not unfenced after {START_TIMEOUT_S} s: {response}")
            await asyncio.sleep(DESCRIBE_INTERVAL_S)

    async def active_controller(self) -> int:
        """The controller that answers DescribeCluster (the standbys say NOT_CONTROLLER)."""
        for node_id, address in self.spec.controller_addresses().items():
            async with grpc.aio.insecure_channel(address) as channel:
                stub = controller_pb2_grpc.ControllerServiceStub(channel)
                response = await stub.DescribeCluster(cpb.DescribeClusterRequest(), timeout=10)
            if response.header.error == cpb.NONE:
                return node_id
        raise RuntimeError("no controller answered as the active one")
