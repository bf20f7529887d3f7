"""Reading the batch metadata of a partition's local replica: ``ReplicaReadService``
(``proto/replica.proto``), served by every broker.

How this works. ``ReadBatches`` finds the partition's log through a ``LogSource`` (on a broker,
its ``ReplicaManager``), reads the log's offsets once, checks the request against them
(``plan_read``, pure) and walks the batch headers with a ``HeaderCursor`` over the segments
as they were at that moment. The cursor reads each batch's 61-byte header and nothing else
(one ``pread`` per batch, then a jump over the records by the batch's length), so a walk
costs a system call per batch whatever the batches hold. Each chunk of at most
``BATCHES_PER_CHUNK`` headers is read in a worker thread, and the event loop sends it before
the next is read: a cold disk stalls this call, never the broker (and at most
``MAX_CONCURRENT_CHUNK_READS`` chunks are read at once, whatever the number of calls, so
the broker's worker threads stay free for its own work). A call walks at most
``max_batches`` (``DEFAULT_MAX_BATCHES`` unless asked, ``MAX_BATCHES`` at most); the last
chunk says where a further call goes on.

A client that stops reading. Sending a chunk waits for HTTP/2 flow control, i.e. for the
client to take what it was sent; a chunk not taken within ``write_timeout_ms`` ends the call
(``ClientTooSlow``, DEADLINE_EXCEEDED), so the handler, its cursor (and the segment files it
holds open) are released. grpc.aio cannot withdraw the chunk being sent, and the status goes
out behind it: the client sees DEADLINE_EXCEEDED once it reads on, and until it reads on or
goes away (cancels, hits its own deadline, closes its channel) the call still holds one of
the gRPC server's ``maximum_concurrent_rpcs`` slots (grpcio 1.85; the aio server has no
per-call cancel). So at most ``max_calls`` calls are held at once, counted until gRPC has
closed them (``add_done_callback``), and one more is refused RESOURCE_EXHAUSTED: stalled
readers cannot take the slots Raft and the controller API share the server with.

Consistency. Bytes below the high watermark never change, so a walk bounded by it sees a
stable log, even if retention deletes a segment meanwhile (an open descriptor keeps its
file). A walk up to the log end may meet a follower's truncation: it then stops early (the
file ended) or, if the tail was rewritten under it, fails with INTERNAL; asking again gives
the new log.

Errors are typed (``ReplicaReadError`` and its subclasses, each with its gRPC status) and
mapped to a status once, in ``ReplicaReadService.ReadBatches`` (set on the context, not
``abort``ed: ``abort`` waits until the status is sent, which a client that stopped reading
holds back); ``retriable`` marks the ones worth asking again.

Concurrency: the service runs on the broker's event loop; a ``HeaderCursor`` is used by one
call, on one thread at a time (the worker thread reads, the loop waits).
"""

from __future__ import annotations

import asyncio
import bisect
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import grpc
import grpc.aio

from broker.replica_manager import ReplicaManager, topic_id_text
from proto import replica_pb2 as rpb
from proto import replica_pb2_grpc
from storage.batch import HEADER_SIZE, LOG_OVERHEAD, MAGIC_V2, BatchHeader, unpack_header
from storage.errors import StorageError
from storage.log import Log
from storage.segment import LogSegment

__all__ = [
    "BATCHES_PER_CHUNK",
    "DEFAULT_MAX_BATCHES",
    "DEFAULT_MAX_CALLS",
    "DEFAULT_WRITE_TIMEOUT_MS",
    "MAX_BATCHES",
    "MAX_CONCURRENT_CHUNK_READS",
    "ClientTooSlow",
    "HeaderCursor",
    "InvalidRequest",
    "LogOffline",
    "LogSource",
    "NotServing",
    "OffsetOutOfRange",
    "ReadPlan",
    "ReplicaManagerSource",
    "ReplicaReadError",
    "ReplicaReadService",
    "UnknownPartition",
    "UnreadableBatch",
    "batch_meta",
    "plan_read",
]

BATCHES_PER_CHUNK = 1_000  # batch metas per streamed message (about 30 KB)
DEFAULT_MAX_BATCHES = 10_000  # per call, when the request asks for 0
MAX_BATCHES = 100_000  # per call; more is INVALID_ARGUMENT
MAX_CONCURRENT_CHUNK_READS = 4  # worker threads reading headers at once; other calls wait
# The longest a chunk (about 30 KB) may wait for the client to take it before the call ends.
# A slow but live reader (a Spark task, a verify run comparing pages) takes 30 KB in
# milliseconds even at 1 MB/s, and HTTP/2 buffers a chunk or more ahead of it; 30 s is reached
# by a client that stopped reading, or one doing seconds of work per batch between reads
# (it should ask for fewer batches per call and call again from next_offset).
DEFAULT_WRITE_TIMEOUT_MS = 30_000
# Calls held at once (until gRPC closes them); a quarter of the transport's default
# max_concurrent_rpcs at most, so that Raft keeps slots (runnel/config.py checks it).
DEFAULT_MAX_CALLS = 1_000
TOPIC_ID_BYTES = 16
Context = grpc.aio.ServicerContext[Any, Any]


# -- errors ------------------------------------------------------------------------------------


class ReplicaReadError(Exception):
    """An operating error of one call, answered with ``status`` and the message."""

    status = grpc.StatusCode.INTERNAL
    retriable = False


class NotServing(ReplicaReadError):
    """The broker does not serve partitions yet (starting, fenced), or the log was closed
    (the broker is shutting down, or the partition was deleted just now)."""

    status = grpc.StatusCode.UNAVAILABLE
    retriable = True


class LogOffline(ReplicaReadError):
    """The log's directory went offline after an I/O error, or reading it failed."""

    status = grpc.StatusCode.FAILED_PRECONDITION


class UnknownPartition(ReplicaReadError):
    status = grpc.StatusCode.NOT_FOUND


class InvalidRequest(ReplicaReadError):
    status = grpc.StatusCode.INVALID_ARGUMENT


class OffsetOutOfRange(ReplicaReadError):
    status = grpc.StatusCode.OUT_OF_RANGE


class UnreadableBatch(ReplicaReadError):
    """A batch header that is not one (a corrupt file, or a tail rewritten under the walk)."""

    status = grpc.StatusCode.INTERNAL
    retriable = True


class ClientTooSlow(ReplicaReadError):
    """The client did not take a chunk within the write timeout (it stopped reading)."""

    status = grpc.StatusCode.DEADLINE_EXCEEDED
    retriable = True


# -- finding the log ---------------------------------------------------------------------------


class LogSource(Protocol):
    """Where the service finds a partition's local log. ``find`` is called with a checked
    identity (a topic name or a 16-byte topic id, or both; a partition >= 0) and raises
    ``NotServing`` or ``UnknownPartition``; it never returns None."""

    @property
    def broker_id(self) -> int: ...

    def find(self, topic: str, partition: int, topic_id: bytes) -> Log: ...


def _check_identity(topic: str, partition: int, topic_id: bytes) -> None:
    if not topic and not topic_id:
        raise InvalidRequest("name the partition by topic, topic_id or both")
    if topic_id and len(topic_id) != TOPIC_ID_BYTES:
        raise InvalidRequest(f"topic_id has {len(topic_id)} bytes, not {TOPIC_ID_BYTES}")
    if partition < 0:
        raise InvalidRequest(f"partition {partition} is negative")


def _described(topic: str, partition: int, topic_id: bytes) -> str:
    return f"{topic or topic_id_text(topic_id)}-{partition}"


class ReplicaManagerSource:
    """A broker's logs, through its ``ReplicaManager`` once it has applied an image (the
    node creates the manager at start-up, but it applies the first image once unfenced)."""

    def __init__(self, replicas: ReplicaManager) -> None:
        self._replicas = replicas

    @property
    def broker_id(self) -> int:
        return self._replicas.broker_id

    def find(self, topic: str, partition: int, topic_id: bytes) -> Log:
        manager, broker = self._replicas, self.broker_id
        if manager.image is None:
            raise NotServing(f"broker {broker} is not serving partitions yet")
        found = manager.get(topic, partition) if topic else manager.get_by_id(topic_id, partition)
        name = _described(topic, partition, topic_id)
        if found is None:
            raise UnknownPartition(f"broker {broker} holds no replica of {name}")
        if topic_id and found.topic_id != topic_id:
            raise UnknownPartition(
                f"broker {broker} holds {name} of topic id "
                f"{topic_id_text(found.topic_id)}, not {topic_id_text(topic_id)}"
            )
        return found.log


# -- the plan of one call ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """What one call walks: batches overlapping [start_offset, end_offset), at most
    ``max_batches``; and the replica's offsets when it started."""

    start_offset: int
    end_offset: int
    max_batches: int
    log_start_offset: int
    high_watermark: int
    log_end_offset: int
    compacted_below: int = 0  # the replica's Log.compacted_below


def plan_read(
    request: rpb.ReadBatchesRequest,
    log_start_offset: int,
    high_watermark: int,
    log_end: int,
    compacted_below: int = 0,
) -> ReadPlan:
    """Check ``request`` against the replica's offsets; raises InvalidRequest or
    OffsetOutOfRange."""
    max_batches = request.max_batches or DEFAULT_MAX_BATCHES
    if not 0 < max_batches <= MAX_BATCHES:
        raise InvalidRequest(f"max_batches {request.max_batches} is not within 0-{MAX_BATCHES}")
    start = request.start_offset if request.HasField("start_offset") else log_start_offset
    if start < 0:
        raise InvalidRequest(f"start_offset {start} is negative")
    if not log_start_offset <= start <= log_end:
        bounds = f"[{log_start_offset}, {log_end}]"
        raise OffsetOutOfRange(f"start_offset {start} is outside {bounds} (log start, log end)")
    end = _upper_bound(request.upper_bound, high_watermark, log_end)
    if request.HasField("end_offset"):
        if request.end_offset < start:
            raise InvalidRequest(f"end_offset {request.end_offset} is below the start {start}")
        end = min(end, request.end_offset)
    return ReadPlan(
        start, end, max_batches, log_start_offset, high_watermark, log_end, compacted_below
    )


def _upper_bound(bound: int, high_watermark: int, log_end: int) -> int:
    if bound == rpb.HIGH_WATERMARK:
        return high_watermark
    if bound == rpb.LOG_END:
        return log_end
    raise InvalidRequest(f"upper_bound {bound} is not LOG_END (0) or HIGH_WATERMARK (1)")


# -- walking headers ---------------------------------------------------------------------------


class HeaderCursor:
    """The headers of the batches overlapping [start_offset, end_offset) in ``segments``
    (a snapshot, in base-offset order), read a chunk at a time. Reads headers only."""

    def __init__(self, segments: Sequence[LogSegment], start_offset: int, end_offset: int) -> None:
        self._segments = tuple(segments)
        bases = [s.base_offset for s in self._segments]
        self._index = max(bisect.bisect_right(bases, start_offset) - 1, 0)
        self._position: int | None = None  # in the current segment; None: not located yet
        self._end = end_offset
        self.next_offset = start_offset  # after the last batch read (the start before one)
        self.done = start_offset >= end_offset or not self._segments

    def read(self, max_batches: int) -> list[BatchHeader]:
        """Up to ``max_batches`` more headers; ``done`` once nothing is left before the end.
        Raises UnreadableBatch, or OSError if the log's files were closed."""
        out: list[BatchHeader] = []
        while len(out) < max_batches and not self.done:
            header = self._next_header()
            if header is None or header.base_offset >= self._end:
                self.done = True
                break
            out.append(header)
            self.next_offset = header.next_offset
        return out

    def _next_header(self) -> BatchHeader | None:
        while self._index < len(self._segments):
            segment = self._segments[self._index]
            if self._position is None:
                found = segment.translate_offset(self.next_offset)
                self._position = found[0] if found is not None else segment.size
            header = _header_at(segment, self._position)
            if header is not None:
                self._position += header.batch_length + LOG_OVERHEAD
                return header
            self._index, self._position = self._index + 1, None
        return None


def _header_at(segment: LogSegment, position: int) -> BatchHeader | None:
    """The header of the batch at ``position``; None where the segment ends (or was cut
    short under us)."""
    size = segment.size
    if position + HEADER_SIZE > size:
        return None
    raw = os.pread(segment.handle.fd, HEADER_SIZE, position)
    if len(raw) < HEADER_SIZE:
        return None
    header = unpack_header(raw)
    batch_size = header.batch_length + LOG_OVERHEAD
    if header.magic != MAGIC_V2 or batch_size < HEADER_SIZE or position + batch_size > size:
        raise UnreadableBatch(
            f"{segment.log_path.name}: byte {position}: not a batch header (magic "
            f"{header.magic}, {batch_size} bytes, in a segment of {size})"
        )
    return header


def batch_meta(header: BatchHeader) -> rpb.BatchMeta:
    return rpb.BatchMeta(
        base_offset=header.base_offset,
        last_offset=header.last_offset,
        leader_epoch=header.partition_leader_epoch,
        crc=header.crc,
        size_bytes=header.size_bytes,
    )


# -- the service -------------------------------------------------------------------------------


class ReplicaReadService(replica_pb2_grpc.ReplicaReadServiceServicer):
    """Serves ``ReplicaReadService`` from the logs ``source`` finds; a chunk the client does
    not take within ``write_timeout_ms`` ends its call, and at most ``max_calls`` calls are
    held at once. ``calls_in_progress`` counts the handlers running (a call ended by the
    timeout no longer counts), ``calls_held`` the calls gRPC has not closed yet."""

    def __init__(
        self,
        source: LogSource,
        write_timeout_ms: int = DEFAULT_WRITE_TIMEOUT_MS,
        max_calls: int = DEFAULT_MAX_CALLS,
    ) -> None:
        if write_timeout_ms < 1:
            raise ValueError(f"write_timeout_ms must be at least 1, got {write_timeout_ms}")
        if max_calls < 1:
            raise ValueError(f"max_calls must be at least 1, got {max_calls}")
        self.source = source
        self.write_timeout_ms = write_timeout_ms
        self.max_calls = max_calls
        self.calls_in_progress = 0
        self.calls_held = 0
        self._readers = asyncio.Semaphore(MAX_CONCURRENT_CHUNK_READS)

    def register(self, server: grpc.aio.Server) -> None:
        replica_pb2_grpc.add_ReplicaReadServiceServicer_to_server(self, server)

    async def ReadBatches(self, request: rpb.ReadBatchesRequest, context: Context) -> None:
        if self.calls_held >= self.max_calls:
            context.set_code(grpc.StatusCode.RESOURCE_EXHAUSTED)
            context.set_details(
                f"broker {self.source.broker_id} holds {self.calls_held} replica reads "
                f"(broker.replica_read_max_calls); try again"
            )
            return
        self.calls_held += 1
        context.add_done_callback(cast(Any, self._closed))  # the stubs want a class there
        self.calls_in_progress += 1
        try:
            _check_identity(request.topic, request.partition, request.topic_id)
            log = self.source.find(request.topic, request.partition, request.topic_id)
            plan, cursor = _start(log, request)
            await self._stream(context, log, plan, cursor)
        except ReplicaReadError as e:
            context.set_code(e.status)
            context.set_details(str(e))
        finally:
            self.calls_in_progress -= 1

    def _closed(self, _: object) -> None:
        self.calls_held -= 1

    async def _stream(
        self, context: Context, log: Log, plan: ReadPlan, cursor: HeaderCursor
    ) -> None:
        """At least one chunk (it carries the offsets), then one per ``BATCHES_PER_CHUNK``."""
        sent = 0
        while True:
            wanted = min(BATCHES_PER_CHUNK, plan.max_batches - sent)
            async with self._readers:
                headers = await asyncio.to_thread(_read_chunk, log, cursor, wanted)
            sent += len(headers)
            await self._write(context, self._chunk(plan, headers, cursor))
            if cursor.done or sent >= plan.max_batches:
                return

    async def _write(self, context: Context, chunk: rpb.ReadBatchesChunk) -> None:
        """Send ``chunk``; raises ClientTooSlow if the client has not taken it in time."""
        try:
            async with asyncio.timeout(self.write_timeout_ms / 1000):
                await context.write(chunk)
        except TimeoutError:
            raise ClientTooSlow(
                f"the client took no chunk for {self.write_timeout_ms} ms: call ended"
            ) from None

    def _chunk(
        self, plan: ReadPlan, headers: list[BatchHeader], cursor: HeaderCursor
    ) -> rpb.ReadBatchesChunk:
        return rpb.ReadBatchesChunk(
            batches=[batch_meta(h) for h in headers],
            broker_id=self.source.broker_id,
            log_start_offset=plan.log_start_offset,
            high_watermark=plan.high_watermark,
            log_end_offset=plan.log_end_offset,
            next_offset=cursor.next_offset,
            end_reached=cursor.done,
            compacted_below=plan.compacted_below,
        )


def _start(log: Log, request: rpb.ReadBatchesRequest) -> tuple[ReadPlan, HeaderCursor]:
    """The plan and a cursor over the segments as they are now (read on the event loop, so
    the offsets and the segment list belong together)."""
    _check_readable(log)
    plan = plan_read(
        request,
        log.log_start_offset,
        log.high_watermark,
        log.log_end_offset,
        log.compacted_below,
    )
    return plan, HeaderCursor(log.segments, plan.start_offset, plan.end_offset)


def _check_readable(log: Log) -> None:
    if log.closed:  # a closed log counts as offline too: say which it is
        raise NotServing(f"the log of {log.dir.name} was closed (deleted, or shutting down)")
    if log.offline:
        raise LogOffline(f"the log directory of {log.dir.name} is offline")


def _read_chunk(log: Log, cursor: HeaderCursor, max_batches: int) -> list[BatchHeader]:
    """In a worker thread: the next headers, with a closed log's files reported as such."""
    try:
        return cursor.read(max_batches)
    except (OSError, StorageError, UnreadableBatch) as e:
        _check_readable(log)  # a log closed or taken offline meanwhile explains any failure
        if isinstance(e, UnreadableBatch):
            raise
        raise LogOffline(f"reading {log.dir.name} failed: {e}") from e
