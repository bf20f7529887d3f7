"""The Python a request costs inside the broker, in one process: ``python -m bench.request_path``.

Why. The broker's produce throughput on this machine is bound by the CPU it spends per
request, about half of it Python (docs/performance.md, "User and kernel CPU per request").
Here that Python is measured without sockets, the event loop or other processes, so that a
change to the request path shows in seconds and with little noise. It is not the live
broker's cost: the same code has taken about twice as long per request there.

How this works. A broker context over real partition logs in a temporary directory under
``--dir``, its metadata image built from controller records, the real dispatcher and codec:

  produce  a Produce v9 request (one batch of 100-byte records of ``--batch-bytes``, acks=1)
           for a partition with one replica, handled over and over: the CPU per request
           (``process_time``: user and kernel, the kernel's part mostly the page-cache write).
  fetch    one batch produced to each of two partitions with three replicas, then a
           follower's Fetch v15 of both (by topic id, as runnel's followers fetch; v12 by
           name before 2026-11-25) from where it stopped (no session): the time of the
           fetch's handling alone, per fetch (``perf_counter``; it reads no record bytes);
           and the same fetch at v12 (by names), in the same runs, for what ids cost.
  lookup   where the last batch of the produce run's log is (``LogSegment.translate_offset``,
           as every read at the head asks): in the live segment, which remembers its recent
           batches, and, as its baseline, in a copy of it that remembers none (an offset-index
           lookup and a read of batch headers, as for older offsets); µs per lookup
           (``perf_counter``).
  validate a leader's checks of the produce run's batch before its append
           (``Log._validate``): compiled (``storage._framing``, as the broker runs when it is
           built), and in Python (the reference, as it runs where it is not); µs per batch
           (``perf_counter``).
  raw      the baseline, in the same run: the least Python any broker spends on the same
           produce request (one ``unpack_from`` of its header fields, CRC-32C of the batch,
           the ``pwrite``, one ``pack`` of an answer): its CPU per request, measured the
           same way, and the produce figure's ratio to it.

Each figure is the best of ``--repeats`` runs of ``--requests`` requests, the kinds in turn.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import json
import os
import shutil
import struct
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import crc32c

from bench.common import git_state, work_dir
from bench.kafka_load import build_fill_batch, byte_parts, fetch_request, produce_value
from broker.context import BrokerContext, BrokerSettings
from broker.dispatcher import KafkaDispatcher
from broker.producer_ids import ProducerIdManager
from broker.protocol import ApiKey, encode_request
from broker.purgatory import FetchPurgatory
from broker.replica_manager import ReplicaManager
from broker.server import ConnectionInfo
from controller import records as rec
from controller.client import ControllerClient
from controller.image import MetadataDelta, MetadataImage
from storage import batch as batch_module
from storage.config import LogConfig
from storage.log_manager import LogManager
from storage.segment import LogSegment

__all__ = ["main"]

ME, FOLLOWER, OTHER = 1, 2, 3
PRODUCE_TOPIC, FETCH_TOPIC = "produce", "fetch"
PRODUCE_VERSION = 9
FETCH_VERSION = 15  # as runnel's followers fetch: topics by id, the epoch in replica_state
NAMES_FETCH_VERSION = 12  # by names, as they fetched before 2026-11-25: measured beside it
FETCH_TOPIC_ID = b"f" * 16
CONNECTION = ConnectionInfo("127.0.0.1:1", 1, "CLIENT")
_RAW_HEAD = struct.Struct(">ihhi")  # size, api key, version, correlation id
_RAW_ANSWER = struct.Struct(">iiq")  # size, correlation id, base offset


def _image() -> MetadataImage:
    """Three registered brokers; "produce" 0 on this broker alone, "fetch" 0-1 on all three,
    led here with every replica in the ISR."""
    listeners = {b: [("CLIENT", "127.0.0.1", 9091 + b)] for b in (ME, FOLLOWER, OTHER)}
    records = [
        rec.register_broker(b, 0, bytes([b]) * 16, listeners[b], fenced=False) for b in listeners
    ]
    records += [rec.topic(PRODUCE_TOPIC, b"p" * 16), rec.topic(FETCH_TOPIC, FETCH_TOPIC_ID)]
    records.append(rec.partition(b"p" * 16, 0, [ME], [ME], leader=ME))
    replicas = [ME, FOLLOWER, OTHER]
    records += [rec.partition(FETCH_TOPIC_ID, p, replicas, replicas, leader=ME) for p in (0, 1)]
    delta = MetadataDelta(MetadataImage.EMPTY)
    for offset, record in enumerate(records):
        delta.replay(record, offset)
    return delta.apply()


class Broker:
    """The parts of a broker that Produce and Fetch use, over logs under ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.logs = LogManager([directory], LogConfig())
        self.logs.startup()
        purgatory = FetchPurgatory()
        self.replicas = ReplicaManager(
            ME, self.logs, purgatory=purgatory, replica_purgatory=FetchPurgatory()
        )
        image = _image()
        self.replicas.apply(image)
        context = BrokerContext(
            BrokerSettings(ME, "bench", "CLIENT"),
            self.replicas,
            purgatory,
            ProducerIdManager(ME, cast(Any, None), lambda: 0),  # not asked for ids here
            cast(ControllerClient, None),  # Produce and Fetch never call the controller
            lambda: image,
        )
        self.handle = KafkaDispatcher(context).handle

    def log_end_offset(self, topic: str, partition: int) -> int:
        replica = self.replicas.get(topic, partition)
        if replica is None:
            raise RuntimeError(f"{topic}-{partition} is not held here")
        return replica.log_end_offset

    def close(self) -> None:
        self.logs.shutdown()


def _frame(api_key: int, version: int, body: dict[str, Any]) -> memoryview:
    return memoryview(b"".join(byte_parts(encode_request(api_key, version, 1, "bench", body))))[4:]


def produce_frame(topic: str, partition: int, batch: bytes) -> memoryview:
    return _frame(ApiKey.PRODUCE, PRODUCE_VERSION, produce_value(topic, [partition], batch, 1))


def fetch_frame(offsets: Sequence[int], version: int = FETCH_VERSION) -> memoryview:
    """A follower's Fetch of "fetch" 0.. from ``offsets`` (no session, no wait)."""
    body = fetch_request(FETCH_TOPIC, offsets, 1 << 20, 0)
    body["replica_id"] = FOLLOWER  # up to v14
    body["replica_state"] = {"replica_id": FOLLOWER, "replica_epoch": 0}  # v15 on
    body["topics"][0]["topic_id"] = uuid.UUID(bytes=FETCH_TOPIC_ID)
    return _frame(ApiKey.FETCH, version, body)


def produce_us(broker: Broker, frame: memoryview, requests: int) -> float:
    """CPU µs (user and kernel) per Produce request through the dispatcher."""
    handle = broker.handle
    start = time.process_time()
    for _ in range(requests):
        if handle(frame, CONNECTION) is None:
            raise RuntimeError("a produce request got no answer")
    return (time.process_time() - start) * 1e6 / requests


def fetch_us(
    broker: Broker,
    produce: Sequence[memoryview],
    records: int,
    requests: int,
    version: int = FETCH_VERSION,
) -> float:
    """µs per follower Fetch (of ``version``) of both "fetch" partitions, each one batch
    behind."""
    handle = broker.handle
    offsets = [broker.log_end_offset(FETCH_TOPIC, p) for p in (0, 1)]
    spent = 0.0
    for _ in range(requests):
        for frame in produce:
            handle(frame, CONNECTION)
        frame = fetch_frame(offsets, version)
        start = time.perf_counter()
        answer = handle(frame, CONNECTION)
        spent += time.perf_counter() - start
        if not isinstance(answer, list):
            raise RuntimeError("a follower fetch with data waited instead of answering")
        offsets = [offset + records for offset in offsets]
    return spent * 1e6 / requests


def lookup_us(broker: Broker, records: int, requests: int) -> tuple[float, float]:
    """µs per lookup of the last batch of "produce" 0: in its live segment, and in a copy
    of it without the recent batches' positions (the same index and file)."""
    partition = broker.replicas.get(PRODUCE_TOPIC, 0)
    if partition is None:
        raise RuntimeError(f"{PRODUCE_TOPIC}-0 is not held here")
    log = partition.log
    live, offset = log.active_segment, log.log_end_offset - records
    by_index = copy.copy(live)
    by_index._tail = []  # the baseline: what a segment answers from its index alone
    return _lookups_us(live, offset, requests), _lookups_us(by_index, offset, requests)


def _lookups_us(segment: LogSegment, offset: int, requests: int) -> float:
    if segment.translate_offset(offset) is None:
        raise RuntimeError(f"offset {offset} is not in segment {segment.base_offset}")
    return _calls_us(functools.partial(segment.translate_offset, offset), requests)


def validate_us(broker: Broker, batch: bytes, requests: int) -> tuple[float, float]:
    """µs per leader check of ``batch`` (``Log._validate``): compiled, and in Python."""
    partition = broker.replicas.get(PRODUCE_TOPIC, 0)
    if partition is None:
        raise RuntimeError(f"{PRODUCE_TOPIC}-0 is not held here")
    check = functools.partial(partition.log._validate, memoryview(batch), leader=True)
    compiled = batch_module._compiled_check
    if compiled is None:
        raise RuntimeError("storage._framing is not built: nothing compiled to measure")
    try:
        batch_module._compiled_check = None  # as where the module is not built
        python = _calls_us(check, requests)
    finally:
        batch_module._compiled_check = compiled
    return _calls_us(check, requests), python


def _calls_us(call: Callable[[], object], requests: int) -> float:
    start = time.perf_counter()
    for _ in range(requests):
        call()
    return (time.perf_counter() - start) * 1e6 / requests


def raw_us(path: Path, frame: memoryview, batch_offset: int, size: int, requests: int) -> float:
    """CPU µs per request of the least a broker does with the same produce frame."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    batch = frame[batch_offset : batch_offset + size]
    position = 0
    try:
        start = time.process_time()
        for i in range(requests):
            _RAW_HEAD.unpack_from(frame, 0)
            crc32c.crc32c(batch[21:])
            position += os.pwrite(fd, batch, position)
            _RAW_ANSWER.pack(16, i, position)
        return (time.process_time() - start) * 1e6 / requests
    finally:
        os.close(fd)
        path.unlink()


@contextlib.contextmanager
def fresh_broker(directory: Path) -> Iterator[Broker]:
    """A broker over new logs in ``directory``, deleted afterwards (so the next run's writes
    go into the memory they held)."""
    broker = Broker(directory)
    try:
        yield broker
    finally:
        broker.close()
        shutil.rmtree(directory)


def run(directory: Path, batch_bytes: int, requests: int, repeats: int) -> dict[str, Any]:
    batch, records = build_fill_batch(batch_bytes, int(time.time() * 1000))
    produce = produce_frame(PRODUCE_TOPIC, 0, batch)
    feed = [produce_frame(FETCH_TOPIC, p, batch) for p in (0, 1)]
    batch_offset = bytes(produce).find(batch)  # the records field, as the frame holds it
    if batch_offset < 0:
        raise RuntimeError("the batch is not in the produce frame")
    runs: dict[str, list[float]] = {
        "produce": [], "fetch": [], "fetch_v12": [], "raw": [], "lookup": [], "lookup_index": [],
        "validate": [], "validate_python": [],
    }  # fmt: skip
    warm_up = min(requests, 200)  # the first requests compile the codec's functions
    with fresh_broker(directory / "warm-up") as broker:
        produce_us(broker, produce, warm_up)
        fetch_us(broker, feed, records, warm_up)
        fetch_us(broker, feed, records, warm_up, NAMES_FETCH_VERSION)
    raw_us(directory / "raw.bin", produce, batch_offset, len(batch), requests)
    for _ in range(repeats):
        with fresh_broker(directory / "logs") as broker:
            runs["produce"].append(produce_us(broker, produce, requests))
            live, index = lookup_us(broker, records, requests)
            runs["lookup"].append(live)
            runs["lookup_index"].append(index)
            compiled, python = validate_us(broker, batch, requests)
            runs["validate"].append(compiled)
            runs["validate_python"].append(python)
        with fresh_broker(directory / "logs") as broker:
            runs["fetch"].append(fetch_us(broker, feed, records, requests))
        with fresh_broker(directory / "logs") as broker:
            by_names = fetch_us(broker, feed, records, requests, NAMES_FETCH_VERSION)
            runs["fetch_v12"].append(by_names)
        raw = raw_us(directory / "raw.bin", produce, batch_offset, len(batch), requests)
        runs["raw"].append(raw)
    best = {kind: min(values) for kind, values in runs.items()}
    return {
        "produce_us": best["produce"],
        "fetch_us": best["fetch"],
        "fetch_v12_us": best["fetch_v12"],
        "raw_us": best["raw"],
        "lookup_us": best["lookup"],
        "lookup_index_us": best["lookup_index"],
        "validate_us": best["validate"],
        "validate_python_us": best["validate_python"],
        "produce_ratio_to_raw": best["produce"] / best["raw"],
        "runs": runs,
        "records_per_batch": records,
        "batch_bytes": len(batch),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.request_path", description=__doc__)
    parser.add_argument("--dir", type=Path, default=Path("data"))
    parser.add_argument("--batch-bytes", type=int, default=16_384)
    parser.add_argument("--requests", type=int, default=3_000, help="per run")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.requests < 1 or args.repeats < 1 or args.batch_bytes < 200:
        parser.error("--requests and --repeats must be positive, --batch-bytes at least 200")
    return args


def main(argv: Sequence[str] | None = None, *, report: Callable[[str], None] = print) -> None:
    args = parse_args(argv)
    commit, dirty = git_state("bench", "broker", "replication", "storage", "controller")
    with work_dir(args.dir, "bench-request-path-") as directory:
        result = run(directory, args.batch_bytes, args.requests, args.repeats)
    report(
        f"one request in one process, best of {args.repeats} runs of {args.requests:,}"
        f" ({result['batch_bytes']:,}-byte batches of {result['records_per_batch']} records):"
    )
    report(f"  produce through the dispatcher   {result['produce_us']:7.1f} us CPU")
    report(f"  raw: unpack, CRC, pwrite, pack   {result['raw_us']:7.1f} us CPU")
    report(f"  produce / raw                    {result['produce_ratio_to_raw']:7.1f} x")
    report(f"  follower fetch of 2 partitions   {result['fetch_us']:7.1f} us (v{FETCH_VERSION})")
    report(f"  ...the same by names             {result['fetch_v12_us']:7.1f} us (v12)")
    report(f"  head lookup, recent batches      {result['lookup_us']:7.2f} us")
    report(f"  ...by index and batch headers    {result['lookup_index_us']:7.2f} us")
    report(f"  leader's batch checks, compiled  {result['validate_us']:7.2f} us")
    report(f"  ...in Python                     {result['validate_python_us']:7.2f} us")
    report(json.dumps({"benchmark": "request_path", **result, "commit": commit, "dirty": dirty}))


if __name__ == "__main__":
    main()
