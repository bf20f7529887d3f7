"""The Raft driver's inbox is bounded by bytes as well as by count: a message that would take
it past ``max_inbox_bytes`` (by ``envelope_bytes``, an estimate of its memory) is dropped,
counted and said once per interval; an empty inbox takes anything; what the loop takes out is
given back. Real files, no sockets; every wait is bounded."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from raft import messages as m
from raft.driver import (
    BATCH_BASE_BYTES,
    ENVELOPE_BASE_BYTES,
    RaftNode,
    RaftNodeConfig,
    envelope_bytes,
)
from raft.messages import Envelope

KIB = 1024


class Wire:
    """A transport that hands nothing on: the test plays the network through ``deliver``."""

    def __init__(self) -> None:
        self.deliver: Callable[[Envelope], None] = lambda envelope: None
        self.sent: list[Envelope] = []

    async def send(self, envelope: Envelope) -> None:
        self.sent.append(envelope)

    def set_receiver(self, callback: Callable[[Envelope], None]) -> None:
        self.deliver = callback

    def set_unreachable_listener(self, callback: Callable[[int], None]) -> None:
        pass


class Machine:
    def apply(self, offset: int, record: bytes) -> None:
        pass

    def snapshot(self) -> bytes:
        return b""

    def restore(self, data: bytes) -> None:
        pass


def fetch_answer(data_bytes: int) -> Envelope:
    batch = m.Batch(0, 0, 1, bytes(data_bytes))
    return Envelope(1, 2, m.FetchResponse(1, 1, 1, 0, (batch,)))


def fetch_request(source: int = 7) -> Envelope:
    return Envelope(source, 1, m.FetchRequest(1, source, 0, 0, 0))


def node(tmp_path: Path, max_inbox_bytes: int) -> tuple[RaftNode, Wire]:
    wire = Wire()
    config = RaftNodeConfig(1, frozenset({1}), tmp_path, max_inbox_bytes=max_inbox_bytes)
    return RaftNode(config, wire, Machine()), wire


def test_an_envelope_is_sized_by_its_records_or_chunk_plus_a_fixed_cost() -> None:
    assert envelope_bytes(fetch_request()) == ENVELOPE_BASE_BYTES
    two = Envelope(
        1, 2, m.FetchResponse(1, 1, 1, 0, (m.Batch(0, 0, 1, b"x" * 100), m.Batch(1, 1, 1, b"y")))
    )
    assert envelope_bytes(two) == ENVELOPE_BASE_BYTES + 2 * BATCH_BASE_BYTES + 101
    chunk = m.FetchSnapshotResponse(1, 1, m.SnapshotId(10, 1), 0, 5000, bytes(5000))
    assert envelope_bytes(Envelope(1, 2, chunk)) == ENVELOPE_BASE_BYTES + 5000


def test_a_message_beyond_the_inbox_bytes_is_dropped_counted_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    raft, wire = node(tmp_path, max_inbox_bytes=1024 * KIB)
    caplog.set_level(logging.WARNING, logger="raft.driver")
    try:
        big = fetch_answer(600 * KIB)
        for _ in range(5):
            wire.deliver(big)  # the first fits; each other would pass 1 MiB
        assert (raft.inbox_bytes, raft.inbox_bytes_drops) == (envelope_bytes(big), 4)
        wire.deliver(fetch_request())  # a small one still fits
        assert raft.inbox_bytes == envelope_bytes(big) + ENVELOPE_BASE_BYTES
        assert raft.inbox_full_drops == 0
        drops = [r for r in caplog.records if "inbox full" in r.getMessage()]
        assert len(drops) == 1 and "max_inbox_bytes" in drops[0].getMessage()
    finally:
        raft.close_unstarted()


def test_an_empty_inbox_takes_a_message_larger_than_its_bound(tmp_path: Path) -> None:
    raft, wire = node(tmp_path, max_inbox_bytes=1)
    try:
        wire.deliver(fetch_answer(64 * KIB))
        assert raft.inbox_bytes_drops == 0 and raft.inbox_bytes > 1
        wire.deliver(fetch_request())
        assert raft.inbox_bytes_drops == 1
    finally:
        raft.close_unstarted()


def test_what_the_loop_takes_out_of_the_inbox_is_given_back(tmp_path: Path) -> None:
    three = 3 * ENVELOPE_BASE_BYTES  # room for three small messages, not four

    async def main() -> None:
        raft, wire = node(tmp_path, max_inbox_bytes=three + ENVELOPE_BASE_BYTES - 1)
        await raft.start()
        try:
            for _ in range(2):  # twice: the second round fits only if the first was given back
                for _ in range(4):
                    wire.deliver(fetch_request())  # all at once: the loop has not run yet
                assert raft.inbox_bytes == three
                async with asyncio.timeout(10):
                    while raft.inbox_bytes:
                        await asyncio.sleep(0.01)
            assert raft.inbox_bytes_drops == 2
        finally:
            await raft.close()

    asyncio.run(main())


def test_the_inbox_bytes_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_inbox_bytes"):
        RaftNodeConfig(1, frozenset({1}), tmp_path, max_inbox_bytes=0)
