"""A broker's life against three in-process controllers over real gRPC: it replicates the
metadata log as a Raft observer (the leader learns its address from its fetches), registers,
catches up, is unfenced, learns the partitions it leads, and leaves by controlled shutdown."""

from __future__ import annotations

import asyncio
from pathlib import Path

from test_service import FAST, Quorum, run, topic

from broker.lifecycle import BrokerLifecycle, BrokerState, PartitionAssignment
from controller.client import ControllerClient
from controller.state_machine import MetadataStateMachine
from proto import controller_pb2 as cpb
from proto import metadata_pb2 as mpb
from raft.driver import RaftNode, RaftNodeConfig
from raft.testing.processes import free_ports
from raft.transport import GrpcTransport


class Broker:
    def __init__(self, root: Path, broker_id: int, quorum: Quorum, client: ControllerClient):
        (port,) = free_ports(1)
        voters = frozenset(quorum.addresses)
        self.transport = GrpcTransport(broker_id, f"127.0.0.1:{port}", quorum.addresses)
        self.machine = MetadataStateMachine()
        config = RaftNodeConfig(broker_id, voters, root / f"b{broker_id}", FAST)
        self.node = RaftNode(config, self.transport, self.machine)
        listener = mpb.Listener(name="CLIENT", host="127.0.0.1", port=port)
        self.lifecycle = BrokerLifecycle(
            broker_id, [listener], None, client, self.node, self.machine, 100
        )
        self.assignments: list[PartitionAssignment] = []
        self.lifecycle.on_partitions(self.assignments.append)

    async def start(self) -> None:
        await self.transport.start()
        await self.node.start()
        await self.lifecycle.start()

    async def close(self) -> None:
        await self.lifecycle.close()
        await self.node.close()
        await self.transport.close()


def test_a_broker_registers_catches_up_runs_and_shuts_down_under_control(
    tmp_path: Path,
) -> None:
    async def main(quorum: Quorum, client: ControllerClient) -> None:
        broker = Broker(tmp_path, 101, quorum, client)
        try:
            await broker.start()
            await broker.lifecycle.wait_for(BrokerState.RUNNING, 20)
            request = cpb.CreateTopicsRequest(topics=[topic("events", 3, 1)])
            response = await client.call("CreateTopics", request)
            assert [t.error for t in response.topics] == [cpb.NONE]
            async with asyncio.timeout(10):  # the observer applies it and tells the hook
                while not broker.assignments or len(broker.assignments[-1].leading) < 3:
                    await asyncio.sleep(0.05)
            assert all(p.leader_epoch == 0 for p in broker.assignments[-1].leading.values())
            assert await broker.lifecycle.shutdown(timeout_s=10)
            cluster = await client.call("DescribeCluster", cpb.DescribeClusterRequest())
            (described,) = cluster.brokers
            assert described.fenced and described.leaders == 0
        finally:
            await broker.close()

    run(main, tmp_path)


def test_a_fenced_broker_heartbeats_often_until_it_is_unfenced(tmp_path: Path) -> None:
    """With a 30 s heartbeat interval, a starting broker (its first heartbeat comes before
    its metadata caught up) is still unfenced within seconds: while fenced it heartbeats
    every FENCED_HEARTBEAT_INTERVAL_MS. Once running it keeps the interval it was given."""

    async def main(quorum: Quorum, client: ControllerClient) -> None:
        broker = Broker(tmp_path, 101, quorum, client)
        broker.lifecycle.heartbeat_interval_s = 30.0
        heartbeats: list[cpb.BrokerHeartbeatRequest] = []
        real_call = client.call

        async def call(method: str, request: object, *args: object) -> object:
            if method == "BrokerHeartbeat":
                heartbeats.append(request)  # type: ignore[arg-type]
            return await real_call(method, request, *args)  # type: ignore[arg-type]

        client.call = call  # type: ignore[method-assign,assignment]
        try:
            await broker.start()
            await broker.lifecycle.wait_for(BrokerState.RUNNING, 10)
            running_after = len(heartbeats)
            assert running_after >= 2  # the first found it not caught up
            await asyncio.sleep(0.5)
            assert len(heartbeats) == running_after, "a running broker heartbeat early"
        finally:
            await broker.close()

    run(main, tmp_path)
