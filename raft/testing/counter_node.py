"""A Raft voter process with a trivial state machine (a replicated counter), for tests and
``bench/raft.py``: real gRPC between processes, real files, killable with SIGKILL.

Usage::

    python -m raft.testing.counter_node --node-id 1 --voters 1@127.0.0.1:7001,2@... \\
        --client-port 7101 --data-dir DIR [--election-timeout-ms 1000] [--snapshot-every 1000]

Clients speak a line protocol on ``127.0.0.1:<client port>``, and may pipeline: requests are
answered in order, up to ``MAX_IN_FLIGHT`` of a connection's requests are worked on at once:

    INCR <n>   -> OK <offset of the last record>      (n records, committed before the reply)
    GET        -> VALUE <counter> <applied offset>    (after a linearizable read barrier)
    STATUS     -> STATUS <role> <epoch> <leader> <high watermark> <counter>
    any of them on a non-leader -> NOTLEADER <leader id> <epoch>

SIGTERM closes the node gracefully (a leader resigns); SIGKILL is what the tests use.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Coroutine
from functools import partial
from pathlib import Path
from typing import Any

import uvloop

from raft.core import NotLeader, RaftConfig
from raft.driver import RaftNode, RaftNodeConfig
from raft.transport import GrpcTransport
from raft.voters import parse_quorum_voters

MAX_INCR = 10_000
MAX_IN_FLIGHT = 1024  # requests of one connection being answered; reading waits beyond
MAX_LINE_BYTES = 256


class Counter:
    def __init__(self) -> None:
        self.value = 0

    def apply(self, offset: int, record: bytes) -> None:
        self.value += int(record)

    def snapshot(self) -> bytes:
        return str(self.value).encode()

    def restore(self, data: bytes) -> None:
        self.value = int(data)


async def serve(args: argparse.Namespace) -> None:
    voters = parse_quorum_voters(args.voters)
    raft_config = RaftConfig(
        election_timeout_ms=args.election_timeout_ms,
        fetch_timeout_ms=args.fetch_timeout_ms,
        fetch_max_wait_ms=min(500, args.fetch_timeout_ms // 4),
        election_backoff_max_ms=args.election_timeout_ms,
    )
    transport = GrpcTransport(
        args.node_id,
        voters[args.node_id],
        peers={node_id: address for node_id, address in voters.items() if node_id != args.node_id},
    )
    counter = Counter()
    config = RaftNodeConfig(
        args.node_id,
        frozenset(voters),
        Path(args.data_dir),
        raft_config,
        snapshot_interval_records=args.snapshot_every,
    )
    node = RaftNode(config, transport, counter)
    await transport.start()
    await node.start()
    server = await asyncio.start_server(
        lambda r, w: serve_lines(r, w, partial(_answer, node, counter)),
        "127.0.0.1",
        args.client_port,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    print(f"ready node {args.node_id}", flush=True)
    await stop.wait()
    server.close()
    await node.close()
    await transport.close()


async def serve_lines(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    answer: Callable[[list[str]], Coroutine[Any, Any, str]],
) -> None:
    """Serve one client connection: read requests and start answering each at once; a second
    task writes the answers in request order, so a client may pipeline (proposals of one
    connection then share batches). Also the bench's baseline server."""
    answers: asyncio.Queue[asyncio.Task[str] | None] = asyncio.Queue(MAX_IN_FLIGHT)
    replier = asyncio.create_task(_reply_in_order(answers, writer))
    try:
        with contextlib.suppress(ConnectionError, ValueError):  # ValueError: line too long
            while line := await reader.readline():
                words = line[:MAX_LINE_BYTES].decode(errors="replace").split()
                await answers.put(asyncio.create_task(answer(words)))
        await answers.put(None)
        await replier
    finally:
        replier.cancel()
        writer.close()


async def _reply_in_order(
    answers: asyncio.Queue[asyncio.Task[str] | None], writer: asyncio.StreamWriter
) -> None:
    with contextlib.suppress(ConnectionError):
        while (task := await answers.get()) is not None:
            writer.write((await task + "\n").encode())
            if answers.empty():
                await writer.drain()


async def _answer(node: RaftNode, counter: Counter, words: list[str]) -> str:
    try:
        match words:
            case ["INCR", count] if count.isdigit() and 0 < int(count) <= MAX_INCR:
                return f"OK {await node.propose([b'1'] * int(count))}"
            case ["GET"]:
                await node.read_barrier()
                return f"VALUE {counter.value} {node.high_watermark}"
            case ["STATUS"]:
                return (
                    f"STATUS {node.role} {node.epoch} {node.leader_id} "
                    f"{node.high_watermark} {counter.value}"
                )
            case _:
                return f"ERR expected INCR <1..{MAX_INCR}>, GET or STATUS"
    except NotLeader as e:
        return f"NOTLEADER {e.leader_id} {e.epoch}"
    except TimeoutError:
        return "ERR timed out"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node-id", type=int, required=True)
    parser.add_argument("--voters", required=True, help="1@host:port,2@host:port,...")
    parser.add_argument("--client-port", type=int, required=True)
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--election-timeout-ms", type=int, default=1000)
    parser.add_argument("--fetch-timeout-ms", type=int, default=2000)
    parser.add_argument("--snapshot-every", type=int, default=10_000)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    uvloop.run(serve(parser.parse_args()))  # asyncio's own loop costs a quarter more CPU


if __name__ == "__main__":
    main()
