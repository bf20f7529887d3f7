"""``ReplicaReadService`` in-process, over real gRPC, on real logs in ``tmp_path``; and the
service on a combined controller + broker ``RunnelNode``, where it shares the controller
listener.

Each log is filled with batches built here and appended as a follower would (offsets and
epochs verbatim), so two logs given the same batches hold the same bytes. What the service
streams is checked against ``Log.batches``, which reads the segments by another path.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio
import pytest
from support import FakeClock, make_batch
from test_node import write_config

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
from proto import replica_pb2 as rpb
from proto import replica_pb2_grpc
from runnel.config import load_config
from runnel.node import RunnelNode
from runnel.replica_compare import BatchMeta
from storage.batch import HEADER_SIZE
from storage.config import LogConfig
from storage.loader import load_log
from storage.log import Log
from storage.log_manager import LogManager

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

    async def main() -> grpc.aio.AioRpcError:
        node = RunnelNode(load_config(path, {}))
        await node.transport.start()  # the listener only: no metadata, no logs
        try:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await read(f"127.0.0.1:{controller_port}", request())
            return caught.value
        finally:
            await node.transport.close()
            assert node.client is not None
            await node.client.close()

    error = run(main)
    assert error.code() is grpc.StatusCode.UNAVAILABLE
    assert error.details() == "broker 1 is not serving partitions yet"
