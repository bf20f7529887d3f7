"""The broker's client listener: TCP with Kafka's framing (a 4-byte big-endian size, then the
request), pipelining, and limits. It knows nothing of Kafka APIs: a ``RequestHandler`` (the
codec and the APIs behind it) gets every complete frame and answers with the response's parts.

How this works. The server owns its sockets: the listening socket and each client socket are
non-blocking and watched with ``loop.add_reader`` / ``loop.add_writer``, on uvloop and on
asyncio's own loop alike. There are no asyncio transports: uvloop's cannot ``sendfile``, and
writing to a socket behind a transport's back would break ordering. ``broker/connection.py``
splits frames and writes responses (byte parts with one ``sendmsg``, ``FileSlice`` parts with
``os.sendfile``); ``_Connection`` here drives it:

- readable: ``recv_into``, then ``handler.handle`` for each complete frame at once, in arrival
  order. A ready response fills the request's slot; an awaitable fills it when done. Responses
  leave in request order (a ``None`` answer keeps its place and sends nothing); the responses
  of one batch of frames go out with one write.
- backpressure: with ``max_in_flight_requests_per_connection`` requests unanswered, or more than
  ``max_buffered_response_bytes_per_connection`` unsent bytes, the connection handles no more
  frames and stops reading until responses complete and drain.
- request memory: what a connection's ``FrameReader`` holds beyond its own chunk (a big
  frame's buffer, chunks pinned by requests in flight) is taken from a ``MemoryPool`` of
  ``queued_max_request_bytes``, shared by a broker's listeners (as Kafka's pool is). A
  connection whose next read needs memory the pool cannot give now stops reading until the
  pool grants it (in order of asking); the bytes go back when the request is answered or
  fails and when the connection closes, mid-frame or with requests in flight. A handler done
  with its frames when ``handle`` returns (``frames_in_flight = False``: the Kafka dispatcher)
  pins nothing: a request waiting for its answer holds no request memory.
- connections: at most ``max_connections`` open, and at most ``max_connections_per_ip``
  from one client address (``max_connections_per_ip_overrides`` sets others for some
  addresses, 0 refusing them all: Kafka's ``max.connections.per.ip[.overrides]``); one more
  is accepted and closed at once. Refusals are logged at WARNING at most every 10 s, with
  the count of those not logged, since a client in a reconnect loop repeats them.
- closing: EOF between frames or a reset (DEBUG), EOF mid-frame (WARNING), a bad size
  prefix, ``CloseConnection`` or a ValueError from the handler (WARNING with peer and reason),
  any other handler error (ERROR with traceback), no traffic and nothing in flight for
  ``connections_max_idle_ms`` (DEBUG), ``Server.close``.
  A closed connection's pending handler awaitables are cancelled.

Concurrency contract: one event loop runs ``start``, ``close``, the callbacks and the handler.
Nothing here is thread-safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import ipaddress
import logging
import socket
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Protocol

from broker.connection import (
    Chunk,
    FrameReader,
    FrameSizeError,
    MemoryPool,
    ResponseQueue,
    ShortFileError,
    Slot,
)
from raft.log_throttle import LogThrottle, more
from storage.errors import invariant
from storage.segment import FileSlice

__all__ = [
    "CloseConnection",
    "ConnectionInfo",
    "Part",
    "RequestHandler",
    "Response",
    "Server",
    "ServerConfig",
    "parse_ip_overrides",
]

_log = logging.getLogger(__name__)
MIB = 1024 * 1024
_MAX_SIZE_PREFIX = 2**31 - 1
_ACCEPTS_PER_EVENT = 64  # then other callbacks get a turn
_ACCEPT_BACKOFF_S = 0.1  # after accept fails (out of descriptors): retry, do not spin
_IDLE_SWEEP_MAX_S = 1.0

Part = (
    bytes | bytearray | memoryview | FileSlice
)  # storage.segment.FileSlice: .fd .position .length .read()
Response = (
    list[Part] | None
)  # None: send nothing (acks=0 produce); parts INCLUDE the 4-byte size prefix


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """Who sent a request: ``peer`` is "host:port", ``listener`` the listener's name."""

    peer: str
    connection_id: int
    listener: str


class RequestHandler(Protocol):
    def handle(
        self, frame: memoryview, connection: ConnectionInfo
    ) -> Response | Awaitable[Response]:
        """Answer one request. ``frame`` is the request without its size prefix; it stays
        valid until the response is produced, not after (a response must not contain views of
        it), or, for a handler whose ``frames_in_flight`` is False, until ``handle`` returns.
        Called synchronously in arrival order; return the response, or an awaitable of it
        for a slow request. Raise ``CloseConnection`` (or a ValueError) to drop the client."""
        ...


def keeps_frames_in_flight(handler: RequestHandler) -> bool:
    """Whether ``handler``'s awaitables may read their frames until done (the default). A
    handler that sets ``frames_in_flight = False`` is done with a frame when ``handle``
    returns: its memory is reused, and given back to the pool, while the request waits (as
    Kafka releases a request's buffer when its handler returns, before acks=-1 completes)."""
    return bool(getattr(handler, "frames_in_flight", True))


class CloseConnection(Exception):
    """Raised by a handler: close the connection and log at WARNING with peer and reason."""


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Limits of the client listener; units in the names. Validated on construction."""

    socket_request_max_bytes: int = 104_857_600  # checked on the size prefix, before the body
    max_connections: int = 1000  # beyond it a new connection is accepted and closed at once
    max_connections_per_ip: int = 1000  # from one client address; then the same
    # "IP:COUNT,..." other limits for some addresses (0: none from there), as Kafka's
    # max.connections.per.ip.overrides; IPv6 addresses as written, e.g. "::1:10"
    max_connections_per_ip_overrides: str = ""
    max_in_flight_requests_per_connection: int = 100  # then the connection stops reading
    max_buffered_response_bytes_per_connection: int = 64 * MIB  # unsent; then it stops reading
    # Request bytes held at once (big frames' buffers, chunks pinned by requests in flight),
    # all the broker's listeners together; then a connection needing more stops reading.
    queued_max_request_bytes: int = 512 * MIB
    connections_max_idle_ms: int = 600_000  # no bytes either way and no request in flight
    socket_send_buffer_bytes: int = -1  # SO_SNDBUF; -1: the OS default
    socket_receive_buffer_bytes: int = -1  # SO_RCVBUF; -1: the OS default
    read_buffer_bytes: int = 64 * 1024  # one recv_into; a frame over half of it gets its own
    listen_backlog: int = 1024
    close_timeout_ms: int = 1000  # Server.close waits this long for cancelled handlers

    def __post_init__(self) -> None:
        for name in self.__slots__:
            value = getattr(self, name)
            if name == "max_connections_per_ip_overrides":
                parse_ip_overrides(value)  # raises ValueError naming the bad entry
            elif name.startswith("socket_") and name.endswith("_buffer_bytes"):
                if value != -1 and value < 1:
                    raise ValueError(f"{name} must be -1 (OS default) or positive, got {value}")
            elif value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if self.socket_request_max_bytes > _MAX_SIZE_PREFIX:
            raise ValueError(f"socket_request_max_bytes cannot exceed {_MAX_SIZE_PREFIX}")
        if self.read_buffer_bytes < 1024:
            raise ValueError(
                f"read_buffer_bytes must be at least 1024, got {self.read_buffer_bytes}"
            )
        largest = max(self.socket_request_max_bytes, self.read_buffer_bytes)
        if self.queued_max_request_bytes < largest:
            raise ValueError(
                f"queued_max_request_bytes ({self.queued_max_request_bytes}) must be at least "
                f"socket_request_max_bytes ({self.socket_request_max_bytes}) and "
                f"read_buffer_bytes ({self.read_buffer_bytes}), or such a request never fits"
            )


def parse_ip_overrides(text: str) -> dict[str, int]:
    """``max_connections_per_ip_overrides``: "IP:COUNT" entries separated by commas (the
    count after the last colon, so IPv6 addresses need no brackets) -> {normalized IP:
    count}. Raises ValueError naming a bad entry."""
    limits: dict[str, int] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        host, sep, count = entry.rpartition(":")
        try:
            ip = _normalized_ip(host)
            limit = int(count)
        except ValueError:
            ip, limit = "", -1
        if not sep or not ip or limit < 0:
            raise ValueError(
                f"max_connections_per_ip_overrides: {entry!r} is not IP:COUNT (an IP address"
                " and a count of at least 0)"
            )
        limits[ip] = limit
    return limits


def _normalized_ip(host: str) -> str:
    """One spelling per address: compressed, an IPv4-mapped IPv6 address as IPv4."""
    address = ipaddress.ip_address(host.strip("[]"))
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.compressed


class _Connection:
    """One client socket, driven by reader/writer callbacks. See the module docstring."""

    def __init__(self, server: Server, sock: socket.socket, info: ConnectionInfo, ip: str) -> None:
        config = server.config
        self.info = info
        self.ip = ip
        self.pending: set[asyncio.Future[Response]] = set()
        self._server = server
        self._sock = sock
        self._fd = sock.fileno()
        self._loop = asyncio.get_running_loop()
        self._handler = server.handler
        self._keep_frames = keeps_frames_in_flight(server.handler)
        self._max_in_flight = config.max_in_flight_requests_per_connection
        self._max_buffered_bytes = config.max_buffered_response_bytes_per_connection
        self._reader = FrameReader(
            config.socket_request_max_bytes,
            config.read_buffer_bytes,
            pool=server.memory_pool,
            on_memory=self._on_memory,
        )
        self._out = ResponseQueue()
        self._in_flight = 0
        self._reading = self._writing = self._closed = False
        self._pump_soon = False
        self._last_active = self._loop.time()

    def start(self) -> None:
        self._set_reading(True)

    @property
    def buffered_response_bytes(self) -> int:
        return self._out.buffered_bytes

    def idle_since(self, time: float) -> bool:
        """Nothing in flight, no traffic since ``time``, and not waiting for memory (the
        broker's doing, not the client's)."""
        return self._in_flight == 0 and self._last_active < time and not self._reader.waiting_bytes

    def close(self, *, flush: bool = False) -> None:
        """Close now; with ``flush``, first send what the socket takes without waiting."""
        if self._closed:
            return
        if flush:
            with contextlib.suppress(OSError, ShortFileError):
                self._out.write(self._sock)
        self._set_reading(False)
        self._set_writing(False)
        self._closed = True
        self._sock.close()
        self._reader.close()
        for future in self.pending:
            future.cancel()
        self._server._forget(self)

    def _on_readable(self) -> None:
        target = self._reader.try_recv_target()
        if target is None:  # the pool cannot give what this read needs: wait for _on_memory
            self._set_reading(False)
            return
        try:
            count = self._sock.recv_into(target)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._socket_failed(exc)
            return
        if count == 0:
            unread = self._reader.buffered_bytes
            if unread:  # a truncated request: worth an operator's eye, unlike a plain close
                _log.warning(
                    "closing connection %d from %s: closed by the peer mid-frame (%d bytes)",
                    self.info.connection_id,
                    self.info.peer,
                    unread,
                )
                self.close()
            else:
                self.close_quietly("closed by the peer")
            return
        self._reader.received(count)
        self._server.bytes_received += count
        self._last_active = self._loop.time()
        self._pump()

    def _pump(self) -> None:
        """Handle the frames received (within the limits), write, and read again if allowed."""
        while True:
            limited = self._handle_frames()
            if not self._closed:
                self._flush()
            if self._closed:
                return
            if not (limited and self._may_handle()):
                break
        reader = self._reader  # waiting for memory: read once it is granted or not needed
        self._set_reading(self._may_handle() and (not reader.waiting_bytes or reader.make_room()))

    def _may_handle(self) -> bool:
        return (
            self._in_flight < self._max_in_flight
            and self._out.buffered_bytes <= self._max_buffered_bytes
        )

    def _handle_frames(self) -> bool:
        """Hand out complete frames; True if a limit stopped it."""
        handled = 0
        try:
            while not self._closed:
                if self._in_flight >= self._max_in_flight or (
                    self._out.buffered_bytes > self._max_buffered_bytes
                ):
                    return True
                item = self._reader.next_frame()
                if item is None:
                    return False
                handled += 1
                self._call_handler(*item)
        except FrameSizeError as exc:
            self._fail(exc)
        finally:
            self._server.requests_received += handled
        return False

    def _call_handler(self, frame: memoryview, chunk: Chunk) -> None:
        try:
            result = self._handler.handle(frame, self.info)
            if result is None or isinstance(result, list):
                self._out.respond(result)
            else:
                future = asyncio.ensure_future(result)
                self._in_flight += 1
                held = chunk if self._keep_frames else None
                FrameReader.retain(held)
                self.pending.add(future)
                callback = functools.partial(self._on_done, self._out.reserve(), held)
                future.add_done_callback(callback)
        except Exception as exc:
            self._fail(exc)
        if chunk.charged:  # a big frame's own buffer: back to the pool unless in flight
            chunk.settle()

    def _on_done(self, slot: Slot, chunk: Chunk | None, future: asyncio.Future[Response]) -> None:
        self.pending.discard(future)
        FrameReader.release(chunk)  # the handler is done with the frame, closed or not
        if self._closed:
            return
        self._in_flight -= 1
        if future.cancelled():
            self._fail(CloseConnection("the handler's awaitable was cancelled"))
            return
        try:
            self._out.complete(slot, future.result())
        except Exception as exc:
            self._fail(exc)
            return
        if self._pump_soon:
            return
        if any(f.done() for f in self.pending):
            # More answers are done in this loop turn (acks=-1 produces that one follower
            # fetch commits): send them together, in one sendmsg, at the next turn.
            self._pump_soon = True
            self._loop.call_soon(self._pump_later)
            return
        self._pump()

    def _on_memory(self) -> None:
        """The pool granted what the reader waited for (called inside another connection's
        release): carry on at the next loop turn. The wait was not the client's idleness."""
        self._last_active = self._loop.time()
        self._loop.call_soon(self._resume)

    def _resume(self) -> None:
        if not self._closed:
            self._pump()

    def _pump_later(self) -> None:
        self._pump_soon = False
        if not self._closed:
            self._pump()

    def _flush(self) -> None:
        try:
            count = self._out.write(self._sock)
        except ShortFileError as exc:
            self._fail(exc)
            return
        except OSError as exc:
            self._socket_failed(exc)
            return
        if count:
            self._server.bytes_sent += count
            self._last_active = self._loop.time()
        self._set_writing(not self._out.empty)

    def _on_writable(self) -> None:
        self._pump()

    def _fail(self, exc: BaseException) -> None:
        peer, number = self.info.peer, self.info.connection_id
        if isinstance(exc, CloseConnection | ValueError | FrameSizeError):
            _log.warning("closing connection %d from %s: %s", number, peer, _reason(exc))
        else:
            _log.error(
                "closing connection %d from %s: %s", number, peer, _reason(exc), exc_info=exc
            )
        self.close(flush=True)

    def _socket_failed(self, exc: OSError) -> None:
        if isinstance(exc, ConnectionError | TimeoutError) or exc.errno == errno.ENOTCONN:
            self.close_quietly(str(exc))  # the peer went away: routine
        else:
            self._fail(exc)

    def close_quietly(self, reason: str) -> None:
        _log.debug("connection %d from %s: %s", self.info.connection_id, self.info.peer, reason)
        self.close()

    def _set_reading(self, on: bool) -> None:
        if on != self._reading:
            self._reading = on
            if on:
                self._loop.add_reader(self._fd, self._on_readable)
            else:
                self._loop.remove_reader(self._fd)

    def _set_writing(self, on: bool) -> None:
        if on != self._writing:
            self._writing = on
            if on:
                self._loop.add_writer(self._fd, self._on_writable)
            else:
                self._loop.remove_writer(self._fd)


class Server:
    """The listener: ``await start()`` binds (``port`` 0 picks a free one; ``port`` then holds
    the bound port), ``await close()`` stops everything within ``close_timeout_ms``. The
    counters are plain attributes for metrics. ``memory_pool``: the request memory it shares
    with the broker's other listeners (default: a pool of its own, of the config's
    ``queued_max_request_bytes``); its ``used_bytes`` and ``waits`` are for metrics too."""

    def __init__(
        self,
        handler: RequestHandler,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        config: ServerConfig | None = None,
        listener: str = "PLAINTEXT",
        memory_pool: MemoryPool | None = None,
    ) -> None:
        self.handler = handler
        self.config = config or ServerConfig()
        limit = self.config.queued_max_request_bytes
        self.memory_pool = memory_pool if memory_pool is not None else MemoryPool(limit)
        largest = max(self.config.socket_request_max_bytes, self.config.read_buffer_bytes)
        invariant(self.memory_pool.limit_bytes >= largest, "a request would never fit the pool")
        self.host = host
        self.port = port
        self.listener = listener
        self.connections_open = 0
        self.connections_accepted = 0  # including those refused for max_connections
        self.connections_refused = 0
        self.connections_closed = 0
        self.requests_received = 0
        self.bytes_received = 0
        self.bytes_sent = 0
        self._connections: dict[int, _Connection] = {}
        self._per_ip: dict[str, int] = {}  # open connections by client address
        self._ip_limits = parse_ip_overrides(self.config.max_connections_per_ip_overrides)
        self._refusals = LogThrottle()
        self._next_connection_id = 0
        self._listening: socket.socket | None = None
        self._background: list[asyncio.Task[None]] = []
        self._accept_retry: asyncio.TimerHandle | None = None

    async def start(self) -> None:
        invariant(self._listening is None, "Server.start called twice")
        loop = asyncio.get_running_loop()
        found = await loop.getaddrinfo(
            self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        family, _, _, _, address = found[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._set_buffer_sizes(sock)
            sock.bind(address)
            sock.listen(self.config.listen_backlog)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._listening = sock
        self.port = sock.getsockname()[1]
        loop.add_reader(sock.fileno(), self._on_acceptable, sock)
        self._background.append(loop.create_task(self._close_idle_connections()))
        _log.debug("listener %s on %s:%d", self.listener, self.host, self.port)

    async def close(self) -> None:
        """Stop accepting, close every connection, cancel pending handler awaitables."""
        if self._listening is not None:
            asyncio.get_running_loop().remove_reader(self._listening.fileno())
            self._listening.close()
            self._listening = None
        if self._accept_retry is not None:
            self._accept_retry.cancel()
        waiting: list[asyncio.Future[Any]] = [*self._background]
        self._background.clear()
        for task in waiting:
            task.cancel()
        for connection in list(self._connections.values()):
            waiting.extend(connection.pending)
            connection.close()
        if waiting:
            _, stuck = await asyncio.wait(waiting, timeout=self.config.close_timeout_ms / 1000)
            if stuck:
                _log.warning(
                    "listener %s closed; %d handlers ignored cancellation",
                    self.listener,
                    len(stuck),
                )

    def buffered_response_bytes(self) -> int:
        """Response bytes produced and not yet sent, every connection's together (a gauge)."""
        return sum(c.buffered_response_bytes for c in list(self._connections.values()))

    def _forget(self, connection: _Connection) -> None:
        del self._connections[connection.info.connection_id]
        self.connections_open -= 1
        self.connections_closed += 1
        left = self._per_ip[connection.ip] - 1
        if left:
            self._per_ip[connection.ip] = left
        else:
            del self._per_ip[connection.ip]

    def _on_acceptable(self, listening: socket.socket) -> None:
        for _ in range(_ACCEPTS_PER_EVENT):
            try:
                sock, address = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors, most likely: back off, do not spin
                _log.error("listener %s cannot accept: %s", self.listener, exc)
                self._pause_accepting(listening)
                return
            self._admit(sock, address)

    def _admit(self, sock: socket.socket, address: Any) -> None:
        self.connections_accepted += 1
        peer = _format_peer(address)
        try:
            ip = _normalized_ip(address[0])
        except ValueError:  # not expected of a TCP peer: count it as written
            ip = str(address[0])
        limit = self.config.max_connections
        if self.connections_open >= limit:
            self._refuse(sock, peer, f"max_connections ({limit}) open")
            return
        from_ip = self._per_ip.get(ip, 0)
        limit = self._ip_limits.get(ip, self.config.max_connections_per_ip)
        if from_ip >= limit:
            self._refuse(sock, peer, f"max_connections_per_ip ({limit}) open from {ip}")
            return
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._set_buffer_sizes(sock)
        except OSError as exc:
            _log.debug("connection from %s failed at once: %s", peer, exc)
            sock.close()
            return
        self._next_connection_id += 1
        info = ConnectionInfo(peer, self._next_connection_id, self.listener)
        connection = _Connection(self, sock, info, ip)
        self._connections[info.connection_id] = connection
        self.connections_open += 1
        self._per_ip[ip] = from_ip + 1
        connection.start()

    def _refuse(self, sock: socket.socket, peer: str, why: str) -> None:
        self.connections_refused += 1
        sock.close()
        quiet = self._refusals.ready(asyncio.get_running_loop().time())
        if quiet is not None:
            _log.warning("refused a connection from %s: %s%s", peer, why, more(quiet))

    def _pause_accepting(self, listening: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(listening.fileno())
        self._accept_retry = loop.call_later(
            _ACCEPT_BACKOFF_S, loop.add_reader, listening.fileno(), self._on_acceptable, listening
        )

    async def _close_idle_connections(self) -> None:
        idle_s = self.config.connections_max_idle_ms / 1000
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(min(idle_s / 4, _IDLE_SWEEP_MAX_S))
            since = loop.time() - idle_s
            for connection in [c for c in self._connections.values() if c.idle_since(since)]:
                connection.close_quietly(f"idle for over {self.config.connections_max_idle_ms} ms")

    def _set_buffer_sizes(self, sock: socket.socket) -> None:
        if self.config.socket_send_buffer_bytes != -1:
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_SNDBUF, self.config.socket_send_buffer_bytes
            )
        if self.config.socket_receive_buffer_bytes != -1:
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_RCVBUF, self.config.socket_receive_buffer_bytes
            )


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _format_peer(address: Any) -> str:
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
