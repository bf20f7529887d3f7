"""A trivial Kafka-protocol broker for bench.produce_consume: what the load generator can do
when the broker costs next to nothing.

How this works. One process, a thread per connection with blocking sockets, runnel's codec
for the framing. It serves one topic (any name asked for is answered as that topic) with
``partitions`` partitions led by itself (node 1), and answers ApiVersions, Metadata, Produce,
Fetch, ListOffsets and OffsetForLeaderEpoch; any other API closes the connection. Two modes:

  discard  Produce is answered with success without storing (records are counted from the
           batch headers to hand out offsets). Fetch is served from one pre-built batch of
           the generator's shape repeated to fill ``partition_max_bytes``, its base offsets
           patched to follow the fetch offset; the log never ends.
  memory   Produce keeps the batches in memory (at most ``MEMORY_MAX_BYTES``), Fetch serves
           them, and a fetch with nothing to read waits (``max_wait_ms``) until a produce
           arrives: the latency floor of the generator and Python sockets.

Prints ``ready PORT`` once listening; runs until SIGTERM or SIGINT.

Usage: ``python -m bench.produce_consume_sink [--mode discard|memory] [--topic T]
[--partitions N] [--batch-bytes B]``.
"""

from __future__ import annotations

import argparse
import bisect
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from bench.kafka_load import Connection, LoadError, build_fill_batch, count_batches
from broker.protocol import (
    API_SPECS,
    ApiKey,
    ErrorCode,
    ProtocolError,
    RequestHeader,
    decode_request,
    decode_request_header,
    encode_response,
)
from storage.batch import HEADER_SIZE, LOG_OVERHEAD

__all__ = ["main"]

NODE_ID = 1
CLUSTER_ID = "bench-sink"
LEADER_EPOCH = 0
MEMORY_MAX_BYTES = 1 << 30
MAX_WAIT_MS = 1_000  # the longest a memory-mode fetch waits, whatever it asks
LISTEN_BACKLOG = 16
EARLIEST, LATEST = -2, -1
NEVER_ENDS = 1 << 62  # the high watermark of the discard log
SERVED = (
    ApiKey.API_VERSIONS,
    ApiKey.METADATA,
    ApiKey.PRODUCE,
    ApiKey.FETCH,
    ApiKey.LIST_OFFSETS,
    ApiKey.OFFSET_FOR_LEADER_EPOCH,
)
# The highest version the sink serves where runnel serves more: its Metadata gives no topic
# ids, so Fetch stays at v12 (names; v13+ names topics by id).
MAX_VERSIONS = {ApiKey.FETCH: 12}
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")


@dataclass(slots=True)
class MemoryLog:
    """One partition's batches in memory, offsets assigned on append. Thread-safe."""

    bases: list[int] = field(default_factory=list)
    batches: list[bytes] = field(default_factory=list)
    end_offset: int = 0
    size_bytes: int = 0
    changed: threading.Condition = field(default_factory=threading.Condition)

    def append(self, records: memoryview) -> int:
        data = bytearray(records[: count_batches(records)[2]])
        with self.changed:
            base = self.end_offset
            if self.size_bytes + len(data) > MEMORY_MAX_BYTES:
                raise LoadError(f"the memory sink holds at most {MEMORY_MAX_BYTES} bytes")
            self.end_offset = patch_offsets(data, base)
            self.bases.append(base)
            self.batches.append(bytes(data))
            self.size_bytes += len(data)
            self.changed.notify_all()
        return base

    def read(self, offset: int, max_bytes: int, max_wait_ms: int) -> bytes:
        with self.changed:
            if offset >= self.end_offset and max_wait_ms > 0:
                self.changed.wait(min(max_wait_ms, MAX_WAIT_MS) / 1000)
            start = bisect.bisect_right(self.bases, offset) - 1
            out = bytearray()
            for batch in self.batches[max(start, 0) :]:
                if out and len(out) + len(batch) > max_bytes:
                    break
                out += batch
            return bytes(out)


def patch_offsets(batches: bytearray, first_offset: int) -> int:
    """Give the batches in ``batches`` consecutive offsets from ``first_offset`` (the base
    offset is outside the CRC, so they stay valid); the offset after the last."""
    pos, offset = 0, first_offset
    while pos + HEADER_SIZE <= len(batches):
        (length,) = _INT32.unpack_from(batches, pos + 8)
        (last_delta,) = _INT32.unpack_from(batches, pos + 23)
        _INT64.pack_into(batches, pos, offset)
        offset += last_delta + 1
        pos += LOG_OVERHEAD + length
    return offset


class Sink:
    """The served topic and its partitions; handlers for one request each."""

    def __init__(self, args: argparse.Namespace, port: int) -> None:
        self.topic: str = args.topic
        self.partitions: int = args.partitions
        self.memory = args.mode == "memory"
        self.port = port
        self.logs = [MemoryLog() for _ in range(self.partitions)]
        self.produced = [0] * self.partitions  # discard mode: records counted
        self.lock = threading.Lock()
        batch, self.batch_records = build_fill_batch(args.batch_bytes, int(time.time() * 1000))
        self.batch = batch
        self.handlers: dict[int, Callable[[RequestHeader, Any], Any]] = {
            ApiKey.API_VERSIONS: self.api_versions,
            ApiKey.METADATA: self.metadata,
            ApiKey.PRODUCE: self.produce,
            ApiKey.FETCH: self.fetch,
            ApiKey.LIST_OFFSETS: self.list_offsets,
            ApiKey.OFFSET_FOR_LEADER_EPOCH: self.offset_for_leader_epoch,
        }

    def high_watermark(self, partition: int) -> int:
        return self.logs[partition].end_offset if self.memory else NEVER_ENDS

    def api_versions(self, header: RequestHeader, request: Any) -> Any:
        keys = [
            {"api_key": k, "min_version": API_SPECS[k].min_version,
             "max_version": MAX_VERSIONS.get(k, API_SPECS[k].max_version)}
            for k in SERVED
        ]  # fmt: skip
        return {"error_code": ErrorCode.NONE, "api_keys": keys, "throttle_time_ms": 0}

    def metadata(self, header: RequestHeader, request: Any) -> Any:
        partitions = [
            {
                "error_code": 0,
                "partition_index": p,
                "leader_id": NODE_ID,
                "leader_epoch": LEADER_EPOCH,
                "replica_nodes": [NODE_ID],
                "isr_nodes": [NODE_ID],
                "offline_replicas": [],
            }
            for p in range(self.partitions)
        ]
        names = [t.name for t in request.topics] if request.topics is not None else [self.topic]
        topics = [{"error_code": 0, "name": n, "partitions": partitions} for n in names]
        return {
            "throttle_time_ms": 0,
            "brokers": [{"node_id": NODE_ID, "host": "127.0.0.1", "port": self.port}],
            "cluster_id": CLUSTER_ID,
            "controller_id": NODE_ID,
            "topics": topics,
        }

    def produce(self, header: RequestHeader, request: Any) -> Any:
        responses = []
        for topic in request.topic_data:
            answers = []
            for data in topic.partition_data:
                base = self.append(data.index, data.records)
                answers.append({"index": data.index, "error_code": 0, "base_offset": base})
            responses.append({"name": topic.name, "partition_responses": answers})
        if request.acks == 0:
            return None
        return {"responses": responses, "throttle_time_ms": 0}

    def append(self, partition: int, records: memoryview) -> int:
        if self.memory:
            return self.logs[partition].append(records)
        count = count_batches(records)[0]
        with self.lock:
            base = self.produced[partition]
            self.produced[partition] += count
        return base

    def fetch(self, header: RequestHeader, request: Any) -> Any:
        responses = []
        for topic in request.topics:
            answers = []
            for p in topic.partitions:
                records = self.read(p.partition, p.fetch_offset, p.partition_max_bytes, request)
                answers.append(
                    {
                        "partition_index": p.partition,
                        "error_code": 0,
                        "high_watermark": self.high_watermark(p.partition),
                        "last_stable_offset": self.high_watermark(p.partition),
                        "log_start_offset": 0,
                        "aborted_transactions": None,
                        "records": records,
                    }
                )
            responses.append({"topic": topic.topic, "partitions": answers})
        return {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": responses}

    def read(self, partition: int, offset: int, max_bytes: int, request: Any) -> bytes | bytearray:
        if self.memory:
            return self.logs[partition].read(offset, max_bytes, request.max_wait_ms)
        copies = max(1, max_bytes // len(self.batch))
        out = bytearray(self.batch) * copies
        for i in range(copies):
            _INT64.pack_into(out, i * len(self.batch), offset + i * self.batch_records)
        return out

    def list_offsets(self, header: RequestHeader, request: Any) -> Any:
        topics = []
        for topic in request.topics:
            answers = []
            for p in topic.partitions:
                offset = 0 if p.timestamp == EARLIEST else self.high_watermark(p.partition_index)
                answers.append(
                    {"partition_index": p.partition_index, "error_code": 0, "timestamp": -1,
                     "offset": offset, "leader_epoch": LEADER_EPOCH}
                )  # fmt: skip
            topics.append({"name": topic.name, "partitions": answers})
        return {"throttle_time_ms": 0, "topics": topics}

    def offset_for_leader_epoch(self, header: RequestHeader, request: Any) -> Any:
        topics = []
        for topic in request.topics:
            answers = [
                {"error_code": 0, "partition": p.partition, "leader_epoch": LEADER_EPOCH,
                 "end_offset": self.high_watermark(p.partition)}
                for p in topic.partitions
            ]  # fmt: skip
            topics.append({"topic": topic.topic, "partitions": answers})
        return {"throttle_time_ms": 0, "topics": topics}

    def respond(self, frame: bytes) -> list[Any] | None:
        """The response parts for one request frame (None: send nothing)."""
        header = decode_request_header(frame)
        handler = self.handlers.get(header.api_key)
        if handler is None:
            raise ProtocolError(f"the sink does not serve api {header.api_key}")
        spec = API_SPECS[header.api_key]
        if not spec.supports(header.api_version):
            if header.api_key != ApiKey.API_VERSIONS:
                raise ProtocolError(f"api {header.api_key} v{header.api_version} unsupported")
            v0 = header._replace(api_version=0)  # Kafka answers an unknown version in v0
            body = self.api_versions(v0, None)
            return encode_response(v0, {**body, "error_code": ErrorCode.UNSUPPORTED_VERSION})
        value = handler(header, decode_request(header, frame))
        return None if value is None else encode_response(header, value)


def serve_connection(sink: Sink, sock: socket.socket) -> None:
    conn = Connection(sock)
    try:
        while True:
            frame = conn.read_frame()
            parts = sink.respond(frame)
            if parts is not None:
                conn.send(parts)
    except (LoadError, ConnectionError):
        pass  # the client hung up, perhaps mid-response: its run is over
    except (OSError, ProtocolError) as e:
        print(f"sink: connection closed: {e!r}", file=sys.stderr, flush=True)
    finally:
        conn.close()


def serve(args: argparse.Namespace) -> None:
    listener = socket.create_server(("127.0.0.1", args.port), backlog=LISTEN_BACKLOG)
    sink = Sink(args, listener.getsockname()[1])
    print(f"ready {sink.port}", flush=True)
    while True:
        sock, _ = listener.accept()
        threading.Thread(target=serve_connection, args=(sink, sock), daemon=True).start()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.produce_consume_sink", description=__doc__
    )
    parser.add_argument("--mode", choices=("discard", "memory"), default="discard")
    parser.add_argument("--topic", default="bench")
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--batch-bytes", type=int, default=16_384)
    parser.add_argument("--port", type=int, default=0)
    return parser.parse_args(argv)


def _exit(signum: int, frame: FrameType | None) -> None:
    sys.exit(0)


def main(argv: Sequence[str] | None = None) -> None:
    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)
    serve(parse_args(argv))


if __name__ == "__main__":
    main()
