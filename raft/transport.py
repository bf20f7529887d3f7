"""Carrying Raft messages between nodes: the ``Transport`` boundary and two implementations.

Failure model (the one the core is written for; Kafka's NetworkChannel assumes the same):

- **No ordering.** Messages may arrive in any order (in practice one peer's are in order).
- **No delivery guarantee.** A message may be lost: ``send`` never raises because a peer is
  down or slow; it drops the message and logs. A message to an unreachable peer is dropped
  once its RPC fails or its deadline (``request_timeout_ms``) passes.
- **No response guarantee.** A request and its response are separate one-way messages; the
  transport does not pair them, retry, or time out "requests". The core does that with ticks.
- **Bounded memory.** Each peer has a queue of at most ``max_pending_messages_per_peer``
  messages; when it is full the *oldest* is dropped (Raft prefers fresh messages). The
  server runs at most ``max_concurrent_rpcs`` RPCs at once (Raft's and the services added to
  it); one more is refused RESOURCE_EXHAUSTED, which every client of it retries (a Raft
  message so refused is dropped like any other; the core resends). It holds at most
  ``max_connections`` connections; one more is closed as it arrives.
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

Learned peers. A node that is not configured (a broker: a Raft observer) is answered at the
``reply_to`` address its messages carry, so the server learns a peer from any message, and
anyone who reaches the port could make it hold a channel, two tasks and a queue per source id
it invents. So at most ``max_learned_peers`` are kept (``LearnedPeers``): a learned peer not
heard from for ``learned_peer_max_idle_ms`` is forgotten (checked as messages arrive), and
at the cap a new one makes the least recently heard one forgotten. Evicting rather than
refusing: a flood of invented ids cannot lock out a broker that starts or moves later, and a
live broker, heard from at every fetch (a few times a second), is the last to go and is
learned again from its next message. The cap must exceed the number of brokers (each
controller may learn every one). A configured peer is never forgotten. What is dropped is
logged at most every ``LOG_INTERVAL_S`` per kind, with a count.

``LocalTransport`` connects nodes of one process through a ``LocalHub`` with the same model
(asynchronous delivery, bounded queues, drops by rule) for tests of the driver.

Concurrency contract: all methods are called from one asyncio event loop; nothing here is
thread-safe. The receiver callback runs on that loop and must not block.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import grpc
import grpc.aio

from proto import raft_pb2 as pb
from proto import raft_pb2_grpc
from raft.log_throttle import LOG_INTERVAL_S, LogThrottle, more
from raft.messages import Envelope
from raft.wire import WireError, envelope_from_proto, envelope_to_proto

__all__ = [
    "LOG_INTERVAL_S",
    "RECONNECT_ON_RECEIVE_MIN_INTERVAL_S",
    "DropRule",
    "GrpcTransport",
    "LearnedPeers",
    "LocalHub",
    "LocalTransport",
    "LogThrottle",
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
    # Peers known only from the reply_to of their messages (brokers); at the cap the least
    # recently heard is forgotten. About 15 KiB each while idle (a channel, two tasks).
    max_learned_peers: int = 4096
    # A learned peer not heard from this long is forgotten (Kafka closes a connection idle
    # for connections.max.idle.ms, 10 minutes); a live broker fetches several times a second.
    learned_peer_max_idle_ms: int = 600_000
    # RPCs the server runs at once, Raft's and the controller API's together; one more is
    # refused RESOURCE_EXHAUSTED. A broker holds at most about 3 (its metadata fetch, its
    # heartbeat, its AlterPartition) plus the admin requests it forwards.
    max_concurrent_rpcs: int = 10_000
    # Connections the server holds at once; one more is closed as it arrives (the client
    # sees UNAVAILABLE and retries). A broker holds up to two to a controller (the metadata
    # log's and the controller API's), a controller one to each broker; ~18 KiB each idle.
    max_connections: int = 4096
    # Received messages waiting for the Raft loop (raft/driver.py), by their estimated size;
    # one that would go beyond is dropped. Legitimately about one fetch answer at a time.
    max_inbox_bytes: int = 64 * MIB

    def __post_init__(self) -> None:
        for name in self.__slots__:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_inbox_bytes < self.max_message_bytes:
            raise ValueError(
                f"max_inbox_bytes ({self.max_inbox_bytes}) must be at least "
                f"max_message_bytes ({self.max_message_bytes}), or the largest message "
                "could be dropped on arrival"
            )

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


class LearnedPeers:
    """Which learned peers to keep (module doc): at most ``max_peers``, each forgotten once
    not heard from for longer than ``max_idle_s`` (looked for at most every tenth of that,
    up to a second: ``heard`` and ``expired`` run for every message received); at the cap
    the least recently heard one makes room. Pure bookkeeping: the caller passes the time
    (seconds, any monotonic origin) and drops what it is told to."""

    def __init__(self, max_peers: int, max_idle_s: float) -> None:
        if max_peers < 1 or max_idle_s <= 0:
            raise ValueError(f"need max_peers >= 1 and max_idle_s > 0: {max_peers}, {max_idle_s}")
        self.max_peers = max_peers
        self.max_idle_s = max_idle_s
        self._heard: OrderedDict[int, float] = OrderedDict()  # least recently heard first
        self._check_every_s = min(1.0, max_idle_s / 10)
        self._next_check_s = float("-inf")

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._heard

    def __len__(self) -> int:
        return len(self._heard)

    def add(self, node_id: int, now_s: float) -> list[int]:
        """Learn ``node_id`` (heard from now); return the peers to forget to make room."""
        evicted = []
        self._heard.pop(node_id, None)
        while len(self._heard) >= self.max_peers:
            evicted.append(self._heard.popitem(last=False)[0])
        self._heard[node_id] = now_s
        return evicted

    def heard(self, node_id: int, now_s: float) -> None:
        """A message from ``node_id`` arrived; nothing happens unless it is learned."""
        if node_id in self._heard:
            self._heard[node_id] = now_s
            self._heard.move_to_end(node_id)

    def expired(self, now_s: float) -> Sequence[int]:
        """Forget and return the peers not heard from for longer than ``max_idle_s``."""
        if now_s < self._next_check_s:
            return ()
        self._next_check_s = now_s + self._check_every_s
        expired = []
        for node_id, heard_s in self._heard.items():  # least recently heard first
            if now_s - heard_s <= self.max_idle_s:
                break
            expired.append(node_id)
        for node_id in expired:
            del self._heard[node_id]
        return expired


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
    with ``add_peer`` (e.g. observers, which are not in the voter list), and are kept like
    them; the peers learned from messages are bounded (module doc). A message whose
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
        self.forgotten_learned_peers = 0  # idle, or made room for another at the cap
        self._learned = LearnedPeers(  # peers known only from reply_to
            self.config.max_learned_peers, self.config.learned_peer_max_idle_ms / 1000
        )
        kinds = ("learned", "evicted", "idle", "unknown", "misrouted", "own-id", "learned-peer")
        self._logs = {kind: LogThrottle() for kind in kinds}
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

    @property
    def peer_count(self) -> int:
        """Peers this node holds a queue and a channel for, configured and learned."""
        return len(self._peers)

    @property
    def learned_peer_count(self) -> int:
        return len(self._learned)

    def learn_peer(self, node_id: int, address: str) -> None:
        """An address a message came with (``reply_to``): used for a node not configured
        with ``peers`` (an observer), and replaced when that node comes back elsewhere.
        A configured peer's address is never changed by what a message says. At the cap the
        least recently heard learned peer is forgotten to make room (module doc)."""
        known = self._peers.get(node_id)
        if known is not None and (known.address == address or node_id not in self._learned):
            return
        if known is not None:
            self._drop_peer(known)
        now_s = time.monotonic()
        for evicted in self._learned.add(node_id, now_s):
            self._forget(evicted, "evicted", now_s)
        quiet = self._logs["learned"].ready(now_s)
        if quiet is not None:
            log.info(
                "node %d: node %d replies at %s%s", self.node_id, node_id, address, more(quiet)
            )
        self.add_peer(node_id, address)

    def heard_from(self, node_id: int) -> None:
        """A message from ``node_id`` arrived, so it is up: it is the last learned peer to be
        forgotten, and learned peers idle too long are forgotten now. If our channel to it is
        failing, make a new one now rather than wait out gRPC's reconnect backoff (module
        doc). The queued messages stay; one being sent on the old channel may be lost."""
        now_s = time.monotonic()
        self._learned.heard(node_id, now_s)
        for idle in self._learned.expired(now_s):
            self._forget(idle, "idle", now_s)
        peer = self._peers.get(node_id)
        if peer is None or not peer.failing or self._state is not _State.STARTED:
            return
        if peer.failed_s < peer.channel_made_s:
            return  # the channel made since has not failed (yet)
        if asyncio.get_running_loop().time() - peer.channel_made_s < (
            RECONNECT_ON_RECEIVE_MIN_INTERVAL_S
        ):
            return
        self._say(peer, logging.INFO, "heard from node %d: connecting to it again", node_id)
        for task in peer.tasks:
            task.cancel()
        if peer.channel is not None:
            self._close_later(peer.channel)
        self._start_peer(peer)

    def _close_later(self, channel: grpc.aio.Channel) -> None:
        closing = asyncio.get_running_loop().create_task(channel.close(None))
        self._closing.add(closing)  # referenced until done
        closing.add_done_callback(self._closing.discard)

    def _forget(self, node_id: int, why: str, now_s: float) -> None:
        """Drop a learned peer that ``LearnedPeers`` let go, saying so (throttled)."""
        peer = self._peers.get(node_id)
        if peer is None:
            return
        self._drop_peer(peer)
        self.forgotten_learned_peers += 1
        quiet = self._logs[why].ready(now_s)
        if quiet is None:
            return
        if why == "evicted":
            log.warning(
                "node %d: forgot node %d at %s to learn another (max_learned_peers=%d reached: "
                "messages from unknown ids, or more brokers than that)%s",
                self.node_id,
                node_id,
                peer.address,
                self._learned.max_peers,
                more(quiet),
            )
        else:
            log.info(
                "node %d: forgot node %d at %s: not heard from for %.0f s%s",
                self.node_id,
                node_id,
                peer.address,
                self._learned.max_idle_s,
                more(quiet),
            )

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
        server = grpc.aio.server(
            options=self._server_options(),
            maximum_concurrent_rpcs=self.config.max_concurrent_rpcs,
        )
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
            quiet = self._logs["unknown"].ready(time.monotonic())
            if quiet is not None:
                log.warning(
                    "node %d: no address for %s%s", self.node_id, _describe(envelope), more(quiet)
                )
            return
        if peer.offer(envelope_to_proto(envelope)):
            level = logging.DEBUG if peer.failing or peer.overflowing else logging.WARNING
            peer.overflowing = True
            self._say(peer, level, "queue to node %d full: dropped the oldest", peer.node_id)

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
                if e.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED:
                    # The peer is busy, not gone: its channel is fine (``heard_from``).
                    peer.failed_s = asyncio.get_running_loop().time()
                self._note_failure(peer, e)
                if e.code() is grpc.StatusCode.UNAVAILABLE:
                    self._report_unreachable(peer)
            else:
                peer.stats.sent += 1
                peer.overflowing = False
                if peer.failing:
                    peer.failing = False
                    self._say(peer, logging.INFO, "node %d is reachable again", peer.node_id)

    async def _watch(self, peer: _Peer, channel: grpc.aio.Channel) -> None:
        """Report a peer whose established connection dropped: a killed process closes its
        sockets, and its followers should not wait for their next fetch to learn it."""
        ready = grpc.ChannelConnectivity.READY
        state = channel.get_state(try_to_connect=False)
        while True:
            await channel.wait_for_state_change(state)
            previous, state = state, channel.get_state(try_to_connect=False)
            if previous is ready and state is not ready:
                self._say(peer, logging.INFO, "connection to node %d dropped", peer.node_id)
                self._report_unreachable(peer)

    def _report_unreachable(self, peer: _Peer) -> None:
        if self._unreachable is not None and self._state is _State.STARTED:
            self._unreachable(peer.node_id)

    def _note_failure(self, peer: _Peer, error: grpc.aio.AioRpcError) -> None:
        level = logging.DEBUG if peer.failing else logging.WARNING
        peer.failing = True
        self._say(
            peer,
            level,
            "send to node %d at %s failed (%s: %s); dropping messages until it answers",
            peer.node_id,
            peer.address,
            error.code().name,
            error.details(),
        )

    def _say(self, peer: _Peer, level: int, message: str, *args: object) -> None:
        """Log ``message`` about ``peer`` as this node; about a learned peer at most every
        ``LOG_INTERVAL_S`` (anyone can make learned peers, and their trouble repeats)."""
        if level >= logging.INFO and peer.node_id in self._learned:
            quiet = self._logs["learned-peer"].ready(time.monotonic())
            if quiet is None:
                return
            message += more(quiet)
        log.log(level, "node %d: " + message, self.node_id, *args)

    def _misrouted(self, destination: int) -> None:
        """A message for another node: a peer's address list is wrong (or a stranger's)."""
        quiet = self._logs["misrouted"].ready(time.monotonic())
        if quiet is not None:
            log.warning(
                "node %d: got a message for node %d%s", self.node_id, destination, more(quiet)
            )

    def _from_own_id(self, peer: str) -> None:
        quiet = self._logs["own-id"].ready(time.monotonic())
        if quiet is not None:
            log.warning(
                "node %d: got a message from node %d (this node's id) from %s: is another "
                "process configured with this id?%s",
                self.node_id,
                self.node_id,
                peer,
                more(quiet),
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
        return [
            *self._message_size_options(),
            ("grpc.so_reuseport", 0),
            ("grpc.max_allowed_incoming_connections", self.config.max_connections),
        ]

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
            self._transport._misrouted(envelope.destination)
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this is node {node_id}, not node {envelope.destination}",
            )
        if envelope.source == node_id:
            # Another process with this node's id, or a forgery: learning it as a peer would
            # send this node's own messages to that address.
            self._transport._from_own_id(context.peer())
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"a message from node {node_id}, this node's id"
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
