"""Resource limits of the gRPC transport: the learned-peer bookkeeping (pure), a flood of
invented source ids against a real transport (the peer table stays at its cap, a real
observer is still answered, configured peers stay), idle learned peers forgotten with their
channel and tasks, and the server's concurrent-RPC bound with its RESOURCE_EXHAUSTED retried
by the Raft sender and the controller client. Every wait is bounded."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import grpc.aio
import pytest
from test_transport import WAIT_S, Node, eventually, run, unused_port, within

from controller.client import ControllerClient, RetryPolicy
from proto import controller_pb2 as cpb
from proto import controller_pb2_grpc, raft_pb2_grpc
from raft import messages as m
from raft.messages import Envelope
from raft.transport import (
    RECONNECT_ON_RECEIVE_MIN_INTERVAL_S,
    LearnedPeers,
    LogThrottle,
    TransportConfig,
    required_message_bytes,
)
from raft.wire import envelope_to_proto

# -- pure: the bookkeeping -------------------------------------------------------------------


def test_at_the_cap_the_least_recently_heard_learned_peer_makes_room() -> None:
    peers = LearnedPeers(max_peers=3, max_idle_s=60)
    for node_id, now_s in ((7, 0.0), (8, 1.0), (9, 2.0)):
        assert peers.add(node_id, now_s) == []
    peers.heard(7, 3.0)  # 7 fetched again: 8 is now the least recently heard
    assert peers.add(10, 4.0) == [8]
    assert peers.add(11, 5.0) == [9]
    assert len(peers) == 3 and 7 in peers and 8 not in peers
    assert peers.add(7, 6.0) == []  # learning one again (a new address) takes no room


def test_a_learned_peer_idle_too_long_is_forgotten_and_one_heard_from_is_not() -> None:
    peers = LearnedPeers(max_peers=10, max_idle_s=60)
    peers.add(7, 0.0)
    peers.add(8, 10.0)
    peers.heard(7, 30.0)
    peers.heard(5, 30.0)  # not learned (a configured peer): nothing to do
    assert 5 not in peers
    assert peers.expired(80.0) == [8]  # idle 70 s; 7 only 50 s
    assert len(peers) == 1 and 7 in peers


def test_expiry_takes_exactly_those_idle_beyond_the_limit() -> None:
    peers = LearnedPeers(max_peers=10, max_idle_s=60)
    for node_id, now_s in ((7, 0.0), (8, 10.0), (9, 20.0)):
        peers.add(node_id, now_s)
    assert peers.expired(60.0) == []  # 7 idle exactly 60 s: not beyond
    assert peers.expired(75.0) == [7, 8]
    assert len(peers) == 1 and 9 in peers


def test_learned_peers_refuses_limits_that_would_keep_nothing() -> None:
    with pytest.raises(ValueError):
        LearnedPeers(0, 60)
    with pytest.raises(ValueError):
        LearnedPeers(1, 0)


def test_a_throttled_line_comes_at_once_then_once_per_interval_with_a_count() -> None:
    throttle = LogThrottle(interval_s=10)
    assert throttle.ready(100.0) == 0
    assert [throttle.ready(t) for t in (101.0, 105.0, 109.9)] == [None, None, None]
    assert throttle.ready(110.0) == 3
    assert throttle.ready(115.0) is None
    assert throttle.ready(200.0) == 1


def test_the_transport_config_checks_its_new_limits() -> None:
    for name in (
        "max_learned_peers",
        "learned_peer_max_idle_ms",
        "max_concurrent_rpcs",
        "max_connections",
        "max_inbox_bytes",
    ):
        with pytest.raises(ValueError, match=name):
            TransportConfig(**{name: 0})
    with pytest.raises(ValueError, match=r"max_inbox_bytes .* must be at least max_message_bytes"):
        TransportConfig(max_inbox_bytes=required_message_bytes(8 * 1024 * 1024) - 1)


# -- real gRPC: learned peers ----------------------------------------------------------------


async def raw_send(address: str, source: int, destination: int, reply_to: str) -> None:
    """One Send RPC as anyone who reaches the port could make it."""
    message = envelope_to_proto(Envelope(source, destination, m.FetchRequest(1, source, 0, 0, 0)))
    message.reply_to = reply_to
    async with grpc.aio.insecure_channel(address) as channel:
        await raft_pb2_grpc.RaftServiceStub(channel).Send(message, timeout=WAIT_S)


def sender_tasks(node_id: int) -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().endswith(f"-to-{node_id}")]


def test_a_flood_of_invented_source_ids_keeps_the_peer_table_at_its_cap(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cap, flood = 8, 200
    caplog.set_level(logging.INFO, logger="raft.transport")

    async def main() -> None:
        leader = Node(1, TransportConfig(max_learned_peers=cap))
        voter, observer = Node(2), Node(7)
        for node in (leader, voter, observer):
            await within(node.transport.start())
        leader.transport.add_peer(2, voter.transport.address)  # configured
        observer.transport.add_peer(1, leader.transport.address)
        try:
            nowhere = f"127.0.0.1:{unused_port()}"
            async with grpc.aio.insecure_channel(leader.transport.address) as channel:
                send = raft_pb2_grpc.RaftServiceStub(channel).Send
                for source in range(1000, 1000 + flood):
                    request = envelope_to_proto(Envelope(source, 1, m.FetchRequest(1, 0, 0, 0, 0)))
                    request.reply_to = nowhere
                    await send(request, timeout=WAIT_S)
                    assert leader.transport.learned_peer_count <= cap
                    if source % 50 == 0:  # a real observer fetching in the middle of it
                        await observer_round_trip(leader, observer)
            assert leader.transport.peer_count <= cap + 1  # the learned ones + voter 2
            assert leader.transport.forgotten_learned_peers >= flood - cap
            await observer_round_trip(leader, observer)
            # The configured peer was never forgotten.
            await leader.transport.send(Envelope(1, 2, m.BeginQuorumEpochRequest(3, 1)))
            assert (await within(voter.inbox.get())).payload == m.BeginQuorumEpochRequest(3, 1)
            await asyncio.sleep(0)  # the forgotten peers' cancelled tasks finish
            assert sender_tasks(1000) == []
            # Said, but not once per message: the first at once, then once per interval.
            lines = [r.getMessage() for r in caplog.records]
            assert 1 <= sum("to learn another" in line for line in lines) <= 2
            assert sum(" replies at " in line for line in lines) <= 2
        finally:
            for node in (observer, voter, leader):
                await within(node.transport.close())

    run(main)


async def observer_round_trip(leader: Node, observer: Node) -> None:
    """The observer fetches; the leader, which knows it only from the fetch, answers it."""
    request = m.FetchRequest(1, 7, 0, 0, 0)
    await observer.transport.send(Envelope(7, 1, request))
    while (await within(leader.inbox.get())).source != 7:
        pass  # the flood's messages
    reply = m.FetchResponse(1, 1, 0, 0)
    await leader.transport.send(Envelope(1, 7, reply))
    assert (await within(observer.inbox.get())).payload == reply


def test_a_learned_peer_idle_too_long_is_forgotten_and_learned_again_when_it_returns() -> None:
    idle_ms = 300

    async def main() -> None:
        leader = Node(1, TransportConfig(learned_peer_max_idle_ms=idle_ms))
        observer, other = Node(7), Node(8)
        for node in (leader, observer, other):
            await within(node.transport.start())
        for node in (observer, other):
            node.transport.add_peer(1, leader.transport.address)
        try:
            await observer_round_trip(leader, observer)
            assert leader.transport.learned_peer_count == 1 and sender_tasks(7) != []
            await asyncio.sleep(idle_ms / 1000 + 0.1)
            # Expiry is checked as messages arrive: any sender's will do.
            await other.transport.send(Envelope(8, 1, m.FetchRequest(1, 8, 0, 0, 0)))
            await within(leader.inbox.get())
            await eventually(lambda: sender_tasks(7) == [], "the idle peer's tasks to end")
            assert leader.transport.forgotten_learned_peers == 1
            assert leader.transport.learned_peer_count == 1  # node 8, just heard
            await observer_round_trip(leader, observer)  # back: learned again, answered
            assert leader.transport.learned_peer_count == 2
        finally:
            for node in (observer, other, leader):
                await within(node.transport.close())

    run(main)


# -- real gRPC: the concurrent-RPC bound -----------------------------------------------------


class _Hold:
    """A service that holds its RPC until released: it fills the server's RPC slots."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = asyncio.Event()

    def register(self, server: grpc.aio.Server) -> None:
        async def hold(request: bytes, context: object) -> bytes:
            self.started.set()
            await self.release.wait()
            return b""

        handler = grpc.method_handlers_generic_handler(
            "test.Hold", {"Hold": grpc.unary_unary_rpc_method_handler(hold)}
        )
        server.add_generic_rpc_handlers((handler,))

    async def occupy(self, address: str) -> asyncio.Task[Any]:
        channel = grpc.aio.insecure_channel(address)
        call = channel.unary_unary("/test.Hold/Hold")

        async def held() -> None:
            try:
                await call(b"", timeout=4 * WAIT_S)
            finally:
                await channel.close(None)

        task = asyncio.create_task(held())
        await within(self.started.wait())
        return task


def test_an_rpc_beyond_the_bound_is_refused_and_the_raft_sender_keeps_its_channel() -> None:
    async def main() -> None:
        hold = _Hold()
        a, b = Node(1), Node(2, TransportConfig(max_concurrent_rpcs=1))
        b.transport.add_service(hold.register)
        for node in (a, b):
            await within(node.transport.start())
        a.transport.add_peer(2, b.transport.address)
        b.transport.add_peer(1, a.transport.address)
        held = await hold.occupy(b.transport.address)
        try:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await raw_send(b.transport.address, 1, 2, "")
            assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
            channel = a.transport._peers[2].channel
            await a.transport.send(Envelope(1, 2, m.BeginQuorumEpochResponse(1)))
            await eventually(lambda: a.transport.stats(2).failed == 1, "the refused send")
            await asyncio.sleep(RECONNECT_ON_RECEIVE_MIN_INTERVAL_S * 1.5)
            await b.transport.send(Envelope(2, 1, m.BeginQuorumEpochRequest(1, 2)))
            assert (await within(a.inbox.get())).source == 2
            # Busy is not gone: node 1 heard from node 2 and kept its working channel.
            assert a.transport._peers[2].channel is channel
            hold.release.set()
            await within(held)
            await a.transport.send(Envelope(1, 2, m.BeginQuorumEpochResponse(2)))
            assert (await within(b.inbox.get())).payload == m.BeginQuorumEpochResponse(2)
        finally:
            hold.release.set()
            for node in (a, b):
                await within(node.transport.close())

    run(main)


def test_a_connection_beyond_the_bound_is_closed_and_one_is_taken_once_another_leaves() -> None:
    async def main() -> None:
        node = Node(1, TransportConfig(max_connections=2))
        await within(node.transport.start())
        own_pool = [("grpc.use_local_subchannel_pool", 1)]  # a connection per channel
        channels = [
            grpc.aio.insecure_channel(node.transport.address, options=own_pool) for _ in range(3)
        ]

        async def ping(channel: grpc.aio.Channel) -> grpc.StatusCode:
            message = envelope_to_proto(Envelope(7, 1, m.FetchRequest(1, 7, 0, 0, 0)))
            try:
                await raft_pb2_grpc.RaftServiceStub(channel).Send(message, timeout=WAIT_S)
            except grpc.aio.AioRpcError as e:
                return e.code()
            return grpc.StatusCode.OK

        try:
            codes = [await ping(channel) for channel in channels]
            assert codes == [grpc.StatusCode.OK] * 2 + [grpc.StatusCode.UNAVAILABLE]
            await channels.pop(0).close()
            # The server sees the close a moment later: fresh channels until one is let in.
            deadline = asyncio.get_running_loop().time() + WAIT_S
            while True:
                channels.append(grpc.aio.insecure_channel(node.transport.address, options=own_pool))
                code = await ping(channels[-1])
                if code is grpc.StatusCode.OK or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.05)
            assert code is grpc.StatusCode.OK
            assert await ping(channels[0]) is grpc.StatusCode.OK  # the others kept theirs
        finally:
            for channel in channels:
                await channel.close()
            await within(node.transport.close())

    run(main)


class _Controller(controller_pb2_grpc.ControllerServiceServicer):
    """Broker 1's heartbeat hangs until released; the others are answered at once, noting
    whether the release had come (the one slot was free only then)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.answered_after_release: list[bool] = []

    async def BrokerHeartbeat(self, request: Any, context: Any) -> cpb.BrokerHeartbeatResponse:
        if request.broker_id == 1:
            self.started.set()
            await self.release.wait()
        else:
            self.answered_after_release.append(self.release.is_set())
        return cpb.BrokerHeartbeatResponse(is_fenced=False)


def test_the_controller_client_retries_a_controller_at_its_rpc_bound() -> None:
    async def main() -> None:
        controller = _Controller()
        node = Node(1, TransportConfig(max_concurrent_rpcs=1))
        node.transport.add_service(
            lambda server: controller_pb2_grpc.add_ControllerServiceServicer_to_server(
                controller, server
            )
        )
        await within(node.transport.start())
        client = ControllerClient({1: node.transport.address}, RetryPolicy(retry_backoff_ms=20))
        hanging = asyncio.create_task(
            client.call("BrokerHeartbeat", cpb.BrokerHeartbeatRequest(broker_id=1))
        )
        try:
            await within(controller.started.wait())
            asked = asyncio.create_task(
                client.call("BrokerHeartbeat", cpb.BrokerHeartbeatRequest(broker_id=2))
            )
            await asyncio.sleep(0.3)  # refused RESOURCE_EXHAUSTED meanwhile, and retried
            assert not asked.done()
            controller.release.set()
            response = await within(asked)
            assert not response.is_fenced
            assert controller.answered_after_release == [True]
            await within(hanging)
        finally:
            controller.release.set()
            hanging.cancel()
            await client.close()
            await within(node.transport.close())

    run(main)


def test_a_message_from_the_nodes_own_id_is_refused_and_not_learned(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another process configured with this node's id (or a forgery) must not become a peer:
    this node would send its own messages to that address."""
    caplog.set_level(logging.WARNING, logger="raft.transport")

    async def main() -> None:
        node = Node(1)
        await within(node.transport.start())
        try:
            elsewhere = f"127.0.0.1:{unused_port()}"
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await raw_send(node.transport.address, 1, 1, elsewhere)
            assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert (node.transport.learned_peer_count, node.transport.peer_count) == (0, 0)
            assert node.inbox.empty()
        finally:
            await within(node.transport.close())

    run(main)
    assert any("this node's id" in r.getMessage() for r in caplog.records)
