"""A broker's life against three in-process controllers over real gRPC: it replicates the
metadata log as a Raft observer (the leader learns its address from its fetches), registers,
catches up, is unfenced, learns the partitions it leads, and leaves by controlled shutdown."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from test_service import FAST, Quorum, run, topic

from broker.lifecycle import BrokerLifecycle, BrokerState
from controller.client import ControllerClient, ControllerUnavailable, RetryPolicy
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
        self.lifecycle = BrokerLifecycle(broker_id, [listener], None, client, self.node, 100)

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
            async with asyncio.timeout(10):  # the observer applies it
                while not (topics := broker.machine.image.topics):
                    await asyncio.sleep(0.05)
            (created,) = topics.values()
            assert [(p.leader, p.leader_epoch) for p in created.partitions.values()] == [
                (101, 0)
            ] * 3
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
                if not heartbeats:  # the first says it has applied nothing: not caught up
                    # (a start that caught up before it was unfenced by it, alone)
                    first = cpb.BrokerHeartbeatRequest()
                    first.CopyFrom(request)  # type: ignore[arg-type]
                    first.metadata_offset = -1
                    request = first
                heartbeats.append(request)  # type: ignore[arg-type]
            return await real_call(method, request, *args)  # type: ignore[arg-type]

        client.call = call  # type: ignore[method-assign,assignment]
        try:
            await broker.start()
            await broker.lifecycle.wait_for(BrokerState.RUNNING, 10)
            running_after = len(heartbeats)
            assert running_after >= 2  # the first was not caught up: fenced, it came again
            await asyncio.sleep(0.5)
            assert len(heartbeats) == running_after, "a running broker heartbeat early"
        finally:
            await broker.close()

    run(main, tmp_path)


# -- against a fake controller client: registration and shutdown corner cases ---------------


class FakeNode:
    applied_end = 0


class FakeClient:
    """Answers RegisterBroker and BrokerHeartbeat as ``register`` and ``heartbeat`` say; it
    records every call (method, request) in order."""

    policy = RetryPolicy()

    def __init__(
        self,
        register: Callable[[int], cpb.RegisterBrokerResponse],
        heartbeat: Callable[[cpb.BrokerHeartbeatRequest], cpb.BrokerHeartbeatResponse],
    ) -> None:
        self.register, self.heartbeat = register, heartbeat
        self.calls: list[tuple[str, Any]] = []
        self.called = asyncio.Event()

    async def call(self, method: str, request: Any, policy: RetryPolicy | None = None) -> Any:
        self.calls.append((method, request))
        self.called.set()
        await asyncio.sleep(0)
        if method == "RegisterBroker":
            return self.register(sum(1 for m, _ in self.calls if m == method))
        return self.heartbeat(request)

    def methods(self) -> list[str]:
        return [m for m, _ in self.calls]

    async def until(self, done: Callable[[], bool]) -> None:
        async with asyncio.timeout(10):
            while not done():
                self.called.clear()
                await self.called.wait()


def registered(epoch: int) -> cpb.RegisterBrokerResponse:
    return cpb.RegisterBrokerResponse(broker_epoch=epoch)


def refused(error: cpb.ErrorCode) -> cpb.RegisterBrokerResponse:
    return cpb.RegisterBrokerResponse(header=cpb.ResponseHeader(error=error, message="no"))


def answer(
    *, error: cpb.ErrorCode = cpb.NONE, fenced: bool = False, shut_down: bool = False
) -> cpb.BrokerHeartbeatResponse:
    return cpb.BrokerHeartbeatResponse(
        header=cpb.ResponseHeader(error=error), is_fenced=fenced, should_shut_down=shut_down
    )


def lifecycle_of(client: FakeClient) -> BrokerLifecycle:
    listener = mpb.Listener(name="CLIENT", host="127.0.0.1", port=9092)
    fake_client, fake_node = cast(ControllerClient, client), cast(RaftNode, FakeNode())
    return BrokerLifecycle(101, [listener], None, fake_client, fake_node, 100)


def test_a_broker_stopped_while_registering_never_registers_nor_heartbeats() -> None:
    """SIGTERM while the previous process's session holds the id: the start is cancelled,
    then the shutdown just closes (a heartbeat with no epoch would be answered "not
    registered", and registering then is the opposite of shutting down)."""

    async def main() -> None:
        client = FakeClient(
            lambda n: refused(cpb.DUPLICATE_BROKER_REGISTRATION),
            lambda r: answer(error=cpb.BROKER_ID_NOT_REGISTERED),
        )
        lifecycle = lifecycle_of(client)
        starting = asyncio.ensure_future(lifecycle.start())
        await client.until(lambda: len(client.calls) >= 1)
        starting.cancel()
        await asyncio.wait([starting])
        before = len(client.calls)
        assert not await lifecycle.shutdown(timeout_s=5)
        assert client.calls[before:] == [] and lifecycle.state is BrokerState.STOPPED

    asyncio.run(main())


def test_a_registration_lost_while_shutting_down_is_not_made_again() -> None:
    async def main() -> None:
        client = FakeClient(
            lambda n: registered(n),
            lambda r: answer(error=cpb.STALE_BROKER_EPOCH if r.want_shutdown else cpb.NONE),
        )
        lifecycle = lifecycle_of(client)
        await lifecycle.start()
        await lifecycle.wait_for(BrokerState.RUNNING, 10)
        before = len(client.calls)
        assert await lifecycle.shutdown(timeout_s=5)  # nothing held here any more
        assert client.methods()[before:] == ["BrokerHeartbeat"]
        assert lifecycle.state is BrokerState.STOPPED

    asyncio.run(main())


def test_a_failed_registration_again_is_retried_and_the_broker_runs() -> None:
    """The controller lost the registration (STALE_BROKER_EPOCH); the first registration
    again finds no controller: it is logged and retried, and the broker gets unfenced."""

    def register(n: int) -> cpb.RegisterBrokerResponse:
        if n == 2:
            raise ControllerUnavailable("RegisterBroker: no active controller answered")
        return registered(n)

    def heartbeat(request: cpb.BrokerHeartbeatRequest) -> cpb.BrokerHeartbeatResponse:
        if request.broker_epoch == 1:
            return answer(error=cpb.STALE_BROKER_EPOCH)
        return answer(shut_down=request.want_shutdown)

    async def main() -> None:
        client = FakeClient(register, heartbeat)
        lifecycle = lifecycle_of(client)
        fatal: list[str] = []
        lifecycle.on_fatal = fatal.append
        await lifecycle.start()
        await lifecycle.wait_for(BrokerState.RUNNING, 10)
        assert lifecycle.broker_epoch == 3 and client.methods().count("RegisterBroker") == 3
        assert await lifecycle.shutdown(timeout_s=5)
        assert fatal == []

    asyncio.run(main())


def test_a_refused_registration_again_ends_the_heartbeats_loudly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """INVALID_REQUEST does not pass by retrying: the heartbeats end, an ERROR says why, the
    node is told (it stops), and the shutdown after it still closes without raising."""

    def register(n: int) -> cpb.RegisterBrokerResponse:
        return registered(n) if n == 1 else refused(cpb.INVALID_REQUEST)

    async def main() -> None:
        client = FakeClient(register, lambda r: answer(error=cpb.STALE_BROKER_EPOCH))
        lifecycle = lifecycle_of(client)
        told = asyncio.Event()
        fatal: list[str] = []

        def on_fatal(reason: str) -> None:
            fatal.append(reason)
            told.set()

        lifecycle.on_fatal = on_fatal
        await lifecycle.start()
        async with asyncio.timeout(10):
            await told.wait()
        assert await lifecycle.shutdown(timeout_s=5)  # the controller holds nothing here
        assert lifecycle.state is BrokerState.STOPPED
        (reason,) = fatal
        assert "INVALID_REQUEST" in reason

    with caplog.at_level(logging.ERROR, logger="broker.lifecycle"):
        asyncio.run(main())
    assert any("heartbeats ended" in r.getMessage() for r in caplog.records), caplog.text


def test_a_controlled_shutdown_can_be_skipped() -> None:
    """A controller that never lets the broker go (a second SIGTERM's case): skipping ends
    the shutdown at once, unreleased."""

    async def main() -> None:
        client = FakeClient(registered, lambda r: answer())
        lifecycle = lifecycle_of(client)
        await lifecycle.start()
        await lifecycle.wait_for(BrokerState.RUNNING, 10)
        shutting_down = asyncio.ensure_future(lifecycle.shutdown(timeout_s=3600))
        await client.until(
            lambda: any(r.want_shutdown for m, r in client.calls if m != "RegisterBroker")
        )
        lifecycle.skip_controlled_shutdown()
        async with asyncio.timeout(10):
            assert not await shutting_down
        assert lifecycle.state is BrokerState.STOPPED

    asyncio.run(main())
