"""The follower fetcher's connection to a leader (``broker.replica_fetcher._Connection``)
against a scripted leader on 127.0.0.1: answers small and large (read into a chunk, or into
a buffer of their own) are decoded intact and stay intact until the next request; an
oversized size prefix, a close mid-answer, an answer to no request and a wrong correlation
id each fail the connection with an error the fetcher reconnects on."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from broker.protocol import (
    ApiKey,
    ProtocolError,
    decode_request_header,
    encode_response,
)
from broker.protocol.framing import RequestHeader
from broker.replica_fetcher import FETCH_VERSION, FetcherConfig, ReplicaFetcher, _Connection

LIMIT = 2 << 20
Answer = Callable[[RequestHeader, asyncio.StreamWriter], Awaitable[None]]


def fetch_answer(records: bytes) -> dict[str, Any]:
    partition = {
        "partition_index": 0,
        "error_code": 0,
        "high_watermark": 7,
        "last_stable_offset": 7,
        "log_start_offset": 0,
        "aborted_transactions": None,
        "preferred_read_replica": -1,
        "records": records,
    }
    return {
        "throttle_time_ms": 0,
        "error_code": 0,
        "session_id": 0,
        "responses": [{"topic": "t", "partitions": [partition]}],
    }


def framed(header: RequestHeader, records: bytes) -> bytes:
    return b"".join(bytes(p) for p in encode_response(header, fetch_answer(records)))


def fetch_body() -> dict[str, Any]:
    return {
        "replica_id": 2,
        "max_wait_ms": 0,
        "min_bytes": 1,
        "max_bytes": LIMIT,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [],
        "forgotten_topics_data": [],
        "rack_id": "",
    }


def leader_run(answer: Answer, test: Callable[[_Connection], Coroutine[Any, Any, None]]) -> None:
    """A leader that calls ``answer`` for each request it reads; ``test`` on a connection."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                size = int.from_bytes(await reader.readexactly(4), "big", signed=True)
                frame = await reader.readexactly(size)
                await answer(decode_request_header(frame), writer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        connection = await _Connection.open("127.0.0.1", port, LIMIT)
        try:
            await test(connection)
        finally:
            connection.close()
            server.close()
            await server.wait_closed()

    asyncio.run(asyncio.wait_for(main(), 30))


async def fetch(connection: _Connection) -> Any:
    return await connection.request(ApiKey.FETCH, FETCH_VERSION, fetch_body())


def records_of(value: Any) -> bytes:
    return bytes(value.responses[0].partitions[0].records)


@pytest.mark.parametrize("size", [0, 100, 200_000, 600_000, 1_500_000])
def test_answers_small_and_large_are_decoded_intact_until_the_next_request(size: int) -> None:
    payloads = [bytes([i]) * size + bytes(range(256)) for i in range(1, 4)]

    async def answer(header: RequestHeader, writer: asyncio.StreamWriter) -> None:
        data = framed(header, payloads[header.correlation_id - 1])
        for i in range(0, len(data), 65_536):  # in pieces, as a socket may deliver them
            writer.write(data[i : i + 65_536])
            await writer.drain()

    async def test(connection: _Connection) -> None:
        for payload in payloads:
            value = await fetch(connection)
            await asyncio.sleep(0.01)  # the loop turns; the answer's memory is still lent
            assert value.responses[0].partitions[0].high_watermark == 7
            assert records_of(value) == payload

    leader_run(answer, test)


def test_an_oversized_answer_fails_before_its_body_is_read() -> None:
    async def answer(header: RequestHeader, writer: asyncio.StreamWriter) -> None:
        writer.write((LIMIT + 1).to_bytes(4, "big"))

    async def test(connection: _Connection) -> None:
        with pytest.raises(ProtocolError, match="over the"):
            await fetch(connection)
        with pytest.raises(ProtocolError):  # the connection stays failed
            await fetch(connection)

    leader_run(answer, test)


def test_a_leader_closing_mid_answer_is_an_eof() -> None:
    async def answer(header: RequestHeader, writer: asyncio.StreamWriter) -> None:
        data = framed(header, b"x" * 1000)
        writer.write(data[: len(data) // 2])
        await writer.drain()
        writer.close()

    async def test(connection: _Connection) -> None:
        with pytest.raises((EOFError, ConnectionError)):
            await fetch(connection)

    leader_run(answer, test)


def test_an_answer_to_no_request_fails_the_connection() -> None:
    async def answer(header: RequestHeader, writer: asyncio.StreamWriter) -> None:
        writer.write(framed(header, b"first"))
        await writer.drain()
        await asyncio.sleep(0.05)  # a second answer, in a read of its own
        writer.write(framed(header, b"again"))

    async def test(connection: _Connection) -> None:
        assert records_of(await fetch(connection)) == b"first"
        await asyncio.sleep(0.2)
        with pytest.raises(ProtocolError, match="no request"):
            await fetch(connection)

    leader_run(answer, test)


def test_two_answers_in_one_read_fail_the_connection() -> None:
    async def answer(header: RequestHeader, writer: asyncio.StreamWriter) -> None:
        writer.write(framed(header, b"one") + framed(header, b"two"))

    async def test(connection: _Connection) -> None:
        with pytest.raises(ProtocolError, match="no request"):
            await fetch(connection)

    leader_run(answer, test)


def test_a_wrong_correlation_id_is_refused() -> None:
    async def answer(header: RequestHeader, writer: asyncio.StreamWriter) -> None:
        wrong = header._replace(correlation_id=header.correlation_id + 1)
        writer.write(framed(wrong, b"x"))

    async def test(connection: _Connection) -> None:
        with pytest.raises(ProtocolError, match="correlation id"):
            await fetch(connection)

    leader_run(answer, test)


def test_a_fetcher_takes_an_answer_whose_one_batch_exceeds_its_records_limit() -> None:
    """A leader answers the first partition with data with a whole batch, however big
    (KIP-74): the fetcher's connection must take it, or replication from that leader stops
    for good on the first big batch (the fetcher reconnects and asks the same again). Its
    limit was the records' limit plus 1 MiB."""
    fetcher = ReplicaFetcher(
        1,
        FetcherConfig(broker_id=2, fetch_response_max_bytes=1000, largest_batch_bytes=2 << 20),
        lambda _: None,
    )
    batch = b"b" * (3 << 19)  # 1.5 MiB: beyond 1,000 + 1 MiB

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        size = int.from_bytes(await reader.readexactly(4), "big", signed=True)
        writer.write(framed(decode_request_header(await reader.readexactly(size)), batch))
        await writer.drain()
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        connection = await _Connection.open("127.0.0.1", port, fetcher.response_limit())
        try:
            assert records_of(await fetch(connection)) == batch
        finally:
            connection.close()
            server.close()
            await server.wait_closed()

    asyncio.run(asyncio.wait_for(main(), 30))
