"""The load generator of bench.produce_consume: a raw Kafka-protocol client that does no
per-record Python work, run as its own process, like Kafka's own perf tools.

How this works. Requests are framed with runnel's codec (``broker.protocol``); record batches
are built once with ``storage.records.build_batch``. Each role connects, prints ``ready``,
runs, and prints one JSON line with what it measured (and its own CPU seconds):

  produce      one pre-built Produce v9 request (``--acks``, default 1; one batch of 100-byte
               records per partition) sent over and over with ``in_flight`` requests
               outstanding on one connection (Kafka's max.in.flight.requests.per.connection
               is 5); only the 4-byte size, the correlation id and the response are touched
               per request.
               Stops after ``records`` are acknowledged or ``max_s`` passes.
  consume      Fetch v12 from offset 0, one request in flight (as a Kafka consumer keeps one
               per broker), records counted from the batch headers (record_count at byte 57,
               next offset from base_offset + last_offset_delta + 1); no CRC check, as
               librdkafka's default check.crcs=false.
  e2e-produce  paced open loop: record i is due at start + i / rate; every ``linger_ms`` the
               due records go out as one batch whose values begin with their due time
               (CLOCK_MONOTONIC ns, shared by the processes of one machine), so a late send
               counts in the latency.
  e2e-consume  long-polling Fetch (min_bytes 1, ``max_wait_ms``) from ``start_offset``;
               latency of a record is the time its response was read minus the due time in
               its value. Reported as percentiles and as a histogram of 10 µs buckets, which
               the benchmark merges over rounds.

Usage: ``python -m bench.kafka_load ROLE --bootstrap HOST:PORT --topic T [...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import socket
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from broker.protocol import ApiKey, Part, decode_response, encode_request
from storage.batch import HEADER_SIZE, LOG_OVERHEAD
from storage.records import RecordInput, build_batch, decode_batch

__all__ = [
    "Connection",
    "ProduceTemplate",
    "build_fill_batch",
    "count_batches",
    "fetch_request",
    "main",
    "produce_template",
]

VALUE_BYTES = 100
PRODUCE_VERSION = 9
FETCH_VERSION = 12
METADATA_VERSION = 12
CLIENT_ID = "runnel-bench"
ACKS = 1
PRODUCE_TIMEOUT_MS = 30_000
SOCKET_TIMEOUT_S = 30.0  # any single wait for the peer; a run's own bound is max_s
READ_BUFFER_BYTES = 1 << 20
SOCKET_BUFFER_BYTES = 4 << 20
FETCH_MAX_BYTES = 52_428_800  # librdkafka's and Java's fetch.max.bytes default
RECV_BYTES = 1 << 16
IDLE_WAIT_S = 0.05  # e2e producer: nothing to send, wait this long for acks at most
HISTOGRAM_BUCKET_NS = 10_000  # e2e latencies leave the consumer as 10 µs buckets
TIMESTAMP = struct.Struct(">q")
_SIZE = struct.Struct(">i")
_HEAD = struct.Struct(">ihhi")  # size, api_key, api_version, correlation_id
_BATCH_OFFSET_LENGTH = struct.Struct(">qi")
_INT32 = struct.Struct(">i")
_POS_LAST_OFFSET_DELTA = 23
_POS_RECORD_COUNT = 57


class LoadError(Exception):
    """The peer answered with an error or broke the protocol: the run is void."""


# --- the connection ---------------------------------------------------------------------


class Connection:
    """One blocking TCP connection with Kafka framing. Every wait is bounded by
    ``SOCKET_TIMEOUT_S``. Not thread-safe."""

    def __init__(self, sock: socket.socket) -> None:
        sock.settimeout(SOCKET_TIMEOUT_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
        self.sock = sock
        self.rfile = sock.makefile("rb", buffering=READ_BUFFER_BYTES)
        self.correlation_id = 0

    @classmethod
    def connect(cls, address: str) -> Connection:
        host, port = address.rsplit(":", 1)
        return cls(socket.create_connection((host, int(port)), timeout=SOCKET_TIMEOUT_S))

    def close(self) -> None:
        self.rfile.close()
        self.sock.close()

    def send(self, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """All of ``parts`` with as few ``sendmsg`` calls as the socket allows."""
        views = [memoryview(p).cast("B") for p in parts]
        while views:
            sent = self.sock.sendmsg(views)
            while views and sent >= views[0].nbytes:
                sent -= views[0].nbytes
                views.pop(0)
            if views and sent:
                views[0] = views[0][sent:]

    def read_frame(self) -> bytes:
        """The next response frame, without its size prefix."""
        (size,) = _SIZE.unpack(self._read_exactly(4))
        return self._read_exactly(size)

    def _read_exactly(self, n: int) -> bytes:
        data: bytes = self.rfile.read(n)
        if len(data) != n:
            raise LoadError(f"connection closed by the peer ({len(data)} of {n} bytes read)")
        return data

    def send_request(self, api_key: int, version: int, value: Any) -> int:
        correlation_id = self.correlation_id
        self.correlation_id += 1
        self.send(byte_parts(encode_request(api_key, version, correlation_id, CLIENT_ID, value)))
        return correlation_id

    def call(self, api_key: int, version: int, value: Any) -> Any:
        """One request and its response (decoded); nothing else may be in flight."""
        correlation_id = self.send_request(api_key, version, value)
        got, response = decode_response(api_key, version, self.read_frame())
        if got != correlation_id:
            raise LoadError(f"correlation id {got}, expected {correlation_id}")
        return response


def byte_parts(parts: Sequence[Part]) -> list[bytes | bytearray | memoryview]:
    """An encoded request's parts, which a client builds from bytes only (a file region
    appears only in a broker's Fetch response)."""
    out: list[bytes | bytearray | memoryview] = []
    for part in parts:
        if not isinstance(part, bytes | bytearray | memoryview):
            raise TypeError(f"a request part must be bytes, not {type(part).__name__}")
        out.append(part)
    return out


def partition_leaders(conn: Connection, topic: str) -> dict[int, int]:
    """Partition -> leader id from a Metadata request; LoadError if the topic has an error
    or a partition has no leader."""
    response = conn.call(
        ApiKey.METADATA,
        METADATA_VERSION,
        {"topics": [{"name": topic}], "allow_auto_topic_creation": False},
    )
    (found,) = response.topics
    if found.error_code != 0:
        raise LoadError(f"Metadata for {topic}: error code {found.error_code}")
    leaders = {p.partition_index: p.leader_id for p in found.partitions}
    if not leaders or any(leader < 0 for leader in leaders.values()):
        raise LoadError(f"Metadata for {topic}: partitions without a leader: {leaders}")
    return leaders


# --- batches and requests -----------------------------------------------------------------


def record_values(count: int) -> list[bytes]:
    """``count`` distinct random 100-byte values (Kafka's perf tool sends random payloads)."""
    blob = os.urandom(VALUE_BYTES * count)
    return [blob[i * VALUE_BYTES : (i + 1) * VALUE_BYTES] for i in range(count)]


def build_fill_batch(batch_bytes: int, now_ms: int) -> tuple[bytes, int]:
    """The largest uncompressed v2 batch of 100-byte, key-less records that fits in
    ``batch_bytes`` (a Kafka producer closes a batch when the next record would not fit),
    and its record count."""
    probe = RecordInput(None, bytes(VALUE_BYTES), now_ms)
    one = len(build_batch([probe]))
    per_record = len(build_batch([probe, probe])) - one
    count = max(1, (batch_bytes - one) // per_record + 1)
    while True:
        values = record_values(count)
        batch = build_batch([RecordInput(None, v, now_ms) for v in values])
        if len(batch) <= batch_bytes or count == 1:
            return batch, count
        count -= 1


@dataclass(frozen=True, slots=True)
class ProduceTemplate:
    """A Produce request to send over and over: ``head(cid)`` then ``body``."""

    body: bytes  # after the correlation id: client id, (tags,) the request body
    records: int  # per request
    batch_bytes: int  # each partition's batch

    @property
    def wire_bytes(self) -> int:
        return _HEAD.size + len(self.body)

    def head(self, correlation_id: int) -> bytes:
        size = self.wire_bytes - _SIZE.size
        return _HEAD.pack(size, ApiKey.PRODUCE, PRODUCE_VERSION, correlation_id)


def produce_value(
    topic: str, partitions: int | Sequence[int], batch: bytes, acks: int = ACKS
) -> dict[str, Any]:
    ids = range(partitions) if isinstance(partitions, int) else partitions
    data = [{"index": p, "records": batch} for p in ids]
    return {
        "transactional_id": None,
        "acks": acks,
        "timeout_ms": PRODUCE_TIMEOUT_MS,
        "topic_data": [{"name": topic, "partition_data": data}],
    }


def produce_template(
    topic: str, partitions: int | Sequence[int], batch_bytes: int, acks: int = ACKS
) -> ProduceTemplate:
    batch, records = build_fill_batch(batch_bytes, int(time.time() * 1000))
    value = produce_value(topic, partitions, batch, acks)
    parts = encode_request(ApiKey.PRODUCE, PRODUCE_VERSION, 0, CLIENT_ID, value)
    frame = b"".join(byte_parts(parts))
    count = partitions if isinstance(partitions, int) else len(partitions)
    return ProduceTemplate(frame[_HEAD.size :], records * count, len(batch))


def fetch_request(
    topic: str, offsets: Sequence[int], partition_max_bytes: int, max_wait_ms: int
) -> dict[str, Any]:
    """A consumer's Fetch (no session) of every partition from ``offsets[p]``."""
    partitions = [
        {"partition": p, "fetch_offset": o, "partition_max_bytes": partition_max_bytes}
        for p, o in enumerate(offsets)
    ]
    return {
        "replica_id": -1,
        "max_wait_ms": max_wait_ms,
        "min_bytes": 1,
        "max_bytes": FETCH_MAX_BYTES,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [{"topic": topic, "partitions": partitions}],
        "forgotten_topics_data": [],
        "rack_id": "",
    }


def count_batches(records: memoryview | bytes) -> tuple[int, int, int]:
    """(records, next offset or -1, bytes) of the whole batches in ``records``; a partial
    batch at the end (a broker may cut one) is left for the next fetch."""
    pos, end, count, next_offset = 0, len(records), 0, -1
    while pos + HEADER_SIZE <= end:
        base_offset, length = _BATCH_OFFSET_LENGTH.unpack_from(records, pos)
        stop = pos + LOG_OVERHEAD + length
        if stop > end:
            break
        (last_delta,) = _INT32.unpack_from(records, pos + _POS_LAST_OFFSET_DELTA)
        (n,) = _INT32.unpack_from(records, pos + _POS_RECORD_COUNT)
        count += n
        next_offset = base_offset + last_delta + 1
        pos = stop
    return count, next_offset, pos


def cpu_s() -> float:
    """This process's CPU seconds, all threads."""
    times = os.times()
    return times.user + times.system


# --- throughput roles -----------------------------------------------------------------------


def run_produce(args: argparse.Namespace) -> dict[str, Any]:
    """Every partition's batch in one request to the bootstrap broker; with ``--route``, a
    connection per partition leader (each with ``in_flight`` requests outstanding, in a
    thread of its own) carrying its partitions' batches, as a Kafka producer does."""
    conn = Connection.connect(args.bootstrap)
    leaders = partition_leaders(conn, args.topic)
    if args.route:
        addresses = broker_addresses(conn)
        conn.close()
        shares = [
            (addresses[leader], sorted(p for p, lead in leaders.items() if lead == leader))
            for leader in sorted(set(leaders.values()))
        ]
    else:
        shares = [(args.bootstrap, sorted(leaders))]
    templates = [
        produce_template(args.topic, ids, args.batch_bytes, args.acks) for _, ids in shares
    ]
    per_request = sum(t.records for t in templates)
    target = -(-args.records // per_request)  # requests on each connection
    conns = [conn] if not args.route else [Connection.connect(a) for a, _ in shares]
    results: list[tuple[int, int]] = [(0, 0)] * len(conns)  # (requests acked, wire bytes)
    errors: list[BaseException] = []
    print("ready", flush=True)
    cpu0, start = cpu_s(), time.perf_counter()
    deadline = start + args.max_s

    def one(i: int) -> None:
        try:
            acked = _produce_on(conns[i], templates[i], target, args.in_flight, deadline)
            results[i] = (acked, acked * templates[i].wire_bytes)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(conns))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start
    cpu = cpu_s() - cpu0
    for c in conns:
        c.close()
    if errors:
        raise LoadError(f"produce failed: {errors[0]!r}")
    return {
        "records": sum(acked * t.records for (acked, _), t in zip(results, templates, strict=True)),
        "requests": sum(acked for acked, _ in results),
        "wire_bytes": sum(wire for _, wire in results),
        "seconds": seconds,
        "cpu_s": cpu,
        "records_per_request": templates[0].records,
        "batch_bytes": templates[0].batch_bytes,
        "partitions": len(leaders),
        "connections": len(conns),
    }


def _produce_on(
    conn: Connection, template: ProduceTemplate, target: int, in_flight: int, deadline: float
) -> int:
    """Send ``template`` ``target`` times with ``in_flight`` outstanding (fewer if the
    deadline passes first); the number of requests acknowledged."""
    body = memoryview(template.body)
    sent = acked = 0
    while acked < target:
        while sent < target and sent - acked < in_flight:
            conn.send((template.head(sent), body))
            sent += 1
        check_produce(conn.read_frame(), acked)
        acked += 1
        if time.perf_counter() > deadline:
            target = sent  # stop sending; collect what is in flight
    return acked


def broker_addresses(conn: Connection) -> dict[int, str]:
    """Broker id -> host:port, from a Metadata request."""
    response = conn.call(
        ApiKey.METADATA, METADATA_VERSION, {"topics": [], "allow_auto_topic_creation": False}
    )
    return {b.node_id: f"{b.host}:{b.port}" for b in response.brokers}


def check_produce(frame: bytes, expected_id: int) -> None:
    correlation_id, response = decode_response(ApiKey.PRODUCE, PRODUCE_VERSION, frame)
    if correlation_id != expected_id:
        raise LoadError(f"produce: correlation id {correlation_id}, expected {expected_id}")
    for topic in response.responses:
        for p in topic.partition_responses:
            if p.error_code != 0:
                raise LoadError(f"produce to {topic.name}-{p.index}: error {p.error_code}")


def run_consume(args: argparse.Namespace) -> dict[str, Any]:
    conn = Connection.connect(args.bootstrap)
    offsets = [0] * len(partition_leaders(conn, args.topic))
    print("ready", flush=True)
    records = wire = fetches = 0
    cpu0, start = cpu_s(), time.perf_counter()
    deadline = start + args.max_s
    while records < args.records and time.perf_counter() < deadline:
        request = fetch_request(args.topic, offsets, args.partition_max_bytes, args.max_wait_ms)
        correlation_id = conn.send_request(ApiKey.FETCH, FETCH_VERSION, request)
        frame = conn.read_frame()
        wire += len(frame) + _SIZE.size
        fetches += 1
        records += consume_response(frame, correlation_id, offsets)
    seconds = time.perf_counter() - start
    cpu = cpu_s() - cpu0
    conn.close()
    return {
        "records": records,
        "wire_bytes": wire,
        "fetches": fetches,
        "seconds": seconds,
        "cpu_s": cpu,
        "next_offsets": offsets,
        "partitions": len(offsets),
    }


def fetch_partitions(frame: bytes, correlation_id: int) -> list[Any]:
    got, response = decode_response(ApiKey.FETCH, FETCH_VERSION, frame)
    if got != correlation_id:
        raise LoadError(f"fetch: correlation id {got}, expected {correlation_id}")
    if response.error_code != 0:
        raise LoadError(f"fetch: error {response.error_code}")
    partitions = [p for topic in response.responses for p in topic.partitions]
    for p in partitions:
        if p.error_code != 0:
            raise LoadError(f"fetch partition {p.partition_index}: error {p.error_code}")
    return partitions


def consume_response(frame: bytes, correlation_id: int, offsets: list[int]) -> int:
    """Records in a Fetch response; advances ``offsets``."""
    total = 0
    for p in fetch_partitions(frame, correlation_id):
        if p.records is None:
            continue
        count, next_offset, _ = count_batches(p.records)
        total += count
        if next_offset >= 0:
            offsets[p.partition_index] = next_offset
    return total


# --- end-to-end latency roles -------------------------------------------------------------


class Pacer:
    """Which records are due: record i at ``start_ns + i * interval_ns``."""

    def __init__(self, rate: float, total: int, start_ns: int) -> None:
        self.interval_ns = 1e9 / rate
        self.total = total
        self.start_ns = start_ns

    def due(self, now_ns: int) -> int:
        """How many records are due by ``now_ns`` (at most ``total``)."""
        if now_ns < self.start_ns:
            return 0
        return min(self.total, int((now_ns - self.start_ns) / self.interval_ns) + 1)

    def due_ns(self, i: int) -> int:
        return self.start_ns + int(i * self.interval_ns)


def paced_batch(pacer: Pacer, first: int, stop: int, padding: bytes) -> bytes:
    now_ms = int(time.time() * 1000)
    records = [
        RecordInput(None, TIMESTAMP.pack(pacer.due_ns(i)) + padding, now_ms)
        for i in range(first, stop)
    ]
    return build_batch(records)


class FrameBuffer:
    """Frames split out of bytes received on a non-blocking socket."""

    def __init__(self) -> None:
        self.data = bytearray()

    def frames(self, received: bytes) -> list[bytes]:
        self.data += received
        out = []
        while len(self.data) >= _SIZE.size:
            (size,) = _SIZE.unpack_from(self.data, 0)
            if len(self.data) < _SIZE.size + size:
                break
            out.append(bytes(self.data[_SIZE.size : _SIZE.size + size]))
            del self.data[: _SIZE.size + size]
        return out


def run_e2e_produce(args: argparse.Namespace) -> dict[str, Any]:
    conn = Connection.connect(args.bootstrap)
    partition_leaders(conn, args.topic)
    total = int(args.rate * args.seconds)
    padding = os.urandom(VALUE_BYTES - TIMESTAMP.size)
    linger_ns = int(args.linger_ms * 1e6)
    print("ready", flush=True)
    selector = selectors.DefaultSelector()
    selector.register(conn.sock, selectors.EVENT_READ)
    frames = FrameBuffer()
    pacer = Pacer(args.rate, total, time.monotonic_ns() + 10_000_000)
    sent = acked = requests = 0
    in_flight: list[tuple[int, int]] = []  # (correlation id, records) outstanding, in order
    next_send_ns = pacer.start_ns
    cpu0 = cpu_s()
    deadline = time.monotonic() + args.seconds + args.max_extra_s
    while (sent < total or in_flight) and time.monotonic() < deadline:
        now = time.monotonic_ns()
        due = pacer.due(now)
        if due > sent and now >= next_send_ns and len(in_flight) < args.in_flight:
            batch = paced_batch(pacer, sent, due, padding)
            in_flight.append(
                (
                    conn.send_request(
                        ApiKey.PRODUCE,
                        PRODUCE_VERSION,
                        produce_value(args.topic, 1, batch, args.acks),
                    ),
                    due - sent,
                )
            )
            sent, requests, next_send_ns = due, requests + 1, now + linger_ns
        if sent >= total or len(in_flight) >= args.in_flight:
            timeout_s = IDLE_WAIT_S
        else:
            timeout_s = max(0, max(next_send_ns, pacer.due_ns(sent)) - time.monotonic_ns()) / 1e9
        if selector.select(timeout=timeout_s):  # readable: recv will not block
            for frame in frames.frames(recv_some(conn.sock)):
                correlation_id, records = in_flight.pop(0)
                check_produce(frame, correlation_id)
                acked += records
    cpu = cpu_s() - cpu0
    selector.close()
    conn.close()
    return {"records": acked, "sent_records": sent, "requests": requests, "cpu_s": cpu}


def recv_some(sock: socket.socket) -> bytes:
    data = sock.recv(RECV_BYTES)
    if not data:
        raise LoadError("connection closed by the peer")
    return data


def run_e2e_consume(args: argparse.Namespace) -> dict[str, Any]:
    conn = Connection.connect(args.bootstrap)
    partition_leaders(conn, args.topic)
    offsets = [args.start_offset]
    latencies_ns: list[int] = []
    skip = int(args.rate * args.warmup_s)
    total = int(args.rate * args.seconds)
    fetches = 0
    ready = False
    cpu0 = cpu_s()
    deadline = time.monotonic() + args.seconds + args.max_extra_s + args.ready_timeout_s
    while len(latencies_ns) < total and time.monotonic() < deadline:
        request = fetch_request(args.topic, offsets, args.partition_max_bytes, args.max_wait_ms)
        correlation_id = conn.send_request(ApiKey.FETCH, FETCH_VERSION, request)
        if not ready:  # the first fetch is on its way: the producer may start
            print("ready", flush=True)
            ready = True
        frame = conn.read_frame()
        now = time.monotonic_ns()
        fetches += 1
        for p in fetch_partitions(frame, correlation_id):
            latencies_ns += record_latencies(p.records, now, offsets)
    cpu = cpu_s() - cpu0
    conn.close()
    measured = sorted(latencies_ns[skip:])
    histogram = Counter(ns // HISTOGRAM_BUCKET_NS for ns in measured)
    return {
        "records": len(latencies_ns),
        "measured_records": len(measured),
        "fetches": fetches,
        "cpu_s": cpu,
        **latency_summary(measured),
        "histogram_bucket_ns": HISTOGRAM_BUCKET_NS,
        "histogram": {str(bucket): n for bucket, n in sorted(histogram.items())},
        "sum_ns": sum(measured),
        "max_ns": measured[-1] if measured else 0,
    }


def record_latencies(records: memoryview | None, now_ns: int, offsets: list[int]) -> list[int]:
    """Latencies of the records at or after ``offsets[0]`` (a batch may begin before the
    fetch offset; a consumer skips those records, as Kafka's do); advances ``offsets``."""
    if records is None:
        return []
    view = memoryview(records)
    out: list[int] = []
    _, next_offset, end = count_batches(view)
    pos, first = 0, offsets[0]
    while pos < end:
        (length,) = _INT32.unpack_from(view, pos + 8)
        batch = decode_batch(bytes(view[pos : pos + LOG_OVERHEAD + length]))
        out += [
            now_ns - TIMESTAMP.unpack_from(r.value or b"", 0)[0]
            for r in batch.records
            if r.offset >= first
        ]
        pos += LOG_OVERHEAD + length
    if next_offset >= 0:
        offsets[0] = next_offset
    return out


def latency_summary(sorted_ns: Sequence[int]) -> dict[str, float | None]:
    def pct(q: float) -> float | None:
        if not sorted_ns:
            return None
        return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1e6

    mean = sum(sorted_ns) / len(sorted_ns) / 1e6 if sorted_ns else None
    return {
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "p999_ms": pct(0.999),
        "max_ms": sorted_ns[-1] / 1e6 if sorted_ns else None,
        "mean_ms": mean,
    }


# --- command line ---------------------------------------------------------------------------

ROLES = {
    "produce": run_produce,
    "consume": run_consume,
    "e2e-produce": run_e2e_produce,
    "e2e-consume": run_e2e_consume,
}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.kafka_load", description=__doc__)
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("--bootstrap", required=True, metavar="HOST:PORT")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--records", type=int, default=50_000_000)
    parser.add_argument("--max-s", type=float, default=60.0)
    parser.add_argument("--batch-bytes", type=int, default=16_384)
    parser.add_argument("--in-flight", type=int, default=5)
    parser.add_argument("--acks", type=int, choices=(-1, 1), default=ACKS)
    parser.add_argument(
        "--route", action="store_true", help="produce: a connection per partition leader"
    )
    parser.add_argument("--partition-max-bytes", type=int, default=1_048_576)
    parser.add_argument("--max-wait-ms", type=int, default=500)
    parser.add_argument("--rate", type=float, default=10_000.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--start-offset", type=int, default=0, help="e2e-consume: from here")
    parser.add_argument("--linger-ms", type=float, default=1.0)
    parser.add_argument("--max-extra-s", type=float, default=10.0)
    parser.add_argument("--ready-timeout-s", type=float, default=30.0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    result = ROLES[args.role](args)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    try:
        main()
    except (LoadError, OSError) as e:
        print(f"kafka_load: {e}", file=sys.stderr)
        sys.exit(1)
