"""The Raft transport: the wire format (pure, property-tested), real gRPC transports on
127.0.0.1 exchanging envelopes, the failure model (dead peers, full queues, misrouting), and
the in-memory hub. Every wait is bounded."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import grpc
import grpc.aio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proto import raft_pb2 as pb
from raft import messages as m
from raft.messages import Envelope
from raft.transport import (
    RECONNECT_ON_RECEIVE_MIN_INTERVAL_S,
    GrpcTransport,
    LocalHub,
    TransportConfig,
    TransportError,
    required_message_bytes,
)
from raft.wire import WireError, envelope_from_proto, envelope_to_proto

T = TypeVar("T")
WAIT_S = 10.0

# -- the wire format -------------------------------------------------------------------------

int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
snapshot_ids = st.builds(m.SnapshotId, int64, int32)
batches = st.builds(m.Batch, int64, int64, int32, st.binary(max_size=300), st.booleans())
payloads: st.SearchStrategy[m.Payload] = st.one_of(
    st.builds(m.VoteRequest, int32, int32, int32, int64, st.booleans()),
    st.builds(m.VoteResponse, int32, st.booleans(), st.booleans(), int32),
    st.builds(m.BeginQuorumEpochRequest, int32, int32),
    st.builds(m.BeginQuorumEpochResponse, int32),
    st.builds(m.EndQuorumEpochRequest, int32, int32, st.tuples(int32, int32) | st.just(())),
    st.builds(m.EndQuorumEpochResponse, int32),
    st.builds(m.FetchRequest, int32, int32, int64, int32, int32),
    st.builds(
        m.FetchResponse,
        int32,
        int32,
        int64,
        int64,
        st.lists(batches, max_size=5).map(tuple),
        st.none() | st.builds(m.DivergingEpoch, int32, int64),
        st.none() | snapshot_ids,
        st.none() | int64,
        int32,
    ),
    st.builds(m.FetchSnapshotRequest, int32, int32, snapshot_ids, int64, int32),
    st.builds(
        m.FetchSnapshotResponse,
        int32,
        int32,
        snapshot_ids,
        int64,
        int64,
        st.binary(max_size=300),
        st.none() | int64,
        int32,
        st.booleans(),
    ),
)
envelopes = st.builds(Envelope, int32, int32, payloads)

ONE_OF_EACH: list[m.Payload] = [
    m.VoteRequest(3, 1, 2, 40, pre_vote=True),
    m.VoteResponse(3, granted=False, pre_vote=False, leader_id=m.NO_LEADER),
    m.BeginQuorumEpochRequest(4, 2),
    m.BeginQuorumEpochResponse(4),
    m.EndQuorumEpochRequest(4, 2, (3, 1)),
    m.EndQuorumEpochResponse(4),
    m.FetchRequest(4, 3, 100, m.NO_EPOCH, 500),
    m.FetchResponse(
        4, 2, 90, 0, (m.Batch(100, 104, 4, b"records"), m.Batch(105, 105, 4, b"", True))
    ),
    m.FetchResponse(4, 2, 90, 0, diverging=m.DivergingEpoch(3, 80)),
    m.FetchResponse(4, 2, 90, 50, snapshot_id=m.SnapshotId(50, 3), read_from=7, read_max_bytes=9),
    m.FetchSnapshotRequest(4, 3, m.SnapshotId(50, 3), 1024, 4096),
    m.FetchSnapshotResponse(4, 2, m.SnapshotId(50, 3), 0, 10, b"0123456789"),
    m.FetchSnapshotResponse(4, 2, m.SnapshotId(50, 3), 5, 10, read_position=5, missing=True),
]


def through_the_wire(envelope: Envelope) -> Envelope:
    data = envelope_to_proto(envelope).SerializeToString()
    return envelope_from_proto(pb.Envelope.FromString(data))


@pytest.mark.parametrize("payload", ONE_OF_EACH, ids=lambda p: type(p).__name__)
def test_every_payload_type_round_trips(payload: m.Payload) -> None:
    envelope = Envelope(1, 2, payload)
    assert through_the_wire(envelope) == envelope


def test_the_examples_cover_every_payload_type_and_oneof_member() -> None:
    members = pb.Envelope.DESCRIPTOR.oneofs_by_name["payload"].fields
    assert {type(p) for p in ONE_OF_EACH} == set(m.Payload.__args__)
    names = {f.message_type.name for f in members if f.message_type is not None}
    assert names == {c.__name__ for c in m.Payload.__args__}


@pytest.mark.parametrize(
    "cls", [*m.Payload.__args__, m.Batch, m.SnapshotId, m.DivergingEpoch], ids=lambda c: c.__name__
)
def test_the_proto_mirrors_each_dataclass_field_for_field(cls: type[Any]) -> None:
    proto_fields = set(getattr(pb, cls.__name__).DESCRIPTOR.fields_by_name)
    assert proto_fields == {f.name for f in dataclasses.fields(cls)}


@settings(max_examples=300, deadline=None)
@given(envelopes)
def test_any_envelope_round_trips(envelope: Envelope) -> None:
    assert through_the_wire(envelope) == envelope


def test_an_envelope_without_payload_is_a_wire_error() -> None:
    with pytest.raises(WireError, match="without a payload"):
        envelope_from_proto(pb.Envelope(source=1, destination=2))


def test_a_snapshot_request_without_snapshot_id_is_a_wire_error() -> None:
    message = pb.Envelope(source=1, destination=2)
    message.fetch_snapshot_request.epoch = 3
    with pytest.raises(WireError, match="snapshot_id"):
        envelope_from_proto(message)


def test_an_epoch_beyond_int32_is_a_programmer_error() -> None:
    with pytest.raises(ValueError):
        envelope_to_proto(Envelope(1, 2, m.BeginQuorumEpochResponse(2**31)))


# -- config ----------------------------------------------------------------------------------


def test_config_rejects_non_positive_limits() -> None:
    with pytest.raises(ValueError, match="max_pending_messages_per_peer"):
        TransportConfig(max_pending_messages_per_peer=0)


def test_the_default_message_limit_carries_an_8_mib_fetch() -> None:
    TransportConfig().check_fits(8 * 1024 * 1024)
    with pytest.raises(ValueError, match="max_message_bytes"):
        TransportConfig(max_message_bytes=required_message_bytes(1024) - 1).check_fits(1024)


# -- gRPC, for real --------------------------------------------------------------------------


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(main(), 4 * WAIT_S)

    asyncio.run(bounded())


async def eventually(condition: Callable[[], bool], what: str) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.01)

    try:
        await asyncio.wait_for(poll(), WAIT_S)
    except TimeoutError:
        pytest.fail(f"timed out waiting for {what}")


async def within(awaitable: Awaitable[T], seconds: float = WAIT_S) -> T:
    return await asyncio.wait_for(awaitable, seconds)


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Node:
    def __init__(self, node_id: int, config: TransportConfig | None = None, port: int = 0):
        self.transport = GrpcTransport(node_id, f"127.0.0.1:{port}", config=config)
        self.inbox: asyncio.Queue[Envelope] = asyncio.Queue()
        self.transport.set_receiver(self.inbox.put_nowait)
        self.unreachable: list[int] = []
        self.transport.set_unreachable_listener(self.unreachable.append)


@asynccontextmanager
async def cluster(size: int, config: TransportConfig | None = None) -> AsyncIterator[list[Node]]:
    nodes = [Node(i, config) for i in range(1, size + 1)]
    try:
        for node in nodes:
            await within(node.transport.start())
        for node in nodes:
            for other in nodes:
                if other is not node:
                    node.transport.add_peer(other.transport.node_id, other.transport.address)
        yield nodes
    finally:
        for node in nodes:
            await within(node.transport.close())


def test_three_transports_exchange_every_kind_of_message() -> None:
    async def main() -> None:
        async with cluster(3) as nodes:
            sent = []
            for node in nodes:
                for other in nodes:
                    if other is not node:
                        for payload in ONE_OF_EACH:
                            envelope = Envelope(
                                node.transport.node_id, other.transport.node_id, payload
                            )
                            await within(node.transport.send(envelope), 1)
                            sent.append(envelope)
            received = []
            for node in nodes:
                for _ in range(2 * len(ONE_OF_EACH)):
                    envelope = await within(node.inbox.get())
                    assert envelope.destination == node.transport.node_id
                    received.append(envelope)
            assert sorted(map(repr, received)) == sorted(map(repr, sent))

    run(main)


def test_a_fetch_response_larger_than_grpcs_default_4_mib_gets_through() -> None:
    async def main() -> None:
        async with cluster(2) as (a, b):
            batch = m.Batch(0, 999, 1, bytes(range(256)) * (6 * 4096))  # 6 MiB
            envelope = Envelope(1, 2, m.FetchResponse(1, 1, 1000, 0, (batch,)))
            await a.transport.send(envelope)
            assert await within(b.inbox.get()) == envelope

    run(main)


def test_a_send_to_a_dead_peer_returns_at_once_and_the_message_is_dropped() -> None:
    async def main() -> None:
        config = TransportConfig(request_timeout_ms=500)
        async with cluster(1, config) as (a,):
            a.transport.add_peer(2, f"127.0.0.1:{unused_port()}")
            for epoch in range(3):
                await within(
                    a.transport.send(Envelope(1, 2, m.BeginQuorumEpochRequest(epoch, 1))), 0.1
                )
            stats = a.transport.stats(2)
            await eventually(lambda: stats.failed == 3, "three failed sends")
            assert stats.sent == 0
            assert set(a.unreachable) == {2}  # refused: evidence the peer is down

    run(main)


def test_a_peer_whose_connection_drops_is_reported_unreachable_without_a_send() -> None:
    async def main() -> None:
        async with cluster(3) as (a, b, c):
            await a.transport.send(Envelope(1, 2, m.BeginQuorumEpochResponse(1)))
            await a.transport.send(Envelope(1, 3, m.BeginQuorumEpochResponse(1)))
            await eventually(lambda: a.transport.stats(2).sent == 1, "a connection to b")
            await eventually(lambda: a.transport.stats(3).sent == 1, "a connection to c")
            await within(b.transport.close())  # its server closes every connection
            await eventually(lambda: 2 in a.unreachable, "the report about b")
            assert a.transport.stats(2).failed == 0  # the watcher told, not a failed send
            assert 3 not in a.unreachable and 1 not in c.unreachable

    run(main)


def test_a_send_to_an_unknown_node_is_dropped_without_raising() -> None:
    async def main() -> None:
        async with cluster(1) as (a,):
            await within(a.transport.send(Envelope(1, 9, m.BeginQuorumEpochResponse(1))), 0.1)
            assert a.transport.unknown_destination_drops == 1

    run(main)


def test_a_full_queue_drops_the_oldest_message() -> None:
    async def main() -> None:
        b = Node(2)
        await within(b.transport.start())
        config = TransportConfig(max_pending_messages_per_peer=2)
        a = GrpcTransport(1, "127.0.0.1:0", {2: b.transport.address}, config)
        try:
            for epoch in range(1, 6):  # queued: not started yet
                await a.send(Envelope(1, 2, m.BeginQuorumEpochResponse(epoch)))
            assert a.stats(2).dropped_queue_full == 3
            await within(a.start())
            got = [await within(b.inbox.get()) for _ in range(2)]
            assert [e.payload for e in got] == [
                m.BeginQuorumEpochResponse(4),
                m.BeginQuorumEpochResponse(5),
            ]
            await eventually(lambda: a.stats(2).sent == 2, "two acknowledgements")
            assert b.inbox.empty()
        finally:
            await within(a.close())
            await within(b.transport.close())

    run(main)


def test_a_message_for_another_node_is_refused_not_delivered() -> None:
    async def main() -> None:
        async with cluster(2) as (a, b):
            a.transport.add_peer(3, b.transport.address)  # a wrong address book
            await a.transport.send(Envelope(1, 3, m.BeginQuorumEpochResponse(1)))
            await eventually(lambda: a.transport.stats(3).failed == 1, "the refusal")
            assert b.inbox.empty()

    run(main)


async def restart_peer_after_a_failed_send(a: Node, config: TransportConfig) -> Node:
    """Node 2, known to ``a``, fails a send from ``a`` while down, then starts."""
    port = unused_port()
    a.transport.add_peer(2, f"127.0.0.1:{port}")
    await a.transport.send(Envelope(1, 2, m.BeginQuorumEpochResponse(1)))
    await eventually(lambda: a.transport.stats(2).failed == 1, "a failed send")
    b = Node(2, config, port)
    await within(b.transport.start())
    return b


def test_a_restarted_peer_is_reached_again() -> None:
    async def main() -> None:
        config = TransportConfig(request_timeout_ms=300, reconnect_backoff_max_ms=200)
        async with cluster(1, config) as (a,):
            b = await restart_peer_after_a_failed_send(a, config)
            try:
                while b.inbox.empty():  # bounded by run()'s deadline
                    await a.transport.send(Envelope(1, 2, m.BeginQuorumEpochResponse(2)))
                    await asyncio.sleep(0.05)
                assert (await within(b.inbox.get())).payload == m.BeginQuorumEpochResponse(2)
            finally:
                await within(b.transport.close())

    run(main)


def test_a_failing_peer_heard_from_gets_a_new_channel_at_once() -> None:
    """A peer that went away leaves our channel to it in gRPC's reconnect backoff (up to
    reconnect_backoff_max_ms); a message from it proves it is back, so the channel is made
    anew then and there instead of dropping our replies until the backoff ends. A peer whose
    channel has not failed since it was made keeps it."""

    async def main() -> None:
        config = TransportConfig(request_timeout_ms=300, reconnect_backoff_max_ms=30_000)
        async with cluster(1, config) as (a,):
            b = await restart_peer_after_a_failed_send(a, config)
            failed_channel = a.transport._peers[2].channel
            b.transport.add_peer(1, a.transport.address)
            try:
                await asyncio.sleep(RECONNECT_ON_RECEIVE_MIN_INTERVAL_S)  # the rate limit
                await b.transport.send(Envelope(2, 1, m.BeginQuorumEpochResponse(2)))
                assert (await within(a.inbox.get())).payload == m.BeginQuorumEpochResponse(2)
                renewed = a.transport._peers[2].channel
                assert renewed is not failed_channel, "the failing channel was kept"
                await asyncio.sleep(RECONNECT_ON_RECEIVE_MIN_INTERVAL_S)
                await b.transport.send(Envelope(2, 1, m.BeginQuorumEpochResponse(3)))
                await within(a.inbox.get())  # nothing sent on the new channel: it has not failed
                assert a.transport._peers[2].channel is renewed, "a new channel was replaced"
                await a.transport.send(Envelope(1, 2, m.BeginQuorumEpochResponse(4)))
                assert (await within(b.inbox.get())).payload == m.BeginQuorumEpochResponse(4)
            finally:
                await within(b.transport.close())

    run(main)


def test_listening_on_a_port_in_use_fails_loudly() -> None:
    async def main() -> None:
        async with cluster(1) as (a,):
            b = GrpcTransport(2, a.transport.address)
            with pytest.raises(TransportError, match="cannot listen"):
                await within(b.start())
            await within(b.close())

    run(main)


def test_close_leaves_no_tasks_and_later_sends_are_dropped() -> None:
    async def main() -> None:
        before = asyncio.all_tasks()
        async with cluster(3) as nodes:
            await nodes[0].transport.send(Envelope(1, 2, m.BeginQuorumEpochResponse(1)))
            await within(nodes[1].inbox.get())
        for node in nodes:
            await within(node.transport.close())  # idempotent
            await within(node.transport.send(Envelope(1, 2, m.BeginQuorumEpochResponse(1))), 0.1)
        await asyncio.sleep(0.05)
        assert asyncio.all_tasks() == before

    run(main)


def test_start_twice_is_a_programmer_error() -> None:
    async def main() -> None:
        async with cluster(1) as (a,):
            with pytest.raises(RuntimeError, match="already started"):
                await a.transport.start()

    run(main)


# -- in memory -------------------------------------------------------------------------------


class LocalNode:
    def __init__(self, hub: LocalHub, node_id: int) -> None:
        self.transport = hub.transport(node_id)
        self.received: list[Envelope] = []
        self.transport.set_receiver(self.received.append)


def test_the_local_hub_delivers_asynchronously_and_by_destination() -> None:
    async def main() -> None:
        hub = LocalHub()
        a, b, c = (LocalNode(hub, i) for i in (1, 2, 3))
        for node in (a, b, c):
            await node.transport.start()
        await a.transport.send(Envelope(1, 2, m.BeginQuorumEpochResponse(1)))
        await a.transport.send(Envelope(1, 3, m.BeginQuorumEpochResponse(2)))
        assert b.received == []  # never re-enters the caller
        await asyncio.sleep(0)
        assert [e.payload for e in b.received] == [m.BeginQuorumEpochResponse(1)]
        assert [e.payload for e in c.received] == [m.BeginQuorumEpochResponse(2)]
        assert (hub.delivered, hub.dropped) == (2, 0)

    run(main)


def test_the_local_hub_drops_by_rule_and_heals() -> None:
    async def main() -> None:
        hub = LocalHub()
        a, b = LocalNode(hub, 1), LocalNode(hub, 2)
        for node in (a, b):
            await node.transport.start()
        hub.add_drop_rule(lambda e: (e.source, e.destination) == (1, 2))  # one-way partition
        await a.transport.send(Envelope(1, 2, m.BeginQuorumEpochResponse(1)))
        await b.transport.send(Envelope(2, 1, m.BeginQuorumEpochResponse(1)))
        await asyncio.sleep(0)
        assert (len(a.received), len(b.received), hub.dropped) == (1, 0, 1)
        hub.clear_drop_rules()
        await a.transport.send(Envelope(1, 2, m.BeginQuorumEpochResponse(2)))
        await asyncio.sleep(0)
        assert len(b.received) == 1

    run(main)


def test_the_local_hub_bounds_each_inbox_dropping_the_oldest() -> None:
    async def main() -> None:
        hub = LocalHub(max_pending_messages_per_peer=2)
        a, b = LocalNode(hub, 1), LocalNode(hub, 2)
        for node in (a, b):
            await node.transport.start()
        for epoch in range(1, 6):
            await a.transport.send(Envelope(1, 2, m.BeginQuorumEpochResponse(epoch)))
        await asyncio.sleep(0)
        assert [e.payload.epoch for e in b.received] == [4, 5]
        assert hub.dropped == 3

    run(main)


def test_closing_a_local_node_reports_it_unreachable_to_the_others() -> None:
    async def main() -> None:
        hub = LocalHub()
        nodes = [LocalNode(hub, i) for i in (1, 2, 3)]
        reports: dict[int, list[int]] = {1: [], 2: [], 3: []}
        for node in nodes:
            node.transport.set_unreachable_listener(reports[node.transport.node_id].append)
            await node.transport.start()
        await nodes[1].transport.close()
        await asyncio.sleep(0)
        assert reports == {1: [2], 2: [], 3: [2]}

    run(main)


def test_a_closed_local_node_gets_nothing_and_can_be_restarted() -> None:
    async def main() -> None:
        hub = LocalHub()
        a, b = LocalNode(hub, 1), LocalNode(hub, 2)
        for node in (a, b):
            await node.transport.start()
        await a.transport.send(Envelope(1, 2, m.BeginQuorumEpochResponse(1)))
        await b.transport.close()  # before delivery: the message is lost with the node
        await a.transport.send(Envelope(1, 2, m.BeginQuorumEpochResponse(2)))
        await asyncio.sleep(0)
        assert b.received == [] and hub.dropped == 2
        b2 = LocalNode(hub, 2)
        await b2.transport.start()
        await a.transport.send(Envelope(1, 2, m.BeginQuorumEpochResponse(3)))
        await asyncio.sleep(0)
        assert [e.payload for e in b2.received] == [m.BeginQuorumEpochResponse(3)]

    run(main)


def test_a_node_learns_an_observers_address_from_its_messages() -> None:
    async def main() -> None:
        async with cluster(1) as (leader,):
            observer = Node(7)  # not in the leader's peers
            observer.transport.add_peer(1, leader.transport.address)
            await within(observer.transport.start())
            try:
                request = m.FetchRequest(1, 7, 0, 0, 0)
                await observer.transport.send(Envelope(7, 1, request))
                assert (await within(leader.inbox.get())).payload == request
                reply = m.FetchResponse(1, 1, 0, 0)
                await leader.transport.send(Envelope(1, 7, reply))
                assert (await within(observer.inbox.get())).payload == reply
                assert leader.transport.unknown_destination_drops == 0
            finally:
                await within(observer.transport.close())

    run(main)


def test_a_message_queued_before_start_carries_the_port_bound_at_start() -> None:
    async def main() -> None:
        async with cluster(1) as (leader,):
            observer = Node(7)  # listens on port 0: its port is known only once started
            observer.transport.add_peer(1, leader.transport.address)
            request = m.FetchRequest(1, 7, 0, 0, 0)
            await observer.transport.send(Envelope(7, 1, request))  # queued, not sent
            await within(observer.transport.start())
            try:
                assert (await within(leader.inbox.get())).payload == request
                reply = m.FetchResponse(1, 1, 0, 0)
                await leader.transport.send(Envelope(1, 7, reply))
                assert (await within(observer.inbox.get())).payload == reply
            finally:
                await within(observer.transport.close())

    run(main)


def test_a_configured_peers_address_is_not_changed_by_what_a_message_says() -> None:
    async def main() -> None:
        async with cluster(2) as (a, b):
            a.transport.learn_peer(2, "127.0.0.1:1")  # a lie: b is configured elsewhere
            await a.transport.send(Envelope(1, 2, m.BeginQuorumEpochResponse(1)))
            assert (await within(b.inbox.get())).payload == m.BeginQuorumEpochResponse(1)

    run(main)


def test_another_service_is_served_on_the_transports_port() -> None:
    def ping(request: bytes, context: object) -> bytes:
        return b"pong:" + request

    handler = grpc.method_handlers_generic_handler(
        "test.Echo", {"Ping": grpc.unary_unary_rpc_method_handler(ping)}
    )

    async def main() -> None:
        node = Node(1)
        node.transport.add_service(lambda server: server.add_generic_rpc_handlers((handler,)))
        await within(node.transport.start())
        try:
            async with grpc.aio.insecure_channel(node.transport.address) as channel:
                call = channel.unary_unary("/test.Echo/Ping")
                assert await within(call(b"hi")) == b"pong:hi"
            with pytest.raises(RuntimeError):
                node.transport.add_service(lambda server: None)
        finally:
            await within(node.transport.close())

    run(main)
