"""The controller's gRPC API on three in-process controller nodes talking real gRPC (Raft
and the controller service share each node's port), driven through ControllerClient: it
finds the active controller, brokers register and get unfenced by heartbeats, topics are
created and placed, bad input is refused without changing anything."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import grpc.aio
from support import FAST_RAFT

from controller.client import ControllerClient, RetryPolicy
from controller.config import ControllerConfig
from controller.quorum import QuorumController
from controller.service import ControllerService
from controller.state_machine import MetadataStateMachine
from proto import controller_pb2 as cpb
from proto import controller_pb2_grpc
from proto import metadata_pb2 as mpb
from raft.driver import RaftNode, RaftNodeConfig
from raft.testing.processes import free_ports
from raft.transport import GrpcTransport

FAST = FAST_RAFT
VOTERS = (1, 2, 3)


class Quorum:
    def __init__(self, root: Path) -> None:
        ports = free_ports(len(VOTERS))
        self.addresses = {i: f"127.0.0.1:{p}" for i, p in zip(VOTERS, ports, strict=True)}
        self.root = root
        self.parts: list[tuple[GrpcTransport, RaftNode, QuorumController]] = []
        self.services: dict[int, ControllerService] = {}

    async def start(self) -> None:
        for node_id, address in self.addresses.items():
            peers = {i: a for i, a in self.addresses.items() if i != node_id}
            transport = GrpcTransport(node_id, address, peers)
            machine = MetadataStateMachine()
            config = RaftNodeConfig(node_id, frozenset(VOTERS), self.root / f"c{node_id}", FAST)
            node = RaftNode(config, transport, machine)
            controller = QuorumController(node, machine, ControllerConfig())
            service = ControllerService(controller, self.addresses)
            transport.add_service(service.register)
            await transport.start()
            await node.start()
            self.parts.append((transport, node, controller))
            self.services[node_id] = service

    async def close(self) -> None:
        for transport, node, controller in self.parts:
            await controller.close()
            await node.close()
            await transport.close()


def run(main: Callable[[Quorum, ControllerClient], Coroutine[Any, Any, None]], root: Path) -> None:
    async def body() -> None:
        quorum = Quorum(root)
        client = ControllerClient(quorum.addresses, RetryPolicy(timeout_ms=20_000))
        try:
            await quorum.start()
            await main(quorum, client)
        finally:
            await client.close()
            await quorum.close()

    asyncio.run(asyncio.wait_for(body(), 90))


async def register(client: ControllerClient, broker_id: int, rack: str = "") -> int:
    listener = mpb.Listener(name="CLIENT", host="127.0.0.1", port=9000 + broker_id)
    request = cpb.RegisterBrokerRequest(
        broker_id=broker_id, incarnation_id=os.urandom(16), listeners=[listener], rack=rack
    )
    response = await client.call("RegisterBroker", request)
    assert response.header.error == cpb.NONE, response.header
    return int(response.broker_epoch)


async def heartbeat_until_unfenced(client: ControllerClient, broker_id: int, epoch: int) -> None:
    async with asyncio.timeout(10):
        while True:
            request = cpb.BrokerHeartbeatRequest(
                broker_id=broker_id, broker_epoch=epoch, metadata_offset=1 << 40
            )
            response = await client.call("BrokerHeartbeat", request)
            assert response.header.error == cpb.NONE, response.header
            if not response.is_fenced:
                return
            await asyncio.sleep(0.05)


def topic(name: str, partitions: int, rf: int) -> cpb.CreatableTopic:
    return cpb.CreatableTopic(name=name, num_partitions=partitions, replication_factor=rf)


def test_brokers_register_get_unfenced_and_topics_are_placed_over_them(tmp_path: Path) -> None:
    async def main(quorum: Quorum, client: ControllerClient) -> None:
        for broker_id, rack in ((1, "a"), (2, "b"), (3, "c")):
            epoch = await register(client, broker_id, rack)
            await heartbeat_until_unfenced(client, broker_id, epoch)
        request = cpb.CreateTopicsRequest(topics=[topic("orders", 6, 3)])
        response = await client.call("CreateTopics", request)
        assert response.header.error == cpb.NONE
        assert [t.error for t in response.topics] == [cpb.NONE]
        cluster = await client.call("DescribeCluster", cpb.DescribeClusterRequest())
        assert (cluster.topics, cluster.partitions) == (1, 6)
        assert sorted(b.broker_id for b in cluster.brokers if not b.fenced) == [1, 2, 3]
        assert {b.leaders for b in cluster.brokers} == {2}  # preferred leaders balanced
        assert {b.partitions for b in cluster.brokers} == {6}
        described = await client.call(
            "DescribeTopics", cpb.DescribeTopicsRequest(names=["orders", "nope"])
        )
        nope, orders = described.topics
        assert nope.error == cpb.UNKNOWN_TOPIC_OR_PARTITION
        assert [p.partition_id for p in orders.partitions] == list(range(6))
        for p in orders.partitions:  # racks a, b, c: one replica on each
            assert sorted(p.replicas) == [1, 2, 3] and p.leader == p.replicas[0]

    run(main, tmp_path)


def test_a_standby_names_the_active_controller(tmp_path: Path) -> None:
    async def main(quorum: Quorum, client: ControllerClient) -> None:
        await client.call("DescribeCluster", cpb.DescribeClusterRequest())  # one is active
        active = next(i for i, s in quorum.services.items() if s.controller.active)
        standby = next(i for i in quorum.addresses if i != active)
        async with grpc.aio.insecure_channel(quorum.addresses[standby]) as channel:
            stub = controller_pb2_grpc.ControllerServiceStub(channel)
            response = await stub.CreateTopics(cpb.CreateTopicsRequest(topics=[topic("x", 1, 1)]))
        assert response.header.error == cpb.NOT_CONTROLLER
        assert response.header.controller_id == active
        assert response.header.controller_address == quorum.addresses[active]

    run(main, tmp_path)


def test_bad_topics_are_refused_with_clear_errors_and_change_nothing(tmp_path: Path) -> None:
    async def main(quorum: Quorum, client: ControllerClient) -> None:
        epoch = await register(client, 1)
        await heartbeat_until_unfenced(client, 1, epoch)
        bad = [topic("no spaces allowed", 1, 1), topic("toomany", 1, 3), topic("zero", 0, 1)]
        response = await client.call("CreateTopics", cpb.CreateTopicsRequest(topics=bad))
        errors = {t.name: (t.error, t.message) for t in response.topics}
        assert errors["no spaces allowed"][0] == cpb.INVALID_TOPIC_EXCEPTION
        assert errors["toomany"][0] == cpb.INVALID_REPLICATION_FACTOR
        assert "3" in errors["toomany"][1] and "1" in errors["toomany"][1]
        assert errors["zero"][0] == cpb.INVALID_PARTITIONS
        cluster = await client.call("DescribeCluster", cpb.DescribeClusterRequest())
        assert cluster.topics == 0

    run(main, tmp_path)


def test_a_duplicate_broker_registration_is_refused_while_the_first_is_alive(
    tmp_path: Path,
) -> None:
    async def main(quorum: Quorum, client: ControllerClient) -> None:
        epoch = await register(client, 1)
        await heartbeat_until_unfenced(client, 1, epoch)
        listener = mpb.Listener(name="CLIENT", host="127.0.0.1", port=9999)
        request = cpb.RegisterBrokerRequest(
            broker_id=1, incarnation_id=os.urandom(16), listeners=[listener]
        )
        response = await client.call("RegisterBroker", request)
        assert response.header.error == cpb.DUPLICATE_BROKER_REGISTRATION
        assert "broker 1" in response.header.message

    run(main, tmp_path)


def test_a_broker_let_go_by_controlled_shutdown_can_register_again_at_once(
    tmp_path: Path,
) -> None:
    async def main(quorum: Quorum, client: ControllerClient) -> None:
        epoch = await register(client, 1)
        await heartbeat_until_unfenced(client, 1, epoch)
        request = cpb.BrokerHeartbeatRequest(
            broker_id=1, broker_epoch=epoch, metadata_offset=1 << 40, want_shutdown=True
        )
        async with asyncio.timeout(10):
            while not (await client.call("BrokerHeartbeat", request)).should_shut_down:
                await asyncio.sleep(0.05)
        new_epoch = await register(client, 1)  # a new process, well inside the session timeout
        assert new_epoch > epoch

    run(main, tmp_path)


def test_an_idle_active_controller_writes_a_noop_so_the_log_moves(tmp_path: Path) -> None:
    async def main(quorum: Quorum, client: ControllerClient) -> None:
        request = cpb.DescribeClusterRequest()
        first = (await client.call("DescribeCluster", request)).metadata_offset
        async with asyncio.timeout(10):  # metadata_max_idle_interval_ms is 500 by default
            while (await client.call("DescribeCluster", request)).metadata_offset == first:
                await asyncio.sleep(0.1)

    run(main, tmp_path)
