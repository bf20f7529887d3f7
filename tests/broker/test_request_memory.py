"""The listener's request memory (``queued_max_request_bytes``): the pool's bookkeeping and the
frame reader's use of it as pure logic, then real listeners on 127.0.0.1 with clients that
announce big frames, hold requests in flight, vanish mid-frame or never read their answers.
Memory is observed through the pool's and the server's attributes, never through timing;
every wait is bounded."""

from __future__ import annotations

import asyncio
import functools
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_server import SIZE, WAIT_S, eventually, run

from broker.connection import Chunk, FrameReader, MemoryPool
from broker.context import BrokerSettings
from broker.runtime import KafkaBroker
from broker.server import ConnectionInfo, Part, Response, Server, ServerConfig
from controller.client import ControllerClient
from controller.state_machine import MetadataStateMachine
from runnel.config import ConfigError, load_config
from storage.config import LogConfig
from storage.errors import InvariantViolation
from storage.log_manager import LogManager

KIB, MIB = 1024, 1024 * 1024


# -- the pool ----------------------------------------------------------------------------------


class Grants:
    """Records which waiter was granted, in order."""

    def __init__(self) -> None:
        self.order: list[str] = []

    def to(self, name: str) -> Callable[[], None]:
        return lambda: self.order.append(name)


def test_the_pool_lends_up_to_its_limit_and_queues_the_rest() -> None:
    pool, grants = MemoryPool(100), Grants()
    assert pool.take(60, grants.to("a"))
    assert not pool.take(50, grants.to("b"))  # 110 > 100
    assert (pool.used_bytes, pool.waiting, pool.waits) == (60, 1, 1)
    pool.give(60)
    assert grants.order == ["b"] and pool.used_bytes == 50  # taken for b before it is told
    pool.give(50)
    assert (pool.used_bytes, pool.waiting) == (0, 0)


def test_a_big_waiter_is_not_overtaken_by_small_takes_that_would_fit() -> None:
    pool, grants = MemoryPool(100), Grants()
    assert pool.take(90, grants.to("first"))
    assert not pool.take(100, grants.to("big"))
    assert not pool.take(5, grants.to("small"))  # fits the 10 left, but the big one is first
    pool.give(90)
    assert grants.order == ["big"] and pool.used_bytes == 100
    pool.give(100)
    assert grants.order == ["big", "small"] and pool.used_bytes == 5


def test_cancelling_a_waiter_lets_the_next_one_in() -> None:
    pool, grants = MemoryPool(100), Grants()
    assert pool.take(50, grants.to("a"))
    big, small = grants.to("big"), grants.to("small")
    assert not pool.take(80, big)
    assert not pool.take(40, small)
    pool.cancel(big)
    assert grants.order == ["small"] and pool.used_bytes == 90 and pool.waiting == 0


def test_the_pool_refuses_a_take_it_could_never_serve_and_a_double_give() -> None:
    pool = MemoryPool(100)
    with pytest.raises(InvariantViolation):
        pool.take(101, lambda: None)
    with pytest.raises(InvariantViolation):
        pool.give(1)


# -- the frame reader with a pool --------------------------------------------------------------


def prefixed(body: bytes) -> bytes:
    return SIZE.pack(len(body)) + body


def feed(reader: FrameReader, data: bytes) -> int:
    """Write as much of ``data`` as the reader takes in one read; the count."""
    target = reader.try_recv_target()
    assert target is not None
    count = min(len(target), len(data))
    target[:count] = data[:count]
    reader.received(count)
    return count


class Woken:
    def __init__(self) -> None:
        self.times = 0

    def __call__(self) -> None:
        self.times += 1


def test_a_big_frame_takes_its_size_when_its_prefix_arrives_and_waits_if_it_cannot() -> None:
    pool, woken = MemoryPool(3000), Woken()
    reader = FrameReader(3000, 1024, pool=pool, on_memory=woken)
    assert pool.take(2000, lambda: None)  # someone else holds most of it
    body = bytes(range(256)) * 10  # 2560 bytes: over half a chunk, its own buffer
    stream = prefixed(body)
    at = feed(reader, stream[:100])
    assert reader.next_frame() is None
    assert reader.waiting_bytes == 2560 and pool.used_bytes == 2000  # no buffer made
    assert reader.try_recv_target() is None and not reader.make_room()
    pool.give(2000)
    assert woken.times == 1 and pool.used_bytes == 2560 and reader.waiting_bytes == 0
    assert reader.next_frame() is None  # the buffer is made, with the body so far
    while at < len(stream):
        at += feed(reader, stream[at:])
    item = reader.next_frame()
    assert item is not None and bytes(item[0]) == body
    assert pool.used_bytes == 2560  # still being handled
    item[1].settle()  # handled and answered at once
    assert pool.used_bytes == 0


def test_a_big_frame_in_flight_holds_its_bytes_until_released() -> None:
    pool = MemoryPool(4000)
    reader = FrameReader(3000, 1024, pool=pool, on_memory=lambda: None)
    stream = prefixed(b"x" * 2000)
    at = 0
    while (item := reader.next_frame()) is None:
        at += feed(reader, stream[at:])
    chunk = item[1]
    FrameReader.retain(chunk)
    chunk.settle()  # what the listener does after the handler: nothing while in flight
    assert pool.used_bytes == 2000
    FrameReader.release(chunk)
    assert pool.used_bytes == 0


def fill_pinned_chunk(reader: FrameReader) -> Chunk:
    """One small frame kept in flight, then small frames answered at once until the 1 KiB
    chunk has less than an eighth left: the next read needs a fresh chunk. The kept frame's
    chunk."""
    feed(reader, prefixed(b"held"))
    item = reader.next_frame()
    assert item is not None
    FrameReader.retain(item[1])
    for _ in range(32):  # 8 + 32 x 28 = 904 bytes: 120 left
        feed(reader, prefixed(b"a" * 24))
        assert reader.next_frame() is not None
    assert pool_of(reader).used_bytes == 0
    return item[1]


def pool_of(reader: FrameReader) -> MemoryPool:
    pool = reader._pool
    assert pool is not None
    return pool


def test_a_chunk_pinned_by_a_request_in_flight_is_charged_when_the_reader_moves_on() -> None:
    pool = MemoryPool(4096)
    reader = FrameReader(1000, 1024, pool=pool, on_memory=lambda: None)
    pinned = fill_pinned_chunk(reader)
    assert pool.used_bytes == 0 and reader.make_room()  # a fresh chunk: the pinned one counts
    assert pool.used_bytes == 1024
    FrameReader.release(pinned)
    assert pool.used_bytes == 0


def test_a_fresh_chunk_asked_for_is_forgone_when_the_pinned_frame_is_released() -> None:
    pool, woken = MemoryPool(2048), Woken()
    reader = FrameReader(1000, 1024, pool=pool, on_memory=woken)
    pinned = fill_pinned_chunk(reader)
    assert pool.take(2048, lambda: None)
    assert not reader.make_room() and reader.waiting_bytes == 1024 and pool.waiting == 1
    FrameReader.release(pinned)
    assert reader.make_room()  # the chunk is free again: moved in place, the ask withdrawn
    assert (reader.waiting_bytes, pool.waiting, woken.times) == (0, 0, 0)
    pool.give(2048)
    assert pool.used_bytes == 0


def test_closing_gives_back_a_frame_being_received_and_withdraws_an_ask() -> None:
    pool = MemoryPool(5000)
    receiving = FrameReader(5000, 1024, pool=pool, on_memory=lambda: None)
    feed(receiving, prefixed(b"x" * 3000)[:600])
    assert receiving.next_frame() is None and pool.used_bytes == 3000
    asking = FrameReader(5000, 1024, pool=pool, on_memory=lambda: None)
    feed(asking, prefixed(b"y" * 4000)[:600])
    assert asking.next_frame() is None and asking.waiting_bytes == 4000
    asking.close()
    assert pool.waiting == 0
    receiving.close()
    assert pool.used_bytes == 0


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.one_of(st.binary(max_size=100), st.binary(min_size=513, max_size=1500)), max_size=25
    ),
    st.lists(st.integers(1, 700), min_size=1, max_size=20),
    st.lists(st.booleans(), min_size=1, max_size=20),
    st.integers(1500, 5000),
)
def test_a_reader_short_of_memory_gets_every_frame_intact_once_held_frames_are_released(
    frames: list[bytes], reads: list[int], hold: list[bool], limit: int
) -> None:
    """Frames held in flight are released, oldest first, only when the reader waits for
    memory: every frame still arrives intact, the pool never lends more than its limit, and
    everything is given back at the end."""
    pool = MemoryPool(limit)
    reader = FrameReader(1500, 1024, pool=pool, on_memory=lambda: None)
    stream = b"".join(prefixed(f) for f in frames)
    views: list[memoryview] = []
    held: list[tuple[memoryview, bytes, Chunk]] = []
    at = step = 0
    while len(views) < len(frames):
        while (item := reader.next_frame()) is not None:
            view, chunk = item
            views.append(view)
            assert bytes(view) == frames[len(views) - 1]
            if hold[len(views) % len(hold)]:
                FrameReader.retain(chunk)
                held.append((view, bytes(view), chunk))
            else:
                chunk.settle()
        assert pool.used_bytes <= limit
        target = reader.try_recv_target() if at < len(stream) else None
        if target is None:  # waiting for memory (or done): release the oldest held frame
            if held:
                view, copy, chunk = held.pop(0)
                assert bytes(view) == copy
                FrameReader.release(chunk)
            else:
                assert at == len(stream) or reader.waiting_bytes == 0
            continue
        count = min(len(target), reads[step % len(reads)], len(stream) - at)
        target[:count] = stream[at : at + count]
        reader.received(count)
        at += count
        step += 1
    for view, copy, chunk in held:
        assert bytes(view) == copy
        FrameReader.release(chunk)
    reader.close()
    assert (pool.used_bytes, pool.waiting) == (0, 0)


# -- a real listener ---------------------------------------------------------------------------


def request(op: bytes, rid: int, size: int) -> bytes:
    """A frame of ``size`` bytes: op, a 4-byte id, filler."""
    return SIZE.pack(size) + op + rid.to_bytes(4, "big") + bytes(size - 5)


class Handler:
    """Frames: an op, a 4-byte id, filler. A: answer the frame's size at once; W: the same
    once the test opens the gate; X: raise; B: answer with 64 KiB of zeros."""

    def __init__(self) -> None:
        self.calls = 0
        self.gates: dict[int, asyncio.Future[None]] = {}

    def handle(
        self, frame: memoryview, connection: ConnectionInfo
    ) -> Response | Awaitable[Response]:
        self.calls += 1
        op, rid = bytes(frame[:1]), int.from_bytes(frame[1:5], "big")
        if op == b"A":
            return answer(rid, len(frame))
        if op == b"W":
            return self._after_gate(rid, len(frame))
        if op == b"B":
            return [SIZE.pack(4 + 64 * KIB) + rid.to_bytes(4, "big"), bytes(64 * KIB)]
        raise RuntimeError("handler bug")

    async def _after_gate(self, rid: int, size: int) -> Response:
        await self.gate(rid)
        return answer(rid, size)

    def gate(self, rid: int) -> asyncio.Future[None]:
        return self.gates.setdefault(rid, asyncio.get_running_loop().create_future())

    def open_gate(self, rid: int) -> None:
        self.gate(rid).set_result(None)


def answer(rid: int, size: int) -> list[Part]:
    return [SIZE.pack(8) + rid.to_bytes(4, "big") + size.to_bytes(4, "big")]


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, port: int) -> Client:
        opened = asyncio.open_connection("127.0.0.1", port)
        return cls(*await asyncio.wait_for(opened, WAIT_S))

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await asyncio.wait_for(self.writer.drain(), WAIT_S)

    async def receive(self) -> tuple[int, int]:
        size = SIZE.unpack(await asyncio.wait_for(self.reader.readexactly(4), WAIT_S))[0]
        body = await asyncio.wait_for(self.reader.readexactly(size), WAIT_S)
        return int.from_bytes(body[:4], "big"), int.from_bytes(body[4:8], "big")

    def close(self) -> None:
        self.writer.close()


async def started(handler: Handler, **limits: int) -> Server:
    server = Server(handler, config=ServerConfig(**limits))
    await server.start()
    return server


def handled(handler: Handler, calls: int) -> bool:
    return handler.calls == calls


def big_buffers(server: Server) -> int:
    """Bytes of big-frame buffers the server's connections have made (white box: the pool's
    figure is bookkeeping; this is what exists)."""
    readers = [c._reader for c in server._connections.values()]
    return sum(len(r._large.data) for r in readers if r._large is not None)


class Watch:
    """Samples the pool and the big buffers at every loop turn; keeps the largest."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.most_used = self.most_buffered = 0
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            self.most_used = max(self.most_used, self.server.memory_pool.used_bytes)
            self.most_buffered = max(self.most_buffered, big_buffers(self.server))
            await asyncio.sleep(0)

    def stop(self) -> None:
        self._task.cancel()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_connections_announcing_big_frames_share_the_budget_and_are_all_served(loop: str) -> None:
    async def test() -> None:
        handler = Handler()
        server = await started(
            handler, socket_request_max_bytes=MIB, queued_max_request_bytes=2 * MIB
        )
        watch = Watch(server)
        clients = [await Client.connect(server.port) for _ in range(5)]
        frames = [request(b"A", rid, MIB) for rid in range(5)]
        for client, data in zip(clients, frames, strict=True):
            await client.send(data[:100])  # the size prefix and a little of the body
        pool = server.memory_pool
        await eventually(lambda: pool.waiting == 3, "three connections waiting for memory")
        assert pool.used_bytes == 2 * MIB and big_buffers(server) == 2 * MIB
        assert pool.waits == 3
        rest = [c.send(data[100:]) for c, data in zip(clients, frames, strict=True)]
        replies = await asyncio.gather(*rest, *(c.receive() for c in clients))
        assert replies[5:] == [(rid, MIB) for rid in range(5)]
        await eventually(lambda: pool.used_bytes == 0, "every frame's bytes given back")
        watch.stop()
        assert watch.most_used == 2 * MIB and watch.most_buffered <= 2 * MIB
        for client in clients:
            client.close()
        await server.close()

    run(test, loop)


def test_requests_in_flight_hold_their_bytes_until_answered() -> None:
    async def test() -> None:
        handler = Handler()
        server = await started(
            handler, socket_request_max_bytes=MIB, queued_max_request_bytes=2 * MIB
        )
        pool = server.memory_pool
        first, second, third = [await Client.connect(server.port) for _ in range(3)]
        await first.send(request(b"W", 1, MIB))
        await second.send(request(b"W", 2, MIB))
        await eventually(lambda: handler.calls == 2, "two slow requests handled")
        await third.send(request(b"A", 3, MIB)[:100])
        await eventually(lambda: pool.waiting == 1, "the third connection waiting")
        await asyncio.sleep(0.05)
        assert pool.waiting == 1 and handler.calls == 2
        sending = asyncio.ensure_future(third.send(request(b"A", 3, MIB)[100:]))
        handler.open_gate(1)
        assert await first.receive() == (1, MIB)
        assert await third.receive() == (3, MIB)
        await sending
        handler.open_gate(2)
        assert await second.receive() == (2, MIB)
        await eventually(lambda: pool.used_bytes == 0, "every frame's bytes given back")
        for client in (first, second, third):
            client.close()
        await server.close()

    run(test)


def test_bytes_come_back_from_a_client_gone_mid_frame_and_from_a_failed_handler() -> None:
    async def test() -> None:
        handler = Handler()
        server = await started(handler, socket_request_max_bytes=MIB, queued_max_request_bytes=MIB)
        pool = server.memory_pool
        gone, failing, waiting = [await Client.connect(server.port) for _ in range(3)]
        await gone.send(request(b"A", 1, MIB)[:1000])
        await eventually(lambda: pool.used_bytes == MIB, "the first frame's bytes taken")
        await waiting.send(request(b"A", 3, MIB)[:100])
        await eventually(lambda: pool.waiting == 1, "a connection waiting")
        gone.close()  # mid-frame: its bytes go to the waiting connection
        await eventually(lambda: pool.waiting == 0, "the waiting connection served")
        await failing.send(request(b"X", 2, MIB)[:100])  # waits behind the third
        await eventually(lambda: pool.waiting == 1, "the failing connection waiting")
        await waiting.send(request(b"A", 3, MIB)[100:])
        assert await waiting.receive() == (3, MIB)
        await failing.send(request(b"X", 2, MIB)[100:])  # the handler raises: closed
        await eventually(lambda: server.connections_open == 1, "the failing one closed")
        await eventually(lambda: pool.used_bytes == 0, "every frame's bytes given back")
        await waiting.send(request(b"A", 4, MIB))
        assert await waiting.receive() == (4, MIB)
        waiting.close()
        failing.close()
        await server.close()
        assert (pool.used_bytes, pool.waiting) == (0, 0)

    run(test)


def test_closing_the_server_gives_back_what_requests_in_flight_and_waiters_hold() -> None:
    async def test() -> None:
        handler = Handler()
        server = await started(handler, socket_request_max_bytes=MIB, queued_max_request_bytes=MIB)
        pool = server.memory_pool
        slow, waiting = await Client.connect(server.port), await Client.connect(server.port)
        await slow.send(request(b"W", 1, MIB))
        await eventually(lambda: handler.calls == 1, "the slow request handled")
        await waiting.send(request(b"A", 2, MIB)[:100])
        await eventually(lambda: pool.waiting == 1, "a connection waiting")
        await server.close()
        assert (pool.used_bytes, pool.waiting) == (0, 0)
        slow.close()
        waiting.close()

    run(test)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_small_requests_in_flight_pin_chunks_that_count_against_the_budget(loop: str) -> None:
    async def test() -> None:
        handler = Handler()
        server = await started(
            handler,
            read_buffer_bytes=1024,
            socket_request_max_bytes=4 * KIB,
            queued_max_request_bytes=4 * KIB,
        )
        pool = server.memory_pool
        client = await Client.connect(server.port)
        # Each slow request is followed by filler answered at once, so each pins a chunk.
        for rid in range(4):
            await client.send(request(b"W", rid, 16) + request(b"A", 100, 900))
            await eventually(functools.partial(handled, handler, 2 * rid + 2), "requests handled")
        await eventually(lambda: pool.used_bytes == 3 * KIB, "three pinned chunks counted")
        await client.send(request(b"W", 4, 16) + request(b"A", 100, 900))
        await client.send(request(b"A", 5, 16))  # the budget is spent: not read yet
        await eventually(lambda: pool.waiting == 1, "the connection waiting for a chunk")
        await asyncio.sleep(0.05)
        assert pool.used_bytes == 4 * KIB and pool.waiting == 1
        handler.open_gate(0)  # answered: the first chunk is free, the waiter gets it
        assert [await client.receive() for _ in range(2)] == [(0, 16), (100, 900)]
        await eventually(lambda: handler.calls == 11, "the last request read and handled")
        for rid in range(1, 5):
            handler.open_gate(rid)
        in_order = [answer for rid in range(1, 5) for answer in ((rid, 16), (100, 900))]
        assert [await client.receive() for _ in range(9)] == [*in_order, (5, 16)]
        await eventually(lambda: pool.used_bytes == 0, "every chunk given back")
        client.close()
        await server.close()

    run(test, loop)


class DoneAtReturn(Handler):
    """A handler that is done with its frames when ``handle`` returns (as the Kafka
    dispatcher is): W reads only the size before it waits."""

    frames_in_flight = False


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_request_waiting_for_its_answer_holds_no_memory_when_its_frame_is_done_at_return(
    loop: str,
) -> None:
    """An acks=-1 produce waiting for followers holds no request memory (Kafka frees at
    handler return): another connection's big frame is read while it waits."""

    async def test() -> None:
        handler = DoneAtReturn()
        server = await started(handler, socket_request_max_bytes=MIB, queued_max_request_bytes=MIB)
        pool = server.memory_pool
        slow, other = await Client.connect(server.port), await Client.connect(server.port)
        await slow.send(request(b"W", 1, MIB))
        await eventually(lambda: handler.calls == 1, "the slow request handled")
        await eventually(lambda: pool.used_bytes == 0, "its frame given back while it waits")
        await other.send(request(b"A", 2, MIB))
        assert await other.receive() == (2, MIB)  # read and answered while 1 still waits
        await other.send(request(b"W", 3, 16) + request(b"A", 4, 900))
        await eventually(lambda: handler.calls == 4, "a small waiting request and the next")
        # A chunk holding a waiting request's frame is written over, not pinned and charged.
        assert pool.used_bytes == 0
        handler.open_gate(3)
        assert [await other.receive() for _ in range(2)] == [(3, 16), (4, 900)]
        handler.open_gate(1)
        assert await slow.receive() == (1, MIB)
        slow.close()
        other.close()
        await server.close()
        assert (pool.used_bytes, pool.waiting) == (0, 0)

    run(test, loop)


def test_a_connection_waiting_for_memory_is_not_closed_as_idle() -> None:
    async def test() -> None:
        handler = Handler()
        server = await started(
            handler,
            socket_request_max_bytes=MIB,
            queued_max_request_bytes=MIB,
            connections_max_idle_ms=100,
        )
        pool = server.memory_pool
        slow, waiting = await Client.connect(server.port), await Client.connect(server.port)
        await slow.send(request(b"W", 1, MIB))
        await eventually(lambda: handler.calls == 1, "the slow request handled")
        await waiting.send(request(b"A", 2, MIB)[:100])
        await eventually(lambda: pool.waiting == 1, "a connection waiting")
        await asyncio.sleep(0.4)  # four idle periods
        assert server.connections_open == 2
        sending = asyncio.ensure_future(waiting.send(request(b"A", 2, MIB)[100:]))
        handler.open_gate(1)
        assert await slow.receive() == (1, MIB)
        assert await waiting.receive() == (2, MIB)
        await sending
        slow.close()
        waiting.close()
        await server.close()

    run(test)


def test_a_client_that_never_reads_stops_being_read_and_resumes_when_it_reads() -> None:
    """The response side: unsent answers over the bound stop the reading, so what the server
    holds stays bounded however much the client sends, and reading resumes as they drain."""

    async def test() -> None:
        handler, limit, count = Handler(), 64 * KIB, 2000
        server = await started(
            handler,
            max_buffered_response_bytes_per_connection=limit,
            socket_send_buffer_bytes=16 * KIB,
            socket_receive_buffer_bytes=16 * KIB,
        )
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * KIB)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * KIB)  # no room for 2 MiB
        sock.setblocking(False)
        await asyncio.wait_for(loop.sock_connect(sock, ("127.0.0.1", server.port)), WAIT_S)
        requests = b"".join(request(b"B", rid, KIB) for rid in range(count))  # 2 MiB
        sending = asyncio.ensure_future(loop.sock_sendall(sock, requests))  # 125 MiB answers
        await eventually(lambda: server.buffered_response_bytes() > limit, "answers queued")
        most_queued = most_read = 0
        for _ in range(60):  # a while of not reading: the bounds hold throughout
            most_queued = max(most_queued, server.buffered_response_bytes())
            most_read = max(most_read, server.bytes_received)
            await asyncio.sleep(0.005)
        assert most_queued <= limit + 64 * KIB + 8  # the bound, and one answer over it
        assert most_read < 256 * KIB and not sending.done()  # 2 MiB sent, a little read
        answer_bytes = 8 + 64 * KIB
        received = bytearray()
        while len(received) < count * answer_bytes:
            chunk = await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), WAIT_S)
            assert chunk, "closed early"
            received += chunk
        ids = [
            int.from_bytes(received[i + 4 : i + 8], "big")
            for i in range(0, len(received), answer_bytes)
        ]
        assert ids == list(range(count))
        await asyncio.wait_for(sending, WAIT_S)
        assert handler.calls == count and server.bytes_received == len(requests)
        sock.close()
        await server.close()

    run(test)


# -- configuration and wiring ------------------------------------------------------------------


def test_the_budget_must_hold_the_largest_request() -> None:
    with pytest.raises(ValueError, match="queued_max_request_bytes"):
        ServerConfig(queued_max_request_bytes=100 * MIB - 1)
    with pytest.raises(ValueError, match="queued_max_request_bytes"):
        ServerConfig(socket_request_max_bytes=MIB, queued_max_request_bytes=MIB - 1)
    ServerConfig(socket_request_max_bytes=MIB, queued_max_request_bytes=MIB)


def test_loading_a_budget_below_the_request_limit_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(
        "node_id = 1\n"
        'process_roles = ["controller"]\n'
        'listeners = ["CONTROLLER://127.0.0.1:9093"]\n'
        f'data_dirs = ["{tmp_path}"]\n'
        'controller_quorum_voters = "1@127.0.0.1:9093"\n'
        "[server]\n"
        "queued_max_request_bytes = 1_000_000\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(path, {})
    (problem,) = caught.value.problems
    assert problem.key == "server.queued_max_request_bytes"
    assert "socket_request_max_bytes" in problem.message


def test_every_kafka_listener_of_a_broker_shares_one_budget(tmp_path: Path) -> None:
    async def main() -> None:
        config = ServerConfig(socket_request_max_bytes=MIB, queued_max_request_bytes=3 * MIB)
        broker = KafkaBroker(
            BrokerSettings(1, "cluster", "CLIENT"),
            config,
            "127.0.0.1",
            0,
            LogManager([tmp_path / "data"], LogConfig()),
            cast(MetadataStateMachine, None),
            cast(ControllerClient, None),
            lambda: 0,
            fetch_max_waiting=10,
            other_listeners=[("INTERNAL", "127.0.0.1", 0)],
        )
        pools = {id(server.memory_pool) for server in broker.servers.values()}
        assert len(broker.servers) == 2 and pools == {id(broker.request_memory)}
        assert broker.request_memory.limit_bytes == 3 * MIB

    asyncio.run(main())
