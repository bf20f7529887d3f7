"""Reading every replica of each partition through ``ReadBatches`` and comparing them, for
``runnel replicas verify`` (``replicas_command.py`` asks the controller what to read and
prints the reports).

How this works. A partition's replicas are read concurrently, one page
(``PAGE_BATCHES`` batch metas, one ``ReadBatches`` call) at a time, each up to its own high
watermark. The first page of every replica gives its log start offset, high watermark and
``compacted_below``, hence the range to compare (``replica_compare.comparison_range``) and
where in it compaction may have rewritten a replica (``compacted_end``); later pages are
asked for within it. Comparison goes window by window: a window holds the batches
whose base offset is below the smallest offset any replica has not been read to yet, so
every replica's part of it is complete, and each replica holds at most about two pages in
memory, however long its log. Only the replicas that are furthest behind are asked for
their next page.

A replica that cannot be read (its broker is not registered, has no replica-read listener,
does not answer within ``RPC_TIMEOUT_S``, or answers an error) is reported as not checked
and left out; the others are still compared. A broker that did not answer at all (or said
it is not serving yet) is not asked again for later partitions: each try may cost a
connection timeout. If the reference replica (the leader when it answers) fails midway, the
partition's comparison stops there: what was compared stands.

Replica-read addresses: a broker serves ``ReadBatches`` on its Raft transport's listener,
which is REPLICATION for a broker-only node and the controller listener (``CONTROLLER``, as
``runnel cluster up`` names it) for a combined node; a broker registers every listener it
has, and one with a CONTROLLER listener is a combined node (a broker-only node may not
have one).
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import grpc
import grpc.aio

from proto import replica_pb2 as rpb
from proto import replica_pb2_grpc
from runnel.config import REPLICATION_LISTENER
from runnel.replica_compare import (
    BatchMeta,
    Divergence,
    compacted_end,
    compare_batches,
    comparison_range,
)

__all__ = [
    "PAGE_BATCHES",
    "RPC_TIMEOUT_S",
    "PartitionReport",
    "PartitionTarget",
    "replica_read_addresses",
    "verify_partitions",
]

PAGE_BATCHES = 10_000  # batch metas per ReadBatches call (the server allows up to 100,000)
RPC_TIMEOUT_S = 30.0  # one ReadBatches call
# gRPC waits 20 s for a connection to a host that does not answer; gRPC core takes its
# minimum reconnect backoff as that connection timeout, so this option shortens it.
CONNECT_TIMEOUT_MS = 5_000
CONTROLLER_LISTENER = "CONTROLLER"
ReadCall = grpc.aio.UnaryStreamMultiCallable[rpb.ReadBatchesRequest, rpb.ReadBatchesChunk]
_SILENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
# A broker at its concurrent-RPC bound refuses a call RESOURCE_EXHAUSTED before answering
# anything: asked again after these waits (seconds), then reported like any other failure.
BUSY_RETRY_S = (0.1, 0.3, 1.0, 3.0)


@dataclass(frozen=True, slots=True)
class PartitionTarget:
    """One partition to verify, as the controller describes it."""

    topic: str
    topic_id: bytes
    partition: int
    replicas: tuple[int, ...]
    leader: int  # -1: none


@dataclass(frozen=True, slots=True)
class PartitionReport:
    """What verifying one partition found. ``not_checked`` maps a replica to why it was
    not (it is left out of the comparison)."""

    target: PartitionTarget
    reference: int | None  # the replica the others were compared with; None: none answered
    start_offset: int
    end_offset: int
    batches_compared: int
    divergences: tuple[Divergence, ...]
    not_checked: Mapping[int, str]
    # The largest compacted_below of the replicas read: replicas are compacted independently,
    # so below it their batches are compared by offsets and leader epoch only.
    compacted_below: int = 0

    @property
    def ok(self) -> bool:
        return not self.divergences and not self.not_checked


def replica_read_addresses(brokers: Iterable[Any]) -> dict[int, str]:
    """Broker id -> host:port of its replica-read service, from DescribeCluster's brokers
    (each with ``broker_id`` and ``listeners``); brokers with neither listener are left out."""
    out = {}
    for broker in brokers:
        listeners = {listener.name: listener for listener in broker.listeners}
        chosen = listeners.get(CONTROLLER_LISTENER) or listeners.get(REPLICATION_LISTENER)
        if chosen is not None:
            host = f"[{chosen.host}]" if ":" in chosen.host else chosen.host
            out[broker.broker_id] = f"{host}:{chosen.port}"
    return out


async def verify_partitions(
    targets: Iterable[PartitionTarget], addresses: Mapping[int, str]
) -> list[PartitionReport]:
    """Verify each partition in turn, with one channel per broker."""
    options = [("grpc.min_reconnect_backoff_ms", CONNECT_TIMEOUT_MS)]
    channels = {b: grpc.aio.insecure_channel(a, options=options) for b, a in addresses.items()}
    try:
        brokers = _Brokers(
            {b: replica_pb2_grpc.ReplicaReadServiceStub(c).ReadBatches for b, c in channels.items()}
        )
        return [await _verify(target, brokers) for target in targets]
    finally:
        for channel in channels.values():
            await channel.close(None)


# -- reading pages -----------------------------------------------------------------------------


class _Page(NamedTuple):
    log_start_offset: int
    high_watermark: int
    batches: list[BatchMeta]
    next_offset: int
    end_reached: bool
    compacted_below: int


class _Unreadable(Exception):
    """A replica could not be read: the message says why. ``silent``: its broker did not
    answer at all (or not in time, or said it is not serving yet)."""

    def __init__(self, message: str, *, silent: bool = False) -> None:
        super().__init__(message)
        self.silent = silent


def _request(target: PartitionTarget, start: int | None, end: int | None) -> rpb.ReadBatchesRequest:
    request = rpb.ReadBatchesRequest(
        topic=target.topic,
        partition=target.partition,
        topic_id=target.topic_id,
        upper_bound=rpb.HIGH_WATERMARK,
        max_batches=PAGE_BATCHES,
    )
    if start is not None:
        request.start_offset = start
    if end is not None:
        request.end_offset = end
    return request


async def _read_page(call: ReadCall, broker_id: int, request: rpb.ReadBatchesRequest) -> _Page:
    for wait_s in (*BUSY_RETRY_S, None):
        batches: list[BatchMeta] = []
        last: rpb.ReadBatchesChunk | None = None
        try:
            async for chunk in call(request, timeout=RPC_TIMEOUT_S):
                if chunk.broker_id != broker_id:
                    raise _Unreadable(f"its address is served by broker {chunk.broker_id}")
                batches.extend(BatchMeta(*_fields(b)) for b in chunk.batches)
                last = chunk
            break
        except grpc.aio.AioRpcError as e:
            busy = e.code() is grpc.StatusCode.RESOURCE_EXHAUSTED and last is None
            if busy and wait_s is not None:
                await asyncio.sleep(wait_s)
                continue
            silent = e.code() in _SILENT
            raise _Unreadable(f"{e.code().name}: {e.details()}", silent=silent) from None
    if last is None:
        raise _Unreadable("ReadBatches answered no chunk at all")
    # A page short of the end must get somewhere, or the replica would be asked forever.
    asked = request.start_offset if request.HasField("start_offset") else -1
    if not last.end_reached and (not batches or last.next_offset <= asked):
        raise _Unreadable(f"ReadBatches made no progress from offset {asked}")
    return _Page(
        last.log_start_offset,
        last.high_watermark,
        batches,
        last.next_offset,
        last.end_reached,
        last.compacted_below,
    )


def _fields(b: rpb.BatchMeta) -> tuple[int, int, int, int, int]:
    return b.base_offset, b.last_offset, b.leader_epoch, b.crc, b.size_bytes


class _Brokers:
    """The brokers' ReadBatches calls, and the brokers that did not answer: those are not
    asked again for later partitions (each try may wait for a connection timeout)."""

    def __init__(self, calls: Mapping[int, ReadCall]) -> None:
        self._calls = dict(calls)
        self._silent: dict[int, str] = {}

    def why_not_asked(self, broker_id: int) -> str | None:
        if broker_id not in self._calls:
            return (
                f"broker {broker_id} is not registered, or has no {REPLICATION_LISTENER} listener"
            )
        return self._silent.get(broker_id)

    async def read_pages(
        self, requests: Mapping[int, rpb.ReadBatchesRequest]
    ) -> dict[int, _Page | str]:
        """One page from each replica asked, concurrently; a string says why one failed."""
        ids = list(requests)
        pages = await asyncio.gather(*(self._read_page(b, requests[b]) for b in ids))
        return dict(zip(ids, pages, strict=True))

    async def _read_page(self, broker_id: int, request: rpb.ReadBatchesRequest) -> _Page | str:
        try:
            return await _read_page(self._calls[broker_id], broker_id, request)
        except _Unreadable as e:
            if e.silent:
                self._silent[broker_id] = f"not asked: it failed for an earlier partition: {e}"
            return str(e)


# -- one partition -----------------------------------------------------------------------------


@dataclass(slots=True)
class _Replica:
    """What has been read of one replica and not compared yet."""

    broker_id: int
    log_start_offset: int
    high_watermark: int
    compacted_below: int
    next_offset: int = 0
    end_reached: bool = False
    buffer: list[BatchMeta] = field(default_factory=list)

    def add(self, page: _Page) -> None:
        self.buffer.extend(page.batches)
        self.next_offset, self.end_reached = page.next_offset, page.end_reached

    def pending(self, start: int, end: int) -> bool:
        """Whether batches in [start, end) may still be unread."""
        return start < end and not self.end_reached and self.next_offset < end

    def take_below(self, offset: int | None) -> list[BatchMeta]:
        """Remove and return the buffered batches whose base offset is below ``offset``
        (all of them for None)."""
        cut = len(self.buffer) if offset is None else _first_at_or_after(self.buffer, offset)
        taken, self.buffer = self.buffer[:cut], self.buffer[cut:]
        return taken


def _first_at_or_after(batches: list[BatchMeta], offset: int) -> int:
    return bisect.bisect_left(batches, offset, key=lambda b: b.base_offset)


async def _verify(target: PartitionTarget, brokers: _Brokers) -> PartitionReport:
    not_checked: dict[int, str] = {}
    for b in target.replicas:
        why = brokers.why_not_asked(b)
        if why is not None:
            not_checked[b] = why
    asked = [b for b in target.replicas if b not in not_checked]
    firsts = await brokers.read_pages({b: _request(target, None, None) for b in asked})
    replicas: dict[int, _Replica] = {}
    for b, got in firsts.items():
        if isinstance(got, str):
            not_checked[b] = got
        else:
            replicas[b] = _Replica(b, got.log_start_offset, got.high_watermark, got.compacted_below)
            replicas[b].add(got)
    if not replicas:
        return PartitionReport(target, None, 0, 0, 0, (), not_checked)
    reference = target.leader if target.leader in replicas else min(replicas)
    start, end = comparison_range(replicas.values())
    compacted_below = compacted_end(replicas.values())
    compared, divergences = await _compare_windows(
        target, brokers, replicas, reference, (start, end, compacted_below), not_checked
    )
    return PartitionReport(
        target,
        reference,
        start,
        end,
        compared,
        tuple(divergences.values()),
        not_checked,
        compacted_below,
    )


async def _compare_windows(
    target: PartitionTarget,
    brokers: _Brokers,
    replicas: dict[int, _Replica],
    reference: int,
    bounds: tuple[int, int, int],  # start, end, compacted_below
    not_checked: dict[int, str],
) -> tuple[int, dict[int, Divergence]]:
    """Compare window by window until every replica is read; replicas that fail are moved
    to ``not_checked``, and one that diverged is read no further. Returns (batches
    compared, the first divergence per replica)."""
    start, end, compacted_below = bounds
    compared, divergences = 0, dict[int, Divergence]()
    while reference in replicas:
        behind = [r for r in replicas.values() if r.pending(start, end)]
        below = min((r.next_offset for r in behind), default=None)
        window = {b: r.take_below(below) for b, r in replicas.items()}
        count, found = compare_batches(reference, window, start, end, compacted_below)
        compared += count
        for divergence in found:
            divergences[divergence.replica] = divergence
            del replicas[divergence.replica]
        if below is None:
            break
        laggards = {
            r.broker_id: _request(target, max(r.next_offset, start), end)
            for r in behind
            if r.next_offset == below and r.broker_id in replicas
        }
        for b, got in (await brokers.read_pages(laggards)).items():
            if isinstance(got, str):
                not_checked[b] = got
                del replicas[b]
            else:
                replicas[b].add(got)
    return compared, divergences
