"""Carrying Raft messages between nodes: the ``Transport`` boundary and two implementations.

Failure model (the one the core is written for; Kafka's NetworkChannel assumes the same):

- **No ordering.** Messages may arrive in any order (in practice one peer's are in order).
- **No delivery guarantee.** A message may be lost: ``send`` never raises because a peer is
  down or slow; it drops the message and logs. A message to an unreachable peer is dropped
  once its RPC fails or its deadline (``request_timeout_ms``) passes.
- **No response guarantee.** A request and its response are separate one-way messages; the
  transport does not pair them, retry, or time out "requests". The core does that with ticks.
- **Bounded memory.** Each peer has a queue of at most ``max_pending_messages_per_peer``
  messages; when it is full the *oldest* is dropped (Raft prefers fresh messages).
- **Duplicates** are possible in principle (a message may be resent by the core) and harmless.
- **Hints, not facts.** The unreachable listener hears of a peer whose connection broke or
  was refused: evidence it is down, never proof (the core uses it only to campaign sooner).

``GrpcTransport`` sends each message as one unary ``RaftService.Send`` RPC
(``proto/raft.proto``) on a gRPC channel per peer; a sender task per peer drains that peer's
queue one RPC at a time, so a slow or dead peer delays only its own messages and ``send``
never waits on the network. The server decodes each ``Envelope`` (``raft/wire.py``) and hands
it to the receiver callback on the event loop. A message from a peer whose channel is
failing (gRPC waits out a reconnect backoff, up to ``reconnect_backoff_max_ms``, after the
peer went away) makes a new channel to it at once, at most every
``RECONNECT_ON_RECEIVE_MIN_INTERVAL_S``: the peer is evidently up, and the replies to its
requests would otherwise be dropped until the backoff ended (a restarted broker's first
metadata fetches waited 1 s for their answers so).

``LocalTransport`` connects nodes of one process through a ``LocalHub`` with the same model
(asynchronous delivery, bounded queues, drops by rule) for tests of the driver.

Concurrency contract: all methods are called from one asyncio event loop; nothing here is
thread-safe. The receiver callback runs on that loop and must not block.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import grpc
import grpc.aio

from proto import raft_pb2 as pb
from proto import raft_pb2_grpc
from raft.messages import Envelope
from raft.wire import WireError, envelope_from_proto, envelope_to_proto

__all__ = [
    "RECONNECT_ON_RECEIVE_MIN_INTERVAL_S",
    "DropRule",
    "GrpcTransport",
    "LocalHub",
    "LocalTransport",
    "PeerStats",
    "Receiver",
    "Transport",
    "TransportConfig",
    "TransportError",
    "UnreachableListener",
    "required_message_bytes",
]

log = logging.getLogger(__name__)

Receiver = Callable[[Envelope], None]
UnreachableListener = Callable[[int], None]  # called with the id of a peer that seems down
DropRule = Callable[[Envelope], bool]

MIB = 1024 * 1024
# Framing around the payload bytes of one message: per batch at most ~48 bytes of protobuf
# (tags, varints, lengths) against at least 61 bytes of Kafka batch header, so framing is
# below 100% of the data; plus the envelope's own fields.
ENVELOPE_OVERHEAD_BYTES = 64 * 1024


def required_message_bytes(largest_payload_bytes: int) -> int:
    """The ``max_message_bytes`` that carries a message with this many bytes of record or
    snapshot data (the largest of fetch_max_bytes, max_batch_bytes, snapshot_chunk_bytes)."""
    return 2 * largest_payload_bytes + ENVELOPE_OVERHEAD_BYTES


class TransportError(Exception):
    """The transport cannot work at all (e.g. it cannot listen on its address)."""

    retriable = False


class Transport(Protocol):
    """Best-effort, one-way delivery of Raft messages; see the module docstring's failure model.

    ``start`` before sending or receiving; ``close`` stops both and is idempotent. ``send``
    never raises for a peer that is down, slow or unknown: it drops the message and logs.
    """

    async def send(self, envelope: Envelope) -> None: ...

    def set_receiver(self, callback: Receiver) -> None: ...

    def set_unreachable_listener(self, callback: UnreachableListener) -> None: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...


# A failing peer's channel is made anew at most this often when it is heard from.
RECONNECT_ON_RECEIVE_MIN_INTERVAL_S = 0.1


@dataclass(frozen=True, slots=True)
class TransportConfig:
    """Limits of the gRPC transport; units in the names."""

    request_timeout_ms: int = 2000  # deadline of one Send RPC; then the message is dropped
    max_pending_messages_per_peer: int = 1024  # queue bound; the oldest is dropped when full
    max_message_bytes: int = required_message_bytes(8 * MIB)  # gRPC send and receive limit
    reconnect_backoff_max_ms: int = 1000  # a restarted peer is reached again within this
    close_grace_ms: int = 1000  # in-flight RPCs this node serves get this long on close

    def __post_init__(self) -> None:
        for name in self.__slots__:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")

    def check_fits(self, largest_payload_bytes: int) -> None:
        """Raise ValueError unless the largest fetch or snapshot chunk fits in one message."""
        needed = required_message_bytes(largest_payload_bytes)
        if self.max_message_bytes < needed:
            raise ValueError(
                f"max_message_bytes={self.max_message_bytes} cannot carry "
                f"{largest_payload_bytes} bytes of data; needs at least {needed}"
            )


@dataclass(slots=True)
class PeerStats:
    """Counters for one peer, for tests and metrics."""

    sent: int = 0  # acknowledged by the peer
    failed: int = 0  # RPC failed or timed out: the message was dropped
    dropped_queue_full: int = 0  # the oldest queued message was dropped for a new one


class _State(Enum):
    NEW = "new"
    STARTED = "started"
    CLOSED = "closed"


# -- gRPC ------------------------------------------------------------------------------------


class _Peer:
    """One destination: its queue, its channel and the task that drains the one into the
    other. Not started until the transport is."""

    def __init__(self, node_id: int, address: str, max_pending: int) -> None:
        self.node_id = node_id
        self.address = address
        self.queue: asyncio.Queue[pb.Envelope] = asyncio.Queue(max_pending)
        self.channel: grpc.aio.Channel | None = None
        self.tasks: list[asyncio.Task[None]] = []  # the sender and the connection watcher
        self.stats = PeerStats()
        self.failing = False  # since the last failure, nothing was acknowledged
        self.overflowing = False  # since the last drop for a full queue, likewise
        self.channel_made_s = float("-inf")  # loop time of the channel's making
        self.failed_s = float("-inf")  # loop time of the last failed send

    def offer(self, message: pb.Envelope) -> bool:
        """Queue ``message``; drop the oldest if full. Return whether one was dropped."""
        dropped = self.queue.full()
        if dropped:
            self.queue.get_nowait()
            self.stats.dropped_queue_full += 1
        self.queue.put_nowait(message)
        return dropped


class GrpcTransport:
    """``Transport`` over gRPC: a server on ``listen_address`` and a channel per peer.

    ``listen_address`` is ``host:port``; port 0 picks a free port, readable as ``port`` (and
    ``address``) after ``start``. ``peers`` maps node ids to ``host:port``; more can be added
    with ``add_peer`` (e.g. observers, which are not in the voter list). A message whose
    destination has no address is dropped. Messages sent before ``start`` wait in the queue.
    """

    def __init__(
        self,
        node_id: int,
        listen_address: str,
        peers: Mapping[int, str] | None = None,
        config: TransportConfig | None = None,
        advertised_address: str | None = None,
    ) -> None:
        self.node_id = node_id
        self._advertised_address = advertised_address
        self.config = config or TransportConfig()
        self._listen_address = listen_address
        self._peers: dict[int, _Peer] = {}
        self._receiver: Receiver | None = None
        self._unreachable: UnreachableListener | None = None
        self._server: grpc.aio.Server | None = None
        self._state = _State.NEW
        self.port: int | None = None
        self.unknown_destination_drops = 0
        self._learned: set[int] = set()  # peers known only from reply_to
        self._closing: set[asyncio.Task[None]] = set()  # channels of replaced peers, closing
        self._reply_to = ""
        self._services: list[Callable[[grpc.aio.Server], None]] = []
        for peer_id, address in (peers or {}).items():
            self.add_peer(peer_id, address)

    @property
    def address(self) -> str:
        """``host:port`` this node listens on (the bound port once started)."""
        host, _, port = self._listen_address.rpartition(":")
        return f"{host}:{self.port if self.port is not None else port}"

    @property
    def advertised_address(self) -> str:
        """Where peers send replies: ``advertised_address`` if given, else ``address``."""
        return self._advertised_address or self.address

    def stats(self, peer_id: int) -> PeerStats:
        return self._peers[peer_id].stats

    def learn_peer(self, node_id: int, address: str) -> None:
        """An address a message came with (``reply_to``): used for a node not configured
        with ``peers`` (an observer), and replaced when that node comes back elsewhere.
        A configured peer's address is never changed by what a message says."""
        known = self._peers.get(node_id)
        if known is not None and (known.address == address or node_id not in self._learned):
            return
        if known is not None:
            self._drop_peer(known)
        self._learned.add(node_id)
        log.info("node %d: node %d replies at %s", self.node_id, node_id, address)
        self.add_peer(node_id, address)

    def heard_from(self, node_id: int) -> None:
        """A message from ``node_id`` arrived, so it is up: if our channel to it is failing,
        make a new one now rather than wait out gRPC's reconnect backoff (module doc). The
        queued messages stay; one being sent on the old channel may be lost."""
        peer = self._peers.get(node_id)
        if peer is None or not peer.failing or self._state is not _State.STARTED:
            return
        if peer.failed_s < peer.channel_made_s:
            return  # the channel made since has not failed (yet)
        if asyncio.get_running_loop().time() - peer.channel_made_s < (
            RECONNECT_ON_RECEIVE_MIN_INTERVAL_S
        ):
            return
        log.info("node %d: heard from node %d: connecting to it again", self.node_id, node_id)
        for task in peer.tasks:
            task.cancel()
        if peer.channel is not None:
            self._close_later(peer.channel)
        self._start_peer(peer)

    def _close_later(self, channel: grpc.aio.Channel) -> None:
        closing = asyncio.get_running_loop().create_task(channel.close(None))
        self._closing.add(closing)  # referenced until done
        closing.add_done_callback(self._closing.discard)

    def _drop_peer(self, peer: _Peer) -> None:
        del self._peers[peer.node_id]
        for task in peer.tasks:
            task.cancel()
        if peer.channel is not None:
            self._close_later(peer.channel)

    def add_peer(self, node_id: int, address: str) -> None:
        known = self._peers.get(node_id)
        if known is not None:
            if known.address != address:
                raise ValueError(f"node {node_id} is at {known.address}, not {address}")
            return
        peer = _Peer(node_id, address, self.config.max_pending_messages_per_peer)
        self._peers[node_id] = peer
        if self._state is _State.STARTED:
            self._start_peer(peer)

    def set_receiver(self, callback: Receiver) -> None:
        self._receiver = callback

    def add_service(self, register: Callable[[grpc.aio.Server], None]) -> None:
        """Serve another gRPC service on this transport's port (the controller's API shares
        the controller listener with Raft); ``register(server)`` runs at ``start``."""
        if self._state is not _State.NEW:
            raise RuntimeError("services must be added before the transport starts")
        self._services.append(register)

    def set_unreachable_listener(self, callback: UnreachableListener) -> None:
        """``callback(peer_id)`` when a connection to that peer drops or a send to it is
        refused: a killed process is noticed at once, not after a timeout."""
        self._unreachable = callback

    async def start(self) -> None:
        if self._state is not _State.NEW:
            raise RuntimeError(f"transport of node {self.node_id} is already {self._state.value}")
        server = grpc.aio.server(options=self._server_options())
        raft_pb2_grpc.add_RaftServiceServicer_to_server(_Servicer(self), server)
        for register in self._services:
            register(server)
        try:
            port = server.add_insecure_port(self._listen_address)
        except RuntimeError as e:
            raise TransportError(
                f"node {self.node_id} cannot listen on {self._listen_address}"
            ) from e
        if port == 0:
            raise TransportError(f"node {self.node_id} cannot listen on {self._listen_address}")
        await server.start()
        self._server, self.port, self._state = server, port, _State.STARTED
        self._reply_to = self.advertised_address  # known once the port is bound
        for peer in self._peers.values():
            self._start_peer(peer)
        log.info("node %d: raft transport listening on %s", self.node_id, self.address)

    async def send(self, envelope: Envelope) -> None:
        """Queue ``envelope`` for its destination and return at once (never raises for a
        peer's sake; a payload that does not fit the wire types is a programmer error)."""
        if self._state is _State.CLOSED:
            log.debug("node %d: closed, dropping %s", self.node_id, _describe(envelope))
            return
        peer = self._peers.get(envelope.destination)
        if peer is None:
            self.unknown_destination_drops += 1
            log.warning("node %d: no address for %s", self.node_id, _describe(envelope))
            return
        if peer.offer(envelope_to_proto(envelope)):
            level = logging.DEBUG if peer.failing or peer.overflowing else logging.WARNING
            peer.overflowing = True
            log.log(
                level,
                "node %d: queue to node %d full: dropped the oldest",
                self.node_id,
                peer.node_id,
            )

    async def close(self) -> None:
        """Stop sending (queued messages are dropped) and serving; idempotent. Re-raises a
        sender task's crash, which is a bug, after cleaning up."""
        if self._state is _State.CLOSED:
            return
        self._state = _State.CLOSED
        tasks = [task for peer in self._peers.values() for task in peer.tasks]
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for peer in self._peers.values():
            if peer.channel is not None:
                await peer.channel.close(None)
            peer.tasks, peer.channel = [], None
        await asyncio.gather(*self._closing, return_exceptions=True)  # replaced channels
        if self._server is not None:
            await self._server.stop(self.config.close_grace_ms / 1000)
            self._server = None
        for result in results:
            if isinstance(result, Exception):
                raise result

    # -- internals

    def _start_peer(self, peer: _Peer) -> None:
        channel = grpc.aio.insecure_channel(peer.address, options=self._channel_options())
        peer.channel = channel
        peer.channel_made_s = asyncio.get_running_loop().time()
        loop = asyncio.get_running_loop()
        name = f"{self.node_id}-to-{peer.node_id}"
        peer.tasks = [
            loop.create_task(self._drain(peer, channel), name=f"raft-send-{name}"),
            loop.create_task(self._watch(peer, channel), name=f"raft-watch-{name}"),
        ]
        for task in peer.tasks:
            task.add_done_callback(_log_crash)

    async def _drain(self, peer: _Peer, channel: grpc.aio.Channel) -> None:
        stub = raft_pb2_grpc.RaftServiceStub(channel)
        send: grpc.aio.UnaryUnaryMultiCallable[pb.Envelope, pb.Ack] = stub.Send
        timeout_s = self.config.request_timeout_ms / 1000
        while True:
            message = await peer.queue.get()
            message.reply_to = self._reply_to  # set here: queued before start, port unknown
            try:
                await send(message, timeout=timeout_s)
            except grpc.aio.AioRpcError as e:
                peer.stats.failed += 1
                peer.failed_s = asyncio.get_running_loop().time()
                self._note_failure(peer, e)
                if e.code() is grpc.StatusCode.UNAVAILABLE:
                    self._report_unreachable(peer)
            else:
                peer.stats.sent += 1
                peer.overflowing = False
                if peer.failing:
                    peer.failing = False
                    log.info("node %d: node %d is reachable again", self.node_id, peer.node_id)

    async def _watch(self, peer: _Peer, channel: grpc.aio.Channel) -> None:
        """Report a peer whose established connection dropped: a killed process closes its
        sockets, and its followers should not wait for their next fetch to learn it."""
        ready = grpc.ChannelConnectivity.READY
        state = channel.get_state(try_to_connect=False)
        while True:
            await channel.wait_for_state_change(state)
            previous, state = state, channel.get_state(try_to_connect=False)
            if previous is ready and state is not ready:
                log.info("node %d: connection to node %d dropped", self.node_id, peer.node_id)
                self._report_unreachable(peer)

    def _report_unreachable(self, peer: _Peer) -> None:
        if self._unreachable is not None and self._state is _State.STARTED:
            self._unreachable(peer.node_id)

    def _note_failure(self, peer: _Peer, error: grpc.aio.AioRpcError) -> None:
        level = logging.DEBUG if peer.failing else logging.WARNING
        peer.failing = True
        log.log(
            level,
            "node %d: send to node %d at %s failed (%s: %s); dropping messages until it answers",
            self.node_id,
            peer.node_id,
            peer.address,
            error.code().name,
            error.details(),
        )

    def _deliver(self, envelope: Envelope) -> None:
        if self._state is not _State.STARTED or self._receiver is None:
            log.debug("node %d: not receiving, dropped %s", self.node_id, _describe(envelope))
            return
        self._receiver(envelope)

    def _message_size_options(self) -> list[tuple[str, int]]:
        return [
            ("grpc.max_send_message_length", self.config.max_message_bytes),
            ("grpc.max_receive_message_length", self.config.max_message_bytes),
        ]

    def _server_options(self) -> list[tuple[str, int]]:
        # Without this, a second node configured with the same port would bind it silently.
        return [*self._message_size_options(), ("grpc.so_reuseport", 0)]

    def _channel_options(self) -> list[tuple[str, int]]:
        backoff_ms = self.config.reconnect_backoff_max_ms
        return [
            *self._message_size_options(),
            ("grpc.initial_reconnect_backoff_ms", min(100, backoff_ms)),
            ("grpc.max_reconnect_backoff_ms", backoff_ms),
        ]


class _Servicer(raft_pb2_grpc.RaftServiceServicer):
    """Serves ``RaftService.Send``: decode, check the destination, hand to the receiver."""

    def __init__(self, transport: GrpcTransport) -> None:
        self._transport = transport

    async def Send(  # the name is the RPC's
        self, request: pb.Envelope, context: grpc.aio.ServicerContext[pb.Envelope, pb.Ack]
    ) -> pb.Ack:
        try:
            envelope = envelope_from_proto(request)
        except WireError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        node_id = self._transport.node_id
        if envelope.destination != node_id:
            # A peer's address list is wrong; delivering would confuse the core.
            log.warning("node %d: got a message for node %d", node_id, envelope.destination)
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this is node {node_id}, not node {envelope.destination}",
            )
        if request.reply_to:
            self._transport.learn_peer(envelope.source, request.reply_to)
        self._transport.heard_from(envelope.source)
        self._transport._deliver(envelope)
        return pb.Ack()


def _log_crash(task: asyncio.Task[None]) -> None:
    """A sender task ends only when cancelled; anything else is a bug: say so at once
    (``close`` re-raises it too)."""
    if not task.cancelled() and task.exception() is not None:
        log.critical("%s crashed", task.get_name(), exc_info=task.exception())


def _describe(envelope: Envelope) -> str:
    return (
        f"{type(envelope.payload).__name__} from node {envelope.source} "
        f"to node {envelope.destination}"
    )


# -- in memory -------------------------------------------------------------------------------


class LocalHub:
    """Connects ``LocalTransport``s in one event loop, with the gRPC transport's failure model.

    Delivery is asynchronous (``loop.call_soon``), never re-entering the sender; each
    destination's inbox holds at most ``max_pending_messages_per_peer`` messages and drops the
    oldest. A message is dropped if any drop rule returns True for it, or if its destination
    is unknown or closed. ``delivered`` and ``dropped`` count what happened.
    """

    def __init__(self, max_pending_messages_per_peer: int = 1024) -> None:
        if max_pending_messages_per_peer < 1:
            raise ValueError("max_pending_messages_per_peer must be at least 1")
        self.max_pending_messages_per_peer = max_pending_messages_per_peer
        self._nodes: dict[int, LocalTransport] = {}
        self._rules: list[DropRule] = []
        self.delivered = 0
        self.dropped = 0

    def transport(self, node_id: int) -> LocalTransport:
        """A new transport for ``node_id`` (again after the previous one is closed)."""
        if node_id in self._nodes:
            raise ValueError(f"node {node_id} already has an open transport")
        transport = LocalTransport(self, node_id)
        self._nodes[node_id] = transport
        return transport

    def add_drop_rule(self, rule: DropRule) -> None:
        self._rules.append(rule)

    def clear_drop_rules(self) -> None:
        self._rules.clear()

    def _route(self, envelope: Envelope) -> None:
        destination = self._nodes.get(envelope.destination)
        if destination is None or any(rule(envelope) for rule in self._rules):
            self.dropped += 1
            return
        destination._enqueue(envelope)

    def _forget(self, transport: LocalTransport) -> None:
        """A closed transport is a stopped node: the others hear it is unreachable."""
        if self._nodes.get(transport.node_id) is transport:
            del self._nodes[transport.node_id]
            for other in self._nodes.values():
                other._peer_closed(transport.node_id)


class LocalTransport:
    """One node's end of a ``LocalHub``; made by ``LocalHub.transport``."""

    def __init__(self, hub: LocalHub, node_id: int) -> None:
        self.node_id = node_id
        self._hub = hub
        self._inbox: deque[Envelope] = deque()
        self._receiver: Receiver | None = None
        self._unreachable: UnreachableListener | None = None
        self._state = _State.NEW
        self._drain_scheduled = False

    def set_receiver(self, callback: Receiver) -> None:
        self._receiver = callback

    def set_unreachable_listener(self, callback: UnreachableListener) -> None:
        self._unreachable = callback

    async def start(self) -> None:
        if self._state is not _State.NEW:
            raise RuntimeError(f"transport of node {self.node_id} is already {self._state.value}")
        self._state = _State.STARTED

    async def send(self, envelope: Envelope) -> None:
        if self._state is _State.STARTED:
            self._hub._route(envelope)
        else:
            self._hub.dropped += 1

    async def close(self) -> None:
        self._state = _State.CLOSED
        self._hub.dropped += len(self._inbox)
        self._inbox.clear()
        self._hub._forget(self)

    def _peer_closed(self, peer_id: int) -> None:
        asyncio.get_running_loop().call_soon(self._report_unreachable, peer_id)

    def _report_unreachable(self, peer_id: int) -> None:
        if self._unreachable is not None and self._state is _State.STARTED:
            self._unreachable(peer_id)

    def _enqueue(self, envelope: Envelope) -> None:
        if len(self._inbox) >= self._hub.max_pending_messages_per_peer:
            self._inbox.popleft()
            self._hub.dropped += 1
        self._inbox.append(envelope)
        if not self._drain_scheduled:
            self._drain_scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)

    def _drain(self) -> None:
        self._drain_scheduled = False
        while self._inbox:
            envelope = self._inbox.popleft()
            if self._state is not _State.STARTED or self._receiver is None:
                self._hub.dropped += 1
                continue
            self._hub.delivered += 1
            self._receiver(envelope)
