"""The client listener on real sockets (127.0.0.1, free ports): framing, ordering of pipelined
responses, FileSlice parts through sendfile, limits, failures, backpressure, idleness and
close, on asyncio's loop and on uvloop; Hypothesis throws random byte streams at it, and at the
frame reader alone. Every wait is bounded."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
import socket
import struct
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.connection import FrameReader, FrameSizeError
from broker.server import (
    CloseConnection,
    ConnectionInfo,
    Part,
    Response,
    Server,
    ServerConfig,
    parse_ip_overrides,
)
from storage.segment import FileHandle, FileSlice

WAIT_S = 10.0
SIZE = struct.Struct(">i")
LOOPS = ["asyncio", "uvloop"]


def run(test: Callable[[], Coroutine[Any, Any, None]], loop: str = "asyncio") -> None:
    async def bounded() -> None:
        await asyncio.wait_for(test(), 3 * WAIT_S)

    (uvloop.run if loop == "uvloop" else asyncio.run)(bounded())


async def eventually(condition: Callable[[], bool], what: str) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.005)

    try:
        await asyncio.wait_for(poll(), WAIT_S)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def frame(op: bytes, rid: int, payload: bytes = b"") -> bytes:
    body = b"T" + op + rid.to_bytes(4, "big") + payload
    return SIZE.pack(len(body)) + body


def answer(rid: int, *payload: Part) -> list[Part]:
    size = 4 + sum(p.length if isinstance(p, FileSlice) else len(p) for p in payload)
    return [SIZE.pack(size) + rid.to_bytes(4, "big"), *payload]


class Handler:
    """Requests: b"T", an op, a 4-byte id, a payload. E echo, N no answer, W echo once the test
    opens the gate (the frame is read again then), X and Y raise (now / in a coroutine), C
    raises CloseConnection, B answers with payload-size bytes, F with a FileSlice, H never."""

    def __init__(self) -> None:
        self.calls = 0
        self.gates: dict[int, asyncio.Future[None]] = {}
        self.file: FileSlice | None = None
        self.cancelled = 0

    def handle(
        self, frame: memoryview, connection: ConnectionInfo
    ) -> Response | Awaitable[Response]:
        self.calls += 1
        if bytes(frame[:1]) != b"T" or len(frame) < 6:
            raise CloseConnection("not a test frame")
        op, rid, payload = bytes(frame[1:2]), int.from_bytes(frame[2:6], "big"), frame[6:]
        if op == b"E":
            return answer(rid, bytes(payload))
        if op == b"N":
            return None
        if op == b"W":
            return self._after_gate(rid, frame)
        if op == b"X":
            raise RuntimeError("handler bug")
        if op == b"Y":
            return self._raise_later()
        if op == b"B":
            return answer(rid, bytes(int.from_bytes(payload, "big")))
        if op == b"F":
            assert self.file is not None
            return answer(rid, b"<", self.file, b">")
        if op == b"H":
            return self._hang()
        raise CloseConnection(f"unknown op {op!r}")

    async def _after_gate(self, rid: int, frame: memoryview) -> Response:
        first = bytes(frame)
        await self.gates.setdefault(rid, asyncio.get_running_loop().create_future())
        assert bytes(frame) == first, "the frame's memory was reused while in flight"
        return answer(rid, first[6:])

    async def _raise_later(self) -> Response:
        await asyncio.sleep(0)
        raise RuntimeError("async handler bug")

    async def _hang(self) -> Response:
        try:
            await asyncio.Event().wait()
        finally:
            self.cancelled += 1
        return None

    def open_gate(self, rid: int) -> None:
        self.gates.setdefault(rid, asyncio.get_running_loop().create_future()).set_result(None)


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(
        cls, port: int, *, receive_buffer_bytes: int = 0, source: str = "127.0.0.1"
    ) -> Client:
        """From ``source``: any 127.x.y.z address reaches the server on Linux's loopback."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((source, 0))
        if receive_buffer_bytes:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)
        sock.setblocking(False)
        await asyncio.wait_for(
            asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port)), WAIT_S
        )
        return cls(*await asyncio.open_connection(sock=sock, limit=1 << 16))

    async def send(self, *frames: bytes) -> None:
        self.writer.write(b"".join(frames))
        await asyncio.wait_for(self.writer.drain(), WAIT_S)

    async def receive(self) -> tuple[int, bytes]:
        size = SIZE.unpack(await asyncio.wait_for(self.reader.readexactly(4), WAIT_S))[0]
        body = await asyncio.wait_for(self.reader.readexactly(size), WAIT_S)
        return int.from_bytes(body[:4], "big"), body[4:]

    async def ask(self, rid: int, payload: bytes = b"x") -> None:
        await self.send(frame(b"E", rid, payload))
        assert await self.receive() == (rid, payload)

    async def assert_closed(self) -> None:
        try:
            rest = await asyncio.wait_for(self.reader.read(), WAIT_S)
        except OSError:  # a reset, or uvloop's ENOTCONN after one
            return
        assert self.reader.at_eof(), f"still open after {len(rest)} bytes"

    def close(self) -> None:
        self.writer.close()


async def started(handler: Handler, **limits: Any) -> Server:
    server = Server(handler, config=ServerConfig(**limits))
    await server.start()
    return server


# -- ordering and parts ----------------------------------------------------------------------


@pytest.mark.parametrize("loop", LOOPS)
def test_pipelined_responses_keep_request_order_when_handlers_finish_out_of_order(
    loop: str,
) -> None:
    async def test() -> None:
        handler = Handler()
        server = await started(handler, read_buffer_bytes=1024)  # frames cross and pin chunks
        client = await Client.connect(server.port)
        payloads = {rid: os.urandom(random.Random(rid).randrange(1, 700)) for rid in range(40)}
        ops = {rid: [b"W", b"E", b"N", b"E"][rid % 4] for rid in payloads}
        await client.send(*(frame(ops[rid], rid, payloads[rid]) for rid in payloads))
        await eventually(lambda: handler.calls == 40, "every request handled")
        await asyncio.sleep(0.05)
        assert server.bytes_sent == 0, "a response overtook the first, still pending one"
        for rid in reversed([r for r in payloads if ops[r] == b"W"]):
            handler.open_gate(rid)
        expected = [(rid, payloads[rid]) for rid in payloads if ops[rid] != b"N"]
        assert [await client.receive() for _ in expected] == expected
        client.close()
        await server.close()

    run(test, loop)


def test_none_responses_send_nothing_and_keep_the_order() -> None:
    async def test() -> None:
        server = await started(Handler())
        client = await Client.connect(server.port)
        await client.send(frame(b"N", 1), frame(b"E", 2, b"b"), frame(b"N", 3), frame(b"N", 4))
        assert await client.receive() == (2, b"b")
        await client.ask(5)
        assert server.requests_received == 5
        client.close()
        await server.close()

    run(test)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_file_slice_goes_out_byte_exact_through_sendfile(
    loop: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "00000000000000000000.log"
    content = os.urandom(3 << 20)
    path.write_bytes(content)
    sendfile_calls = []
    real_sendfile = os.sendfile

    def counting_sendfile(out_fd: int, in_fd: int, offset: int | None, count: int) -> int:
        sendfile_calls.append(count)
        return real_sendfile(out_fd, in_fd, offset, count)

    def no_copy(_: FileSlice) -> bytes:
        raise AssertionError("log bytes were read into Python")

    monkeypatch.setattr(os, "sendfile", counting_sendfile)
    monkeypatch.setattr(FileSlice, "read", no_copy)

    async def test() -> None:
        handler = Handler()
        handler.file = FileSlice(FileHandle(path, create=False), 1000, 2_500_000)
        server = await started(handler)
        client = await Client.connect(server.port)
        await client.send(frame(b"F", 7), frame(b"E", 8, b"after"))
        assert await client.receive() == (7, b"<" + content[1000:2_501_000] + b">")
        assert await client.receive() == (8, b"after")
        assert sendfile_calls
        client.close()
        await server.close()

    run(test, loop)


def test_a_5_mb_request_and_a_5_mb_response() -> None:
    async def test() -> None:
        server = await started(Handler())
        client = await Client.connect(server.port)
        big = os.urandom(5 << 20)
        await client.send(frame(b"E", 1, big), frame(b"B", 2, (5 << 20).to_bytes(4, "big")))
        assert await client.receive() == (1, big)
        assert await client.receive() == (2, bytes(5 << 20))
        assert server.bytes_received == len(big) + 24  # two prefixes, two headers, 4 bytes
        client.close()
        await server.close()

    run(test)


# -- bad input and failing handlers ----------------------------------------------------------


@pytest.mark.parametrize("size", [1025, -1, 2**31 - 1])
def test_a_bad_size_prefix_closes_that_connection_before_any_body(
    size: int, caplog: pytest.LogCaptureFixture
) -> None:
    async def test() -> None:
        handler = Handler()
        server = await started(handler, socket_request_max_bytes=1024)
        bad, good = await Client.connect(server.port), await Client.connect(server.port)
        await bad.send(SIZE.pack(size))  # and no body: the prefix alone must do it
        await bad.assert_closed()
        await good.ask(1, bytes(1000))
        assert handler.calls == 1
        good.close()
        await server.close()

    run(test)
    warning = next(r for r in caplog.records if r.levelno == logging.WARNING)
    assert f"request size {size}" in warning.getMessage()
    assert "1024" in warning.getMessage() and "127.0.0.1:" in warning.getMessage()


def resident_bytes() -> int:
    """This process's resident memory (VmRSS), in bytes."""
    status = Path("/proc/self/status").read_text()
    (line,) = (x for x in status.splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def test_a_big_frame_announced_but_not_sent_holds_no_memory() -> None:
    """A frame's buffer is made when its size prefix arrives; four connections that each
    announce a 64 MiB frame and send 1 byte of it must not cost 4 x 64 MiB of memory (they
    did: a zero-filled bytearray). The server runs in this process: its RSS is measured."""
    announced, payload = 64 << 20, bytes((64 << 20) - 6)

    async def test() -> None:
        server = await started(Handler())
        before = resident_bytes()
        clients = [await Client.connect(server.port) for _ in range(4)]
        for client in clients:
            await client.send(SIZE.pack(announced) + b"T")
        await eventually(lambda: server.bytes_received == 4 * 5, "the prefixes arrived")
        grown = resident_bytes() - before
        assert grown < announced // 2, f"{grown} bytes resident for 4 announced frames"
        # and such a frame still arrives whole (the 5 MB test sends big frames at once)
        await clients[0].send(b"E" + (7).to_bytes(4, "big") + payload)
        assert await clients[0].receive() == (7, payload)
        for client in clients:
            client.close()
        await server.close()

    run(test)


@pytest.mark.parametrize(
    "stream",
    [
        SIZE.pack(5) + b"hello",  # the handler refuses it
        b"\xde\xad\xbe\xef" * 8,  # a negative size
        SIZE.pack(100) + b"T" * 10,  # truncated by EOF
    ],
    ids=["garbage", "garbage-size", "truncated"],
)
def test_garbage_or_a_truncated_frame_closes_only_that_connection(stream: bytes) -> None:
    async def test() -> None:
        server = await started(Handler(), socket_request_max_bytes=1024)
        bad, good = await Client.connect(server.port), await Client.connect(server.port)
        await bad.send(stream)
        bad.writer.write_eof()
        await bad.assert_closed()
        await good.ask(1)
        await eventually(lambda: server.connections_open == 1, "the bad connection forgotten")
        good.close()
        await server.close()

    run(test)


@pytest.mark.parametrize("op", [b"X", b"Y"], ids=["raises", "awaitable-raises"])
def test_a_failing_handler_closes_the_connection_and_logs_the_traceback(
    op: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    async def test() -> None:
        server = await started(Handler())
        bad, good = await Client.connect(server.port), await Client.connect(server.port)
        await bad.send(frame(b"E", 1), frame(op, 2), frame(b"E", 3))
        assert await bad.receive() == (1, b"")
        await bad.assert_closed()
        await good.ask(4)
        good.close()
        await server.close()

    run(test)
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info is not None
    assert "handler bug" in errors[0].getMessage() and "127.0.0.1:" in errors[0].getMessage()


def test_close_connection_is_a_warning_with_the_peer(caplog: pytest.LogCaptureFixture) -> None:
    async def test() -> None:
        server = await started(Handler())
        client = await Client.connect(server.port)
        await client.send(frame(b"?", 1))
        await client.assert_closed()
        await server.close()

    run(test)
    (warning,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert warning.levelno == logging.WARNING and "unknown op" in warning.getMessage()
    assert "127.0.0.1:" in warning.getMessage()


# -- limits ----------------------------------------------------------------------------------


@pytest.mark.parametrize("loop", LOOPS)
def test_in_flight_limit_stops_handling_until_responses_complete(loop: str) -> None:
    async def test() -> None:
        handler = Handler()
        server = await started(handler, max_in_flight_requests_per_connection=2)
        client = await Client.connect(server.port)
        await client.send(*(frame(b"W", rid, b"p%d" % rid) for rid in range(6)))
        await eventually(lambda: handler.calls == 2, "two requests handled")
        await asyncio.sleep(0.1)
        assert handler.calls == 2
        handler.open_gate(0)
        assert await client.receive() == (0, b"p0")
        await eventually(lambda: handler.calls == 3, "a third request handled")
        await asyncio.sleep(0.05)
        assert handler.calls == 3
        for rid in range(1, 6):
            handler.open_gate(rid)
        assert [await client.receive() for _ in range(5)] == [(r, b"p%d" % r) for r in range(1, 6)]
        client.close()
        await server.close()

    run(test, loop)


def test_unsent_response_bytes_limit_stops_handling_until_the_client_reads() -> None:
    async def test() -> None:
        handler = Handler()
        server = await started(
            handler,
            max_buffered_response_bytes_per_connection=64 * 1024,
            socket_send_buffer_bytes=16 * 1024,
        )
        client = await Client.connect(server.port, receive_buffer_bytes=16 * 1024)
        mib = (1 << 20).to_bytes(4, "big")
        await client.send(*(frame(b"B", rid, mib) for rid in range(4)))
        await eventually(lambda: handler.calls == 1, "a request handled")
        await asyncio.sleep(0.1)
        assert handler.calls == 1
        assert [await client.receive() for _ in range(4)] == [(r, bytes(1 << 20)) for r in range(4)]
        client.close()
        await server.close()

    run(test)


def test_connections_beyond_max_connections_are_closed_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def test() -> None:
        server = await started(Handler(), max_connections=2)
        first, second = await Client.connect(server.port), await Client.connect(server.port)
        await first.ask(1)
        await second.ask(2)
        third = await Client.connect(server.port)
        await third.assert_closed()
        await first.ask(3)
        await second.ask(4)
        assert (server.connections_open, server.connections_refused) == (2, 1)
        first.close()
        await eventually(lambda: server.connections_open == 1, "a slot freed")
        fourth = await Client.connect(server.port)
        await fourth.ask(5)
        for client in (second, third, fourth):
            client.close()
        await server.close()

    run(test)
    assert any("max_connections" in r.getMessage() for r in caplog.records)


def test_connections_beyond_max_connections_per_ip_are_closed_and_said_once_in_a_while(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two per address, none from 127.0.0.3, three from 127.0.0.4 (the overrides); the
    refusals of one burst make one log line, the next says how many it kept quiet."""

    async def test() -> None:
        overrides = "127.0.0.3:0, 127.0.0.4:3"
        server = await started(
            Handler(), max_connections_per_ip=2, max_connections_per_ip_overrides=overrides
        )
        ones = [await Client.connect(server.port, source="127.0.0.1") for _ in range(2)]
        twos = [await Client.connect(server.port, source="127.0.0.2") for _ in range(2)]
        fours = [await Client.connect(server.port, source="127.0.0.4") for _ in range(3)]
        for rid, client in enumerate([*ones, *twos, *fours]):
            await client.ask(rid)
        refused = [
            await Client.connect(server.port, source=source)
            for source in ("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4")
        ]
        for client in refused:
            await client.assert_closed()
        assert (server.connections_open, server.connections_refused) == (7, 4)
        ones[0].close()  # a slot of 127.0.0.1 frees; the others stay full
        await eventually(lambda: server.connections_open == 6, "a slot freed")
        again = await Client.connect(server.port, source="127.0.0.1")
        await again.ask(10)
        for client in [*ones[1:], *twos, *fours, *refused, again]:
            client.close()
        await server.close()

    run(test)
    lines = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert len(lines) == 1, lines  # the other three within 10 s: counted, not said
    assert "max_connections_per_ip (2) open from 127.0.0.1" in lines[0]


def test_ip_overrides_are_checked_and_normalized() -> None:
    assert parse_ip_overrides("") == {}
    assert parse_ip_overrides(" 10.0.0.1:5 , ::ffff:10.0.0.2:0, [fe80::0001]:7") == {
        "10.0.0.1": 5,
        "10.0.0.2": 0,
        "fe80::1": 7,
    }
    for bad in ("10.0.0.1", "10.0.0.1:-1", "host:3", "10.0.0.1:x", ":4"):
        with pytest.raises(ValueError, match="max_connections_per_ip_overrides"):
            ServerConfig(max_connections_per_ip_overrides=bad)
    with pytest.raises(ValueError, match="max_connections_per_ip"):
        ServerConfig(max_connections_per_ip=0)


def test_idle_connections_are_closed_but_not_while_a_request_is_in_flight() -> None:
    async def test() -> None:
        handler = Handler()
        server = await started(handler, connections_max_idle_ms=100)
        idle, busy = await Client.connect(server.port), await Client.connect(server.port)
        await busy.send(frame(b"W", 1, b"slow"))
        await idle.assert_closed()
        await asyncio.sleep(0.3)
        assert server.connections_open == 1
        handler.open_gate(1)
        assert await busy.receive() == (1, b"slow")
        await busy.assert_closed()
        assert server.connections_closed == 2
        await server.close()

    run(test)


@pytest.mark.parametrize("loop", LOOPS)
def test_close_returns_promptly_with_connections_open_and_handlers_pending(loop: str) -> None:
    async def test() -> None:
        handler = Handler()
        server = await started(handler)
        clients = [await Client.connect(server.port) for _ in range(3)]
        await clients[0].send(frame(b"H", 1), frame(b"E", 2))
        await clients[1].send(frame(b"W", 3))
        await eventually(lambda: handler.calls == 3, "requests handled")
        await asyncio.wait_for(server.close(), 2.0)
        assert handler.cancelled == 1 and handler.gates[3].cancelled()
        assert server.connections_open == 0
        for client in clients:
            await client.assert_closed()

    run(test, loop)


def test_config_is_validated() -> None:
    for bad in [
        {"max_connections": 0},
        {"socket_send_buffer_bytes": 0},
        {"socket_request_max_bytes": 2**31},
        {"read_buffer_bytes": 100},
    ]:
        with pytest.raises(ValueError):
            ServerConfig(**bad)


# -- random input ----------------------------------------------------------------------------

MAX_FRAME = 4096
pieces = st.one_of(
    st.binary(max_size=200).map(lambda p: frame(b"E", 9, p)),  # well-formed
    st.binary(max_size=50).map(lambda p: SIZE.pack(len(p)) + p),  # framed, usually refused
    st.integers(-(2**31), 2**31 - 1).map(SIZE.pack),  # any size prefix
    st.binary(min_size=1, max_size=100),  # raw garbage
)


def expected_answers(stream: bytes) -> list[bytes]:
    """What the fuzz handler answers before the stream goes bad, if it is not cut short."""
    answers, at = [], 0
    while at + 4 <= len(stream):
        size = SIZE.unpack_from(stream, at)[0]
        body = stream[at + 4 : at + 4 + size]
        if not 0 <= size <= MAX_FRAME or len(body) < size or body[:2] != b"TE" or size < 6:
            break
        answers.append(SIZE.pack(size - 2) + body[2:])
        at += 4 + size
    return answers


class FuzzHandler:
    def handle(self, frame: memoryview, connection: ConnectionInfo) -> Response:
        if bytes(frame[:2]) != b"TE" or len(frame) < 6:
            raise CloseConnection("no marker")
        return [SIZE.pack(len(frame) - 2) + bytes(frame[2:])]


async def send_fuzz(client: Client, chunks: list[bytes]) -> None:
    try:
        for chunk in chunks:
            await client.send(chunk)
        client.writer.write_eof()
    except (ConnectionError, OSError):
        pass  # the server closed first


async def read_all(client: Client) -> bytes:
    """Everything received until EOF or a reset (the server may close with input unread)."""
    received = bytearray()
    try:
        while chunk := await asyncio.wait_for(client.reader.read(1 << 16), WAIT_S):
            received += chunk
    except OSError:  # a reset, or uvloop's ENOTCONN after one
        pass
    return bytes(received)


@settings(max_examples=60, deadline=None)
@given(st.lists(pieces, max_size=12), st.lists(st.integers(0, 3000), max_size=8), st.booleans())
def test_random_byte_streams_never_break_the_server(
    parts: list[bytes], cuts: list[int], on_uvloop: bool
) -> None:
    stream = b"".join(parts)
    bounds = sorted({0, len(stream), *(c % (len(stream) + 1) for c in cuts)})
    chunks = [stream[a:b] for a, b in itertools.pairwise(bounds)]

    async def test() -> None:
        server = Server(FuzzHandler(), config=ServerConfig(socket_request_max_bytes=MAX_FRAME))
        await server.start()
        fuzz, good = await Client.connect(server.port), await Client.connect(server.port)
        await send_fuzz(fuzz, chunks)
        received = await read_all(fuzz)
        assert b"".join(expected_answers(stream)).startswith(received)
        await good.send(frame(b"E", 1, b"still here"))
        assert await good.receive() == (1, b"still here")
        await eventually(lambda: server.connections_open == 1, "the fuzzed connection closed")
        fuzz.close()
        good.close()
        await server.close()

    run(test, "uvloop" if on_uvloop else "asyncio")


def read_frames(
    reader: FrameReader, frames: list[bytes], reads: list[int], hold: list[bool]
) -> list[memoryview]:
    """Feed ``frames`` to ``reader`` in reads of the given sizes, holding some frames (in
    flight) for a while; check that each comes out intact and stays intact while held.
    Every view handed out, in order."""
    stream = b"".join(SIZE.pack(len(f)) + f for f in frames)
    views: list[memoryview] = []
    held: list[tuple[memoryview, bytes, Any]] = []
    at = step = 0
    while len(views) < len(frames):
        target = reader.recv_target()
        count = min(len(target), reads[step % len(reads)], len(stream) - at)
        target[:count] = stream[at : at + count]
        reader.received(count)
        at += count
        while (item := reader.next_frame()) is not None:
            view, chunk = item
            views.append(view)
            assert bytes(view) == frames[len(views) - 1]
            if hold[len(views) % len(hold)]:
                reader.retain(chunk)
                held.append((view, bytes(view), chunk))
        if held and step % 3 == 0:
            view, copy, chunk = held.pop(0)
            assert bytes(view) == copy
            reader.release(chunk)
        step += 1
    assert all(bytes(view) == copy for view, copy, _ in held)
    return views


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=300), max_size=30),
    st.lists(st.integers(1, 700), min_size=1, max_size=20),
    st.lists(st.booleans(), min_size=1, max_size=20),
)
def test_the_frame_reader_returns_each_frame_intact(
    frames: list[bytes], reads: list[int], hold: list[bool]
) -> None:
    """Chunk by chunk, with some frames held (in flight) for a while: nothing is corrupted."""
    read_frames(FrameReader(max_frame_bytes=300, buffer_bytes=1024), frames, reads, hold)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(st.binary(max_size=100), st.binary(min_size=601, max_size=1500)), max_size=20
    ),
    st.lists(st.integers(1, 600), min_size=1, max_size=20),  # a frame over 600 B: its own
    st.lists(st.booleans(), min_size=1, max_size=20),
    st.sampled_from([0, 1000, 1500]),
)
def test_big_frames_are_intact_and_their_buffer_is_reused_only_once_released(
    frames: list[bytes], reads: list[int], hold: list[bool], keep: int
) -> None:
    """Frames over half a chunk get a buffer of their own; with ``keep_large_bytes`` one is
    kept and reused, never while a frame in it is held."""
    reader = FrameReader(max_frame_bytes=1500, buffer_bytes=1024, keep_large_bytes=keep)
    views = read_frames(reader, frames, reads, hold)
    if keep == 0:  # a fresh buffer, of the frame's size, for every frame read into its own
        own = [view.obj for view in views if len(view) > 512 and len(view.obj) == len(view)]
        assert len({id(b) for b in own}) == len(own)  # (views keeps them all alive)


def test_a_kept_big_frame_buffer_is_reused_once_released_and_not_before() -> None:
    reader = FrameReader(max_frame_bytes=1500, buffer_bytes=1024, keep_large_bytes=1500)

    def big_frame(fill: int) -> tuple[memoryview, Any]:
        data = SIZE.pack(900) + bytes([fill]) * 900
        while (item := reader.next_frame()) is None:
            target = reader.recv_target()
            count = min(len(target), len(data), 100)  # the size arrives before the body
            target[:count], data = data[:count], data[count:]
            reader.received(count)
        return item

    first, chunk = big_frame(1)
    second, _ = big_frame(2)  # the first was not held: its buffer is reused
    assert second.obj is first.obj and bytes(second) == b"\x02" * 900
    reader.retain(chunk)
    third, _ = big_frame(3)  # held: a new buffer, which is the one kept from now on
    assert third.obj is not second.obj and bytes(second) == b"\x02" * 900
    reader.release(chunk)
    fourth, _ = big_frame(4)
    assert fourth.obj is third.obj and bytes(fourth) == b"\x04" * 900


def test_the_frame_reader_checks_the_size_before_the_body() -> None:
    reader = FrameReader(max_frame_bytes=10, buffer_bytes=1024)
    target = reader.recv_target()
    target[:4] = SIZE.pack(11)
    reader.received(4)
    with pytest.raises(FrameSizeError, match="11"):
        reader.next_frame()
