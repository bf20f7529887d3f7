"""``ReplicaReadService`` in-process, over real gRPC, on real logs in ``tmp_path``;
``runnel replicas verify``'s reading and comparing (``runnel/replicas_verify.py``) against
several such services at once, one per replica, and the command's output; and the service
on a combined controller + broker ``RunnelNode``, where it shares the controller listener.

Each log is filled with batches built here and appended as a follower would (offsets and
epochs verbatim), so two logs given the same batches hold the same bytes. What the service
streams is checked against ``Log.batches``, which reads the segments by another path.
(Real broker processes: test_replica_read_cluster.py.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio
import pytest
from support import FakeClock, make_batch
from test_node import write_config

import runnel.replicas_command as replicas_command
import runnel.replicas_verify as replicas_verify
from broker.replica_manager import ReplicaManager
from broker.replica_read import (
    BATCHES_PER_CHUNK,
    MAX_BATCHES,
    HeaderCursor,
    ReplicaManagerSource,
    ReplicaReadService,
    UnknownPartition,
    UnreadableBatch,
)
from controller.client import ControllerClient
from proto import controller_pb2 as cpb
from proto import metadata_pb2 as mpb
from proto import replica_pb2 as rpb
from proto import replica_pb2_grpc
from raft.testing.processes import free_ports
from runnel import cli
from runnel.config import load_config
from runnel.node import RunnelNode
from runnel.replica_compare import BatchMeta
from runnel.replicas_verify import PartitionTarget, replica_read_addresses, verify_partitions
from storage.batch import HEADER_SIZE
from storage.cleaner import compact
from storage.config import LogConfig
from storage.loader import load_log
from storage.log import Log
from storage.log_manager import LogManager
from storage.records import RecordInput, build_batch

T = TypeVar("T")
WAIT_S = 30.0  # any one test's asyncio part
CONFIG = LogConfig(segment_bytes=4096)  # a few dozen small batches per segment


# -- logs and servers --------------------------------------------------------------------------


def batch(offset: int, *, records: int = 1, epoch: int = 1, tag: str = "v") -> bytes:
    values = [f"{tag}-{offset + i:06d}".encode() for i in range(records)]
    return make_batch(values, base_offset=offset, partition_leader_epoch=epoch)


def fill(log: Log, count: int, *, start: int = 0, records: int = 1, **kwargs: Any) -> None:
    """Append ``count`` batches from offset ``start`` and commit them all (HW = LEO)."""
    for i in range(count):
        log.append_as_follower(batch(start + i * records, records=records, **kwargs))
    log.update_high_watermark(log.log_end_offset)


def stored(log: Log, start: int = 0) -> list[BatchMeta]:
    return [
        BatchMeta(h.base_offset, h.last_offset, h.partition_leader_epoch, h.crc, h.size_bytes)
        for _, _, h in log.batches(start)
    ]


def metas(chunks: list[rpb.ReadBatchesChunk]) -> list[BatchMeta]:
    return [
        BatchMeta(b.base_offset, b.last_offset, b.leader_epoch, b.crc, b.size_bytes)
        for c in chunks
        for b in c.batches
    ]


@pytest.fixture
def new_log(tmp_path: Path) -> Iterator[Callable[[str], Log]]:
    """Open a log named ``name`` (as ``topic-partition``) in tmp_path; closed after."""
    opened: list[Log] = []

    def open_log(name: str) -> Log:
        log = load_log(tmp_path / name, CONFIG, clock=FakeClock())
        opened.append(log)
        return log

    yield open_log
    for log in opened:
        if not log.closed:
            log.close()


class Logs:
    """A ``LogSource`` over logs by ``topic-partition`` name."""

    def __init__(self, broker_id: int, logs: dict[str, Log]) -> None:
        self.broker_id = broker_id
        self.logs = logs

    def find(self, topic: str, partition: int, topic_id: bytes) -> Log:
        found = self.logs.get(f"{topic}-{partition}")
        if found is None:
            raise UnknownPartition(f"broker {self.broker_id} holds no replica of {topic}")
        return found


@contextlib.asynccontextmanager
async def serving(*sources: Any) -> AsyncIterator[list[str]]:
    """One gRPC server per source on 127.0.0.1; yields their addresses."""
    servers, addresses = [], []
    try:
        for source in sources:
            server = grpc.aio.server()
            ReplicaReadService(source).register(server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            servers.append(server)
            addresses.append(f"127.0.0.1:{port}")
        yield addresses
    finally:
        for server in servers:
            await server.stop(None)


async def read(address: str, request: rpb.ReadBatchesRequest) -> list[rpb.ReadBatchesChunk]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = replica_pb2_grpc.ReplicaReadServiceStub(channel)
        return [chunk async for chunk in stub.ReadBatches(request, timeout=10)]


def run(make: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(make(), WAIT_S)

    return asyncio.run(bounded())


def call_once(source: Any, request: rpb.ReadBatchesRequest) -> list[rpb.ReadBatchesChunk]:
    async def main() -> list[rpb.ReadBatchesChunk]:
        async with serving(source) as (address,):
            return await read(address, request)

    return run(main)


def refused(source: Any, request: rpb.ReadBatchesRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        call_once(source, request)
    return caught.value


def request(**fields: Any) -> rpb.ReadBatchesRequest:
    return rpb.ReadBatchesRequest(**{"topic": "t", "partition": 0, **fields})


# -- the service -------------------------------------------------------------------------------


def test_every_batch_streams_in_chunks_of_a_thousand_with_the_offsets(new_log: Any) -> None:
    log = new_log("t-0")
    fill(log, 2_500, epoch=3)
    assert len(log.segments) > 10
    chunks = call_once(Logs(7, {"t-0": log}), request())
    assert [len(c.batches) for c in chunks] == [BATCHES_PER_CHUNK, BATCHES_PER_CHUNK, 500]
    assert metas(chunks) == stored(log)
    for c in chunks:
        assert (c.broker_id, c.log_start_offset, c.high_watermark, c.log_end_offset) == (
            7, 0, 2_500, 2_500,
        )  # fmt: skip
    assert [c.end_reached for c in chunks] == [False, False, True]
    assert chunks[-1].next_offset == 2_500


def test_max_batches_ends_a_call_and_next_offset_continues_it(new_log: Any) -> None:
    log = new_log("t-0")
    fill(log, 30, records=3)
    source = Logs(1, {"t-0": log})
    first = call_once(source, request(max_batches=7))
    assert len(metas(first)) == 7 and not first[-1].end_reached
    assert first[-1].next_offset == 21
    rest = call_once(source, request(start_offset=first[-1].next_offset))
    assert metas(first) + metas(rest) == stored(log) and rest[-1].end_reached


def test_a_start_inside_a_batch_sends_it_whole_and_the_bounds_hold(new_log: Any) -> None:
    log = new_log("t-0")
    fill(log, 10, records=4)  # batches 0-3, 4-7, ..., 36-39
    log.update_high_watermark(24)
    source = Logs(1, {"t-0": log})
    up_to_hw = call_once(source, request(start_offset=9, upper_bound=rpb.HIGH_WATERMARK))
    assert [b.base_offset for b in metas(up_to_hw)] == [8, 12, 16, 20]
    up_to_leo = call_once(source, request(start_offset=9))
    assert [b.base_offset for b in metas(up_to_leo)] == [8, 12, 16, 20, 24, 28, 32, 36]
    both = call_once(source, request(start_offset=9, end_offset=17))
    assert [b.base_offset for b in metas(both)] == [8, 12, 16]
    assert (both[-1].high_watermark, both[-1].log_end_offset, both[-1].end_reached) == (
        24, 40, True,
    )  # fmt: skip
    at_the_end = call_once(source, request(start_offset=40))
    assert len(at_the_end) == 1 and not at_the_end[0].batches and at_the_end[0].end_reached


def test_an_empty_log_answers_one_chunk_with_its_offsets(new_log: Any) -> None:
    (chunk,) = call_once(Logs(1, {"t-0": new_log("t-0")}), request())
    assert not chunk.batches and chunk.end_reached
    assert (chunk.log_start_offset, chunk.high_watermark, chunk.log_end_offset) == (0, 0, 0)


def test_the_start_defaults_to_the_log_start_and_below_it_is_out_of_range(new_log: Any) -> None:
    log = new_log("t-0")
    fill(log, 10, records=2)
    log.maybe_increment_log_start_offset(7)  # inside batch 6-7
    source = Logs(1, {"t-0": log})
    chunks = call_once(source, request())
    assert chunks[0].log_start_offset == 7
    assert [b.base_offset for b in metas(chunks)] == [6, 8, 10, 12, 14, 16, 18]
    error = refused(source, request(start_offset=6))
    assert error.code() is grpc.StatusCode.OUT_OF_RANGE
    assert "start_offset 6 is outside [7, 20]" in str(error.details())


@pytest.mark.parametrize(
    ("fields", "code", "message"),
    [
        ({"start_offset": 21}, grpc.StatusCode.OUT_OF_RANGE, "outside [0, 20]"),
        ({"start_offset": -1}, grpc.StatusCode.INVALID_ARGUMENT, "start_offset -1 is negative"),
        ({"start_offset": 5, "end_offset": 4}, grpc.StatusCode.INVALID_ARGUMENT, "below the"),
        ({"max_batches": MAX_BATCHES + 1}, grpc.StatusCode.INVALID_ARGUMENT, "max_batches"),
        ({"max_batches": -1}, grpc.StatusCode.INVALID_ARGUMENT, "max_batches"),
        ({"upper_bound": 7}, grpc.StatusCode.INVALID_ARGUMENT, "upper_bound 7"),
        ({"partition": -1}, grpc.StatusCode.INVALID_ARGUMENT, "partition -1 is negative"),
        ({"topic": ""}, grpc.StatusCode.INVALID_ARGUMENT, "name the partition"),
        ({"topic_id": b"short"}, grpc.StatusCode.INVALID_ARGUMENT, "has 5 bytes"),
        ({"partition": 1}, grpc.StatusCode.NOT_FOUND, "holds no replica of t"),
    ],
)
def test_bad_requests_get_a_status_and_a_message(
    new_log: Any, fields: dict[str, Any], code: grpc.StatusCode, message: str
) -> None:
    log = new_log("t-0")
    fill(log, 20)
    error = refused(Logs(1, {"t-0": log}), request(**fields))
    assert error.code() is code and message in str(error.details()), error


def test_a_broker_that_has_not_applied_an_image_is_not_serving_yet(tmp_path: Path) -> None:
    manager = ReplicaManager(7, LogManager([tmp_path / "data"], CONFIG))
    error = refused(ReplicaManagerSource(manager), request())
    assert error.code() is grpc.StatusCode.UNAVAILABLE
    assert error.details() == "broker 7 is not serving partitions yet"


def test_a_closed_log_is_unavailable(new_log: Any) -> None:
    log = new_log("t-0")
    fill(log, 3)
    log.close()
    error = refused(Logs(1, {"t-0": log}), request())
    assert error.code() is grpc.StatusCode.UNAVAILABLE and "was closed" in str(error.details())


async def read_on(call: Any) -> tuple[int, grpc.aio.AioRpcError | None]:
    """Read ``call`` to its end: the batches got and the error that ended it (None: OK)."""
    got = 0
    try:
        while (chunk := await call.read()) is not grpc.aio.EOF:
            got += len(chunk.batches)
    except grpc.aio.AioRpcError as e:
        return got, e
    return got, None


async def answered(address: str) -> grpc.StatusCode:
    """One small call's outcome; RESOURCE_EXHAUSTED while the server's slots are all taken."""
    try:
        await read(address, request(max_batches=1))
    except grpc.aio.AioRpcError as e:
        return e.code()
    return grpc.StatusCode.OK


async def until(condition: Callable[[], bool]) -> None:
    while not condition():  # callers bound the wait
        await asyncio.sleep(0.01)


async def until_answered(address: str) -> grpc.StatusCode:
    """Ask until not refused RESOURCE_EXHAUSTED (a slot is given back once the server has
    seen its call's status out); callers bound the wait."""
    while (code := await answered(address)) is grpc.StatusCode.RESOURCE_EXHAUSTED:
        await asyncio.sleep(0.01)
    return code


# A client's stream window kept small (no BDP growth, 1 KB ahead of the reader): the
# server's writes wait after a chunk or two, not after the whole call.
SMALL_WINDOW = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)]


async def started_server(
    service: ReplicaReadService, maximum_concurrent_rpcs: int
) -> tuple[grpc.aio.Server, str]:
    """A started gRPC server of ``service`` alone, and its address."""
    server = grpc.aio.server(maximum_concurrent_rpcs=maximum_concurrent_rpcs)
    service.register(server)
    address = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
    await server.start()
    return server, address


def test_a_client_that_stops_reading_is_ended_after_the_write_timeout(new_log: Any) -> None:
    """A chunk the client leaves untaken for write_timeout_ms ends the call: the handler and
    its cursor go, and the client reading on gets what was sent, then DEADLINE_EXCEEDED. The
    server's RPC slot is held until then (grpc.aio sends the status behind the untaken
    chunk, and cannot withdraw it): a server of one slot refuses others meanwhile."""
    log = new_log("t-0")
    fill(log, 5_000)  # 5 chunks of about 18 KB
    service = ReplicaReadService(Logs(1, {"t-0": log}), write_timeout_ms=200)

    async def main() -> tuple[int, grpc.aio.AioRpcError | None, grpc.StatusCode, grpc.StatusCode]:
        server, address = await started_server(service, maximum_concurrent_rpcs=1)
        try:
            async with grpc.aio.insecure_channel(address, options=SMALL_WINDOW) as channel:
                call = replica_pb2_grpc.ReplicaReadServiceStub(channel).ReadBatches(request())
                first = await call.read()  # the handler is running now; then read no more
                await asyncio.wait_for(until(lambda: service.calls_in_progress == 0), 10)
                while_stalled = await answered(address)
                got, error = await read_on(call)
            after = await asyncio.wait_for(until_answered(address), 10)
            return len(first.batches) + got, error, while_stalled, after
        finally:
            await server.stop(None)

    got, error, while_stalled, after = run(main)
    assert error is not None and error.code() is grpc.StatusCode.DEADLINE_EXCEEDED, error
    assert error.details() == "the client took no chunk for 200 ms: call ended"
    assert 0 < got < 5_000 and got % BATCHES_PER_CHUNK == 0
    assert while_stalled is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert after is grpc.StatusCode.OK


def test_calls_held_are_capped_so_stalled_readers_leave_the_server_s_other_slots(
    new_log: Any,
) -> None:
    """A stalled call holds its gRPC slot until the client goes (above); at most max_calls
    are held, so one more ReadBatches is refused by the service (RESOURCE_EXHAUSTED naming
    the setting) while the server still has slots for other calls, and the count goes down
    once gRPC has closed the stalled call."""
    log = new_log("t-0")
    fill(log, 5_000)
    service = ReplicaReadService(Logs(1, {"t-0": log}), write_timeout_ms=60_000, max_calls=1)

    async def main() -> tuple[grpc.aio.AioRpcError, grpc.StatusCode]:
        server, address = await started_server(service, maximum_concurrent_rpcs=3)
        try:
            async with grpc.aio.insecure_channel(address, options=SMALL_WINDOW) as channel:
                call = replica_pb2_grpc.ReplicaReadServiceStub(channel).ReadBatches(request())
                await call.read()  # held: read no more
                assert service.calls_held == 1
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await read(address, request(max_batches=1))
                assert service.calls_held == 1  # the refused call never counted
                call.cancel()
                await asyncio.wait_for(until(lambda: service.calls_held == 0), 10)
            return refused.value, await answered(address)
        finally:
            await server.stop(None)

    refused, after = run(main)
    assert refused.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert refused.details() == (
        "broker 1 holds 1 replica reads (broker.replica_read_max_calls); try again"
    )
    assert after is grpc.StatusCode.OK


def test_max_calls_is_at_least_one() -> None:
    with pytest.raises(ValueError, match="max_calls must be at least 1, got 0"):
        ReplicaReadService(Logs(1, {}), max_calls=0)


def test_the_write_timeout_is_at_least_a_millisecond() -> None:
    with pytest.raises(ValueError, match="write_timeout_ms must be at least 1, got 0"):
        ReplicaReadService(Logs(1, {}), write_timeout_ms=0)


# -- the header walk ---------------------------------------------------------------------------


def test_the_walk_reads_batch_headers_only(new_log: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    log = new_log("t-0")
    for offset in range(20):
        log.append_as_follower(make_batch([b"x" * 1_000] * 2, base_offset=2 * offset))
    reads: list[int] = []
    real_pread = os.pread

    def counting_pread(fd: int, length: int, offset: int) -> bytes:
        reads.append(length)
        return real_pread(fd, length, offset)

    monkeypatch.setattr(os, "pread", counting_pread)
    cursor = HeaderCursor(log.segments, 0, log.log_end_offset)
    headers = cursor.read(100)
    assert len(headers) == 20 and cursor.done and cursor.next_offset == 40
    assert max(reads) <= HEADER_SIZE and sum(reads) < log.size_bytes / 10, reads


def test_a_header_that_is_not_one_is_unreadable(new_log: Any) -> None:
    log = new_log("t-0")
    fill(log, 5)
    segment = log.segments[0]
    position = log.batches(2).__next__()[1]
    with open(segment.log_path, "r+b") as f:  # the magic byte of the batch at offset 2
        f.seek(position + 16)
        f.write(b"\x07")
    cursor = HeaderCursor(log.segments, 0, log.log_end_offset)
    assert [h.base_offset for h in cursor.read(2)] == [0, 1]
    with pytest.raises(UnreadableBatch, match=r"byte \d+: not a batch header \(magic 7"):
        cursor.read(10)


# -- runnel replicas verify: reading and comparing several replicas ----------------------------


def target(replicas: tuple[int, ...], leader: int = 1) -> PartitionTarget:
    return PartitionTarget("t", b"", 0, replicas, leader)


def verify(
    sources: list[Logs], extra: dict[int, str] | None = None, leader: int = 1
) -> replicas_verify.PartitionReport:
    async def main() -> replicas_verify.PartitionReport:
        async with serving(*sources) as addresses:
            by_id = {s.broker_id: a for s, a in zip(sources, addresses, strict=True)}
            by_id.update(extra or {})
            (report,) = await verify_partitions([target(tuple(by_id), leader)], by_id)
            return report

    return run(main)


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three batches per ReadBatches call, so comparison goes through many windows."""
    monkeypatch.setattr(replicas_verify, "PAGE_BATCHES", 3)


def test_equal_replicas_agree_below_the_smallest_high_watermark(
    new_log: Any, small_pages: None
) -> None:
    one, two, three = new_log("a/t-0"), new_log("b/t-0"), new_log("c/t-0")
    fill(one, 10, records=2)
    fill(two, 10, records=2)
    fill(three, 10, records=2)
    two.update_high_watermark(13)  # inside batch 12-13: only batches up to 10-11 count
    report = verify([Logs(1, {"t-0": one}), Logs(2, {"t-0": two}), Logs(3, {"t-0": three})])
    assert report.ok and report.reference == 1
    assert (report.start_offset, report.end_offset, report.batches_compared) == (0, 13, 6)


def test_a_different_crc_is_the_first_divergence_and_is_named(
    new_log: Any, small_pages: None
) -> None:
    one, two = new_log("a/t-0"), new_log("b/t-0")
    fill(one, 10)
    fill(two, 6)
    fill(two, 4, start=6, tag="w")  # same sizes, other bytes from offset 6
    report = verify([Logs(1, {"t-0": one}), Logs(2, {"t-0": two})])
    (divergence,) = report.divergences
    assert (divergence.reference, divergence.replica, divergence.offset) == (1, 2, 6)
    assert divergence.fields == ("crc",) and not report.ok


def test_other_batch_boundaries_diverge_and_other_epochs_too(
    new_log: Any, small_pages: None
) -> None:
    one, two, three = new_log("a/t-0"), new_log("b/t-0"), new_log("c/t-0")
    fill(one, 8, records=2)
    fill(two, 4, records=2)
    fill(two, 8, start=8)  # batches of one record from offset 8
    fill(three, 3, records=2)
    fill(three, 5, start=6, records=2, epoch=2)
    report = verify([Logs(1, {"t-0": one}), Logs(2, {"t-0": two}), Logs(3, {"t-0": three})])
    by_replica = {d.replica: d for d in report.divergences}
    assert by_replica[2].offset == 8
    assert by_replica[2].fields == ("last_offset", "crc", "size_bytes")
    assert by_replica[3].offset == 6
    assert by_replica[3].fields == ("leader_epoch",)  # not covered by the CRC


def test_history_below_another_replicas_log_start_is_not_compared(
    new_log: Any, small_pages: None
) -> None:
    one, two = new_log("a/t-0"), new_log("b/t-0")
    fill(one, 10)
    two.truncate_fully_and_start_at(4)
    fill(two, 6, start=4)
    report = verify([Logs(1, {"t-0": one}), Logs(2, {"t-0": two})])
    assert report.ok and (report.start_offset, report.end_offset) == (4, 10)
    assert report.batches_compared == 6


def test_a_replica_that_cannot_be_read_is_reported_and_the_rest_compared(
    new_log: Any, small_pages: None
) -> None:
    one, two = new_log("a/t-0"), new_log("b/t-0")
    fill(one, 5)
    fill(two, 5)
    (nobody,) = free_ports(1)
    report = verify(
        [Logs(1, {"t-0": one}), Logs(2, {"t-0": two}), Logs(3, {})],
        extra={4: f"127.0.0.1:{nobody}"},
    )
    assert not report.ok and report.batches_compared == 5 and not report.divergences
    assert report.not_checked[3].startswith("NOT_FOUND: broker 3 holds no replica")
    assert report.not_checked[4].startswith("UNAVAILABLE")


def test_a_broker_that_does_not_answer_is_not_asked_again(new_log: Any) -> None:
    log = new_log("a/t-0")
    fill(log, 2)
    (nobody,) = free_ports(1)

    async def main() -> list[replicas_verify.PartitionReport]:
        async with serving(Logs(1, {"t-0": log, "t-1": log})) as (address,):
            targets = [PartitionTarget("t", b"", p, (1, 2), 1) for p in (0, 1)]
            return await verify_partitions(targets, {1: address, 2: f"127.0.0.1:{nobody}"})

    first, second = run(main)
    assert first.not_checked[2].startswith("UNAVAILABLE: ")
    earlier = f"not asked: it failed for an earlier partition: {first.not_checked[2]}"
    assert second.not_checked == {2: earlier} and second.batches_compared == 2


def test_without_the_leader_the_lowest_replica_that_answers_is_the_reference(
    new_log: Any, small_pages: None
) -> None:
    two, three = new_log("b/t-0"), new_log("c/t-0")
    fill(two, 4)
    fill(three, 4)
    (nobody,) = free_ports(1)
    report = verify(
        [Logs(2, {"t-0": two}), Logs(3, {"t-0": three})],
        extra={1: f"127.0.0.1:{nobody}"},
    )
    assert report.reference == 2 and report.batches_compared == 4 and 1 in report.not_checked


# -- the command's output and exit code; where brokers are read --------------------------------


def broker(broker_id: int, *listeners: tuple[str, str]) -> cpb.BrokerDescription:
    """A DescribeCluster broker with listeners given as (name, host:port)."""
    described = []
    for name, address in listeners:
        host, _, port = address.rpartition(":")
        described.append(mpb.Listener(name=name, host=host.strip("[]"), port=int(port)))
    return cpb.BrokerDescription(broker_id=broker_id, listeners=described)


def test_a_combined_node_is_read_on_its_controller_listener() -> None:
    brokers = [
        broker(101, ("CLIENT", "h:1"), ("REPLICATION", "h:2")),
        broker(1, ("CLIENT", "c:1"), ("CONTROLLER", "c:2"), ("REPLICATION", "c:3")),
        broker(102, ("CLIENT", "h:5")),
        broker(103, ("REPLICATION", "[::1]:6")),
    ]
    assert replica_read_addresses(brokers) == {101: "h:2", 1: "c:2", 103: "[::1]:6"}


def test_the_command_prints_every_problem_and_exits_1(
    new_log: Any, small_pages: None, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    one, two, alone = new_log("a/t-0"), new_log("b/t-0"), new_log("a/t-1")
    fill(one, 5)
    fill(two, 3)
    fill(two, 2, start=3, tag="w")
    fill(alone, 2)
    (nobody,) = free_ports(1)
    sources = [Logs(1, {"t-0": one, "t-1": alone}), Logs(2, {"t-0": two})]
    targets = [PartitionTarget("t", b"", 0, (1, 2), 1), PartitionTarget("t", b"", 1, (1, 3), 1)]

    async def main() -> int:
        async with serving(*sources) as (first, second):
            brokers = [
                broker(1, ("REPLICATION", first)),
                broker(2, ("REPLICATION", second)),
                broker(3, ("REPLICATION", f"127.0.0.1:{nobody}")),
            ]
            monkeypatch.setattr(replicas_command, "_describe", lambda _: (targets, brokers))
            return await asyncio.to_thread(cli.main, ["replicas", "verify"])

    assert run(main) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "t-0: DIVERGED: replicas 1 (leader), 2; offsets [0, 5), 5 batches compared"
    assert lines[1].startswith("  replica 2 differs from 1 at offset 3: batch at 3: crc 0x")
    # only replica 1 of t-1 answers: nothing to compare it with, so no batch counts
    assert (
        lines[2]
        == "t-1: NOT CHECKED: replicas 1 (leader), 3; only replica 1 read: nothing to compare"
    )
    assert lines[3].startswith("  replica 3 not checked: UNAVAILABLE: ")
    assert lines[4:] == [
        "2 partitions checked, 5 batches compared: 1 diverged, 1 with replicas not checked"
    ]


def test_a_single_replica_is_not_called_agreement(
    new_log: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """Replication factor 1: nothing to compare, said as much (exit 0: nothing is wrong)."""
    one, two, alone = new_log("a/t-0"), new_log("b/t-0"), new_log("a/t-1")
    fill(one, 3)
    fill(two, 3)
    fill(alone, 2)
    sources = [Logs(1, {"t-0": one, "t-1": alone}), Logs(2, {"t-0": two})]
    targets = [PartitionTarget("t", b"", 0, (1, 2), 1), PartitionTarget("t", b"", 1, (1,), 1)]

    async def main(*args: str) -> int:
        async with serving(*sources) as (first, second):
            brokers = [broker(1, ("REPLICATION", first)), broker(2, ("REPLICATION", second))]
            monkeypatch.setattr(replicas_command, "_describe", lambda _: (targets, brokers))
            return await asyncio.to_thread(cli.main, ["replicas", "verify", *args])

    assert run(main) == 0
    assert capsys.readouterr().out.splitlines() == [
        "t-0: ok: replicas 1 (leader), 2; offsets [0, 3), 3 batches compared",
        "t-1: ok: replicas 1 (leader); only one replica: nothing to compare",
        "2 partitions checked, 3 batches compared: all replicas agree; "
        "1 with only one replica, nothing to compare",
    ]
    assert run(lambda: main("--json")) == 0
    report = json.loads(capsys.readouterr().out)
    pair, single = report["partitions"]
    assert (pair["replicas_read"], pair["batches_compared"]) == (2, 3)
    assert (single["ok"], single["replicas_read"], single["batches_compared"]) == (True, 1, 0)
    assert single["end_offset"] == 2 and report["batches_compared"] == 3


def keyed_history(*logs: Log, count: int = 60, keys: int = 4) -> None:
    """The same keyed batches (one record each, ``keys`` keys in turn) appended to every log
    as a follower would, then rolled and committed: the whole history is cleanable."""
    for i in range(count):
        data = build_batch(
            [RecordInput(b"k%d" % (i % keys), b"v%03d-" % i + b"x" * 40, 1_700_000_000_000)],
            base_offset=i,
            partition_leader_epoch=1,
        )
        for log in logs:
            log.append_as_follower(data)
    for log in logs:
        log.roll()
        log.update_high_watermark(log.log_end_offset)


def test_replicas_compacted_on_their_own_differ_only_as_compaction_may(
    tmp_path: Path, small_pages: None, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """One replica compacted, the other not yet: below the compacted one's compacted_below
    their batches differ in CRC and size and some are gone, and nothing is wrong; above it
    they must agree byte for byte, and a difference there is still a divergence."""
    config = LogConfig(cleanup_policy="compact", segment_bytes=1024, retention_ms=None)
    one = load_log(tmp_path / "a" / "t-0", config, clock=FakeClock())
    two = load_log(tmp_path / "b" / "t-0", config, clock=FakeClock())
    try:
        keyed_history(one, two)
        compact(one, 1_700_000_000_000)
        assert stored(one) != stored(two) and one.compacted_below == 60
        (chunk,) = call_once(Logs(1, {"t-0": one}), request())
        assert chunk.compacted_below == 60
        (chunk,) = call_once(Logs(2, {"t-0": two}), request())
        assert chunk.compacted_below == 0
        for log in (one, two):
            for i in range(60, 66):  # the same batches above it: they must agree
                log.append_as_follower(batch(i))
            log.update_high_watermark(log.log_end_offset)
        sources = [Logs(1, {"t-0": one}), Logs(2, {"t-0": two})]

        report = verify(sources)

        assert report.ok, report.divergences
        assert (report.start_offset, report.end_offset, report.compacted_below) == (0, 66, 60)
        compacted = len(stored(one)) - 6  # the leader's batches below 60 after compaction
        assert 0 < compacted < 60 and report.batches_compared == compacted + 6

        targets = [PartitionTarget("t", b"", 0, (1, 2), 1)]

        async def command(*args: str) -> int:
            async with serving(*sources) as (first, second):
                brokers = [broker(1, ("REPLICATION", first)), broker(2, ("REPLICATION", second))]
                monkeypatch.setattr(replicas_command, "_describe", lambda _: (targets, brokers))
                return await asyncio.to_thread(cli.main, ["replicas", "verify", *args])

        assert run(command) == 0
        assert capsys.readouterr().out.splitlines()[0] == (
            f"t-0: ok: replicas 1 (leader), 2; offsets [0, 66), {compacted + 6} batches "
            "compared; below 60 (compacted by each replica on its own) by offsets and leader "
            "epoch only"
        )
        assert run(lambda: command("--json")) == 0
        (partition,) = json.loads(capsys.readouterr().out)["partitions"]
        assert (partition["start_offset"], partition["compacted_below"]) == (0, 60)

        one.append_as_follower(batch(66))  # a real difference above it
        two.append_as_follower(batch(66, tag="w"))
        for log in (one, two):
            log.update_high_watermark(log.log_end_offset)
        (divergence,) = verify(sources).divergences
        assert (divergence.replica, divergence.offset, divergence.fields) == (2, 66, ("crc",))
    finally:
        one.close()
        two.close()


# -- on a node ---------------------------------------------------------------------------------


def test_a_combined_node_serves_its_replicas_on_the_controller_listener(tmp_path: Path) -> None:
    path, controller_port, _ = write_config(tmp_path)
    address = f"127.0.0.1:{controller_port}"

    async def main() -> None:
        node = RunnelNode(load_config(path, {}))
        client = ControllerClient({1: address})
        await node.start()
        try:
            topic = cpb.CreatableTopic(name="t", num_partitions=1, replication_factor=1)
            await client.call("CreateTopics", cpb.CreateTopicsRequest(topics=[topic]))
            assert node.kafka is not None
            replicas = node.kafka.replicas
            while replicas.get("t", 0) is None:  # bounded by run()'s timeout
                await asyncio.sleep(0.02)
            partition = replicas.get("t", 0)
            assert partition is not None
            for _ in range(3):
                partition.append_as_leader(make_batch([b"a", b"b"]), required_acks=-1)
            chunks = await read(address, request())
            assert metas(chunks) == stored(partition.log) and len(metas(chunks)) == 3
            assert (chunks[-1].broker_id, chunks[-1].high_watermark) == (1, 6)
        finally:
            await node.stop()
            await client.close()

    run(main)


def test_before_its_logs_are_open_a_node_is_not_serving_yet(tmp_path: Path) -> None:
    path, controller_port, _ = write_config(tmp_path)
    env = {"RUNNEL_BROKER__REPLICA_READ_WRITE_TIMEOUT_MS": "1234"}

    async def main() -> tuple[grpc.aio.AioRpcError, int | None]:
        node = RunnelNode(load_config(path, env))
        await node.transport.start()  # the listener only: no metadata, no logs
        try:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await read(f"127.0.0.1:{controller_port}", request())
            service = node.replica_read
            return caught.value, service.write_timeout_ms if service is not None else None
        finally:
            await node.transport.close()
            assert node.client is not None
            await node.client.close()

    error, write_timeout_ms = run(main)
    assert error.code() is grpc.StatusCode.UNAVAILABLE
    assert error.details() == "broker 1 is not serving partitions yet"
    assert write_timeout_ms == 1234  # broker.replica_read_write_timeout_ms


class _BusyThenServing:
    """A ReadBatches call refused RESOURCE_EXHAUSTED (a broker at its RPC bound) ``refusals``
    times, then answering one chunk."""

    def __init__(self, refusals: int) -> None:
        self.refusals, self.calls = refusals, 0

    def __call__(self, request: rpb.ReadBatchesRequest, timeout: float) -> Any:
        self.calls += 1
        return self._stream()

    async def _stream(self) -> Any:
        if self.refusals:
            self.refusals -= 1
            metadata = grpc.aio.Metadata()
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.RESOURCE_EXHAUSTED, metadata, metadata, details="busy"
            )
        yield rpb.ReadBatchesChunk(broker_id=1, high_watermark=0, end_reached=True)


def test_a_replica_refused_as_busy_is_asked_again_then_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(replicas_verify, "BUSY_RETRY_S", (0.0, 0.0))
    request = rpb.ReadBatchesRequest()
    read = replicas_verify._read_page

    async def main() -> tuple[Any, _BusyThenServing, str]:
        answered = _BusyThenServing(refusals=2)
        page = await read(answered, 1, request)  # type: ignore[arg-type]
        refused = _BusyThenServing(refusals=3)
        with pytest.raises(Exception, match="RESOURCE_EXHAUSTED") as caught:
            await read(refused, 1, request)  # type: ignore[arg-type]
        return (page, answered.calls), refused, str(caught.value)

    (page, calls), refused, message = run(main)
    assert page.end_reached and calls == 3
    assert refused.calls == 3 and "busy" in message
