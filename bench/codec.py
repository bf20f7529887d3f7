"""Codec benchmark: runnel's protocol codec against kafka-python's protocol classes.

How this works. Each row times two implementations doing the same job on the same input in
the same run; the ratio runnel/baseline is what matters (absolute figures swing with the
shared machine).

  decode   a Produce request body (v9 flexible, v7 classic) carrying 10 partitions of a
           16 KiB batch: runnel ``decode_request`` (the header is parsed once, outside the
           timing) against kafka-python ``ProduceRequest.decode`` of the same body bytes.
  encode   a Metadata v12 response for one topic of 1000 partitions (3 replicas each) and a
           Fetch response (v12 and v11) of 100 partitions with 10 KiB of records each:
           runnel ``encode_response`` (size prefix and header included) from nested dicts,
           its parts joined into one ``bytes`` (what a sender without ``writev`` needs),
           against kafka-python ``encode`` (body only, one contiguous bytes) of prebuilt
           message objects. Both outputs are checked byte for byte before timing. Figures
           recorded before 2026-11-24 timed runnel's parts unjoined.
  runnel-only rows: the Fetch v12 response with every partition's records a ``FileSlice``
           of a segment file, left for ``os.sendfile`` (kafka-python cannot express it),
           against what a codec without file parts must do: ``pread`` each slice, then
           encode the bytes; and the generated decoder against a decoder built from closures
           (one per field), to justify code generation.

Every pair runs ``rounds`` times, alternating which side goes first; each side's figure is
the median. A round calls the job until ~0.2 s have passed.

Usage: ``python -m bench.codec [--quick]``. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.common import REPO, git_state, verdict, work_dir
from broker.protocol import (
    API_SPECS,
    ApiKey,
    decode_request,
    decode_request_header,
    encode_request,
    encode_response,
    parts_size,
)
from broker.protocol.codegen import layout
from broker.protocol.decode import as_view, struct_decoder
from broker.protocol.schema import FIXED_FORMATS, RECORDS, STRING, Array, Struct
from broker.protocol.values import value_class
from broker.protocol.wire import read_uvarint

KIB = 1024
PRODUCE_PARTITIONS = 10
PRODUCE_BATCH_BYTES = 16 * KIB
METADATA_PARTITIONS = 1000
FETCH_PARTITIONS = 100
FETCH_RECORDS_BYTES = 10 * KIB
ROUNDS = 7
ROUND_SECONDS = 0.2
TARGET_RATIO = 1.0  # writing our own codec must not cost speed


@dataclass(frozen=True, slots=True)
class Row:
    label: str
    baseline: str
    runnel: list[float]  # ops/s per round
    other: list[float]

    @property
    def ratio(self) -> float:
        return statistics.median(self.runnel) / statistics.median(self.other)

    @property
    def best_ratio(self) -> float:
        """Ratio of the best rounds: on a shared machine the least disturbed figure."""
        return max(self.runnel) / max(self.other)


def ops_per_second(job: Callable[[], object], seconds: float) -> float:
    calls, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        for _ in range(10):
            job()
        calls += 10
    return calls / elapsed


def pair(
    label: str,
    baseline: str,
    runnel: Callable[[], object],
    other: Callable[[], object],
    rounds: int,
    seconds: float,
) -> Row:
    ours: list[float] = []
    theirs: list[float] = []
    for i in range(rounds):
        sides = [(runnel, ours), (other, theirs)]
        for job, samples in sides if i % 2 == 0 else sides[::-1]:
            samples.append(ops_per_second(job, seconds))
    return Row(label, baseline, ours, theirs)


# --- inputs --------------------------------------------------------------------------


def produce_value() -> dict[str, Any]:
    batch = os.urandom(PRODUCE_BATCH_BYTES)
    partitions = [{"index": i, "records": batch} for i in range(PRODUCE_PARTITIONS)]
    topic = {"name": "bench-topic", "partition_data": partitions}
    return {"transactional_id": None, "acks": -1, "timeout_ms": 30_000, "topic_data": [topic]}


def metadata_value() -> dict[str, Any]:
    brokers = [{"node_id": n, "host": f"broker-{n}", "port": 9092, "rack": None} for n in (1, 2, 3)]
    partitions = [
        {
            "partition_index": p,
            "leader_id": 1 + p % 3,
            "leader_epoch": 5,
            "replica_nodes": [1, 2, 3],
            "isr_nodes": [1, 2, 3],
        }
        for p in range(METADATA_PARTITIONS)
    ]
    topic = {"name": "bench-topic", "is_internal": False, "partitions": partitions}
    return {"brokers": brokers, "cluster_id": "runnel-bench", "controller_id": 1, "topics": [topic]}


def fetch_value(records: Sequence[Any]) -> dict[str, Any]:
    partitions = [
        {"partition_index": p, "high_watermark": 1000, "last_stable_offset": 1000, "records": r}
        for p, r in enumerate(records)
    ]
    return {"session_id": 0, "responses": [{"topic": "bench-topic", "partitions": partitions}]}


def _norm(name: str) -> str:
    return name.replace("_", "").lower()


def kafka_python_object(kp_struct: Any, make: Any, value: dict[str, Any], version: int) -> Any:
    """A kafka-python message built from runnel's dict (same field names up to case)."""
    mine = {_norm(k): v for k, v in value.items()}
    kwargs = {}
    for kp_field in kp_struct.fields.values():
        if not kp_field.for_version_q(version) or kp_field.tag is not None:
            continue
        v = mine.get(_norm(kp_field.name), kp_field.default)
        if kp_field.is_struct_array() and v is not None:
            v = [kafka_python_object(kp_field, kp_field, e, version) for e in v]
        kwargs[kp_field.name] = v
    return make(version=version, **kwargs)


def _kafka_python_class(api_key: int, request: bool) -> Any:
    from kafka.protocol.consumer import FetchResponse
    from kafka.protocol.metadata import MetadataResponse
    from kafka.protocol.producer import ProduceRequest

    return {0: ProduceRequest, 1: FetchResponse, 3: MetadataResponse}[api_key]


def joined(parts: Sequence[Any]) -> bytes:
    """The parts as one bytes object, one copy (a file region read): what a sender without
    ``writev`` needs, and what kafka-python's ``encode`` returns."""
    return b"".join(p.read() if hasattr(p, "fd") else p for p in parts)


# --- closure decoder (the alternative to generated source) -----------------------------

Reader = Callable[[memoryview, int], tuple[Any, int]]


def closure_decoder(s: Struct, version: int, flexible: bool) -> Reader:
    """A decoder made of one closure per field, no generated source (for comparison)."""
    cls = value_class(s)
    untagged, _ = layout(s, version, flexible)
    readers = {f.name: _closure_reader(f.type, version, flexible) for f in untagged}
    plan = [(readers.get(f.name), f.default) for f in s.fields]

    def read(buf: memoryview, pos: int) -> tuple[Any, int]:
        args = []
        for reader, default in plan:
            if reader is None:
                args.append(default)
            else:
                value, pos = reader(buf, pos)
                args.append(value)
        if flexible:
            count, pos = read_uvarint(buf, pos)
            for _ in range(count):
                _, pos = read_uvarint(buf, pos)
                size, pos = read_uvarint(buf, pos)
                pos += size
        return cls(*args), pos

    return read


def _closure_length(flexible: bool, fmt: str) -> Reader:
    unpack = struct.Struct(fmt).unpack_from

    def length(buf: memoryview, pos: int) -> tuple[int, int]:
        if flexible:
            n, pos = read_uvarint(buf, pos)
            return n - 1, pos
        return unpack(buf, pos)[0], pos + struct.calcsize(fmt)

    return length


def _closure_reader(type_: Any, version: int, flexible: bool) -> Reader:
    if isinstance(type_, Struct):
        return closure_decoder(type_, version, flexible)
    if type_ in FIXED_FORMATS:
        fixed = struct.Struct(">" + FIXED_FORMATS[type_])
        return lambda buf, pos: (fixed.unpack_from(buf, pos)[0], pos + fixed.size)
    length = _closure_length(flexible, ">h" if type_ == STRING else ">i")
    item = _closure_reader(type_.item, version, flexible) if isinstance(type_, Array) else None

    def read(buf: memoryview, pos: int) -> tuple[Any, int]:
        n, pos = length(buf, pos)
        if n < 0:
            return None, pos
        if n > len(buf) - pos:
            raise ValueError("length exceeds remaining bytes")
        if item is not None:
            out = []
            for _ in range(n):
                value, pos = item(buf, pos)
                out.append(value)
            return out, pos
        if type_ == RECORDS:
            return buf[pos : pos + n], pos + n
        return str(buf[pos : pos + n], "utf-8"), pos + n

    return read


# --- the rows ------------------------------------------------------------------------


def produce_frame(version: int, value: dict[str, Any]) -> memoryview:
    return as_view(joined(encode_request(ApiKey.PRODUCE, version, 1, "bench", value))[4:])


def decode_pair(version: int, value: dict[str, Any], rounds: int, seconds: float) -> Row:
    kp_cls = _kafka_python_class(ApiKey.PRODUCE, True)
    frame = produce_frame(version, value)
    header = decode_request_header(frame)
    body = bytes(frame[header.header_size :])
    theirs = kp_cls.decode(body, version=version)
    ours = decode_request(header, frame)
    ours_records = ours.topic_data[0].partition_data[0].records
    if bytes(ours_records) != theirs.topic_data[0].partition_data[0].records:
        raise SystemExit("codecs disagree on the Produce request")
    return pair(
        f"decode Produce v{version} request",
        "kafka-python",
        lambda: decode_request(header, frame),
        lambda: kp_cls.decode(body, version=version),
        rounds,
        seconds,
    )


def generated_pair(value: dict[str, Any], rounds: int, seconds: float) -> Row:
    spec = API_SPECS[ApiKey.PRODUCE]
    frame = produce_frame(9, value)
    body = frame[decode_request_header(frame).header_size :]
    generated = struct_decoder(spec.request, 9, True)
    closures = closure_decoder(spec.request, 9, True)
    if generated(body, 0)[0] != closures(body, 0)[0]:
        raise SystemExit("generated and closure decoders disagree")
    return pair(
        "decode Produce v9, generated source",
        "closures",
        lambda: generated(body, 0),
        lambda: closures(body, 0),
        rounds,
        seconds,
    )


def decode_rows(rounds: int, seconds: float) -> list[Row]:
    value = produce_value()
    return [
        decode_pair(9, value, rounds, seconds),
        decode_pair(7, value, rounds, seconds),
        generated_pair(value, rounds, seconds),
    ]


def encode_pair(
    label: str, api_key: int, version: int, value: dict[str, Any], rounds: int, seconds: float
) -> Row:
    header = decode_request_header(joined(encode_request(api_key, version, 1, "bench", {}))[4:])
    kp_cls = _kafka_python_class(api_key, False)
    message = kafka_python_object(kp_cls._struct, kp_cls, value, version)
    ours = joined(encode_response(header, value))
    theirs = bytes(message.encode(version=version))
    flexible = API_SPECS[api_key].is_flexible(version)
    if ours[8 + flexible :] != theirs:  # size prefix, correlation id, header tags
        raise SystemExit(f"codecs disagree on {label}")
    return pair(
        label,
        "kafka-python",
        lambda: joined(encode_response(header, value)),
        lambda: message.encode(version=version),
        rounds,
        seconds,
    )


def encode_rows(rounds: int, seconds: float) -> list[Row]:
    records = [os.urandom(FETCH_RECORDS_BYTES) for _ in range(FETCH_PARTITIONS)]
    return [
        encode_pair(
            f"encode Metadata v12 response, {METADATA_PARTITIONS} partitions",
            ApiKey.METADATA,
            12,
            metadata_value(),
            rounds,
            seconds,
        ),
        *(
            encode_pair(
                f"encode Fetch v{v} response, {FETCH_PARTITIONS} partitions",
                ApiKey.FETCH,
                v,
                fetch_value(records),
                rounds,
                seconds,
            )
            for v in (12, 11)
        ),
    ]


def file_slice_row(rounds: int, seconds: float) -> Row:
    from storage.segment import FileHandle, FileSlice

    with work_dir(REPO / "data", "bench-codec-") as root:
        path = root / "00000000000000000000.log"
        records = [os.urandom(FETCH_RECORDS_BYTES) for _ in range(FETCH_PARTITIONS)]
        path.write_bytes(b"".join(records))
        handle = FileHandle(path, create=False)
        slices = [
            FileSlice(handle, i * FETCH_RECORDS_BYTES, FETCH_RECORDS_BYTES)
            for i in range(FETCH_PARTITIONS)
        ]
        header = decode_request_header(joined(encode_request(ApiKey.FETCH, 12, 1, "b", {}))[4:])
        in_file, in_memory = fetch_value(slices), fetch_value(records)
        if joined(encode_response(header, in_file)) != joined(encode_response(header, in_memory)):
            raise SystemExit("FileSlice and in-memory encodings differ")
        parts = encode_response(header, in_file)
        if parts_size(parts) != len(joined(parts)):
            raise SystemExit("parts_size is wrong")
        row = pair(
            f"encode Fetch v12, {FETCH_PARTITIONS} FileSlice records",
            "runnel+pread",
            lambda: encode_response(header, in_file),
            lambda: encode_response(header, fetch_value([s.read() for s in slices])),
            rounds,
            seconds,
        )
        handle.close()
    return row


# --- report --------------------------------------------------------------------------


def print_table(rows: list[Row], rounds: int) -> None:
    print(
        f"{'what':<50}{'runnel ops/s':>13}{'baseline ops/s':>15}{'ratio':>7}{'best':>6}  baseline"
    )
    for row in rows:
        ours, theirs = statistics.median(row.runnel), statistics.median(row.other)
        print(
            f"{row.label:<50}{ours:>13,.0f}{theirs:>15,.0f}{row.ratio:>7.2f}"
            f"{row.best_ratio:>6.2f}  {row.baseline:<14}>= {TARGET_RATIO} "
            f"{verdict(row.ratio >= TARGET_RATIO)}"
        )
    print(
        f"\nmedian of {rounds} rounds per side, alternating which side goes first; "
        f"ratio = runnel / baseline (higher is better for runnel); best = ratio of each "
        f"side's best round. Target: runnel is not slower than the baseline.\n"
        f"encode rows against kafka-python: runnel's parts joined into one bytes object, "
        f"as kafka-python's output is."
    )


def report(rows: list[Row], rounds: int, load_at_start: float) -> dict[str, Any]:
    import kafka

    commit, dirty = git_state("broker/protocol", "bench/codec.py")
    return {
        "rows": {
            row.label: {
                "baseline": row.baseline,
                "ratio": round(row.ratio, 3),
                "best_ratio": round(row.best_ratio, 3),
                "target_met": row.ratio >= TARGET_RATIO,
                "runnel_ops_per_s": round(statistics.median(row.runnel)),
                "baseline_ops_per_s": round(statistics.median(row.other)),
                "runnel_ops_per_s_samples": [round(x) for x in row.runnel],
                "baseline_ops_per_s_samples": [round(x) for x in row.other],
            }
            for row in rows
        },
        "rounds": rounds,
        "aggregate": "median of alternating rounds",
        "encode_runnel_output": "parts joined into one bytes object (since 2026-11-24)",
        "produce_batch_bytes": PRODUCE_BATCH_BYTES,
        "fetch_records_bytes": FETCH_RECORDS_BYTES,
        "kafka_python": kafka.__version__,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "load_average_1m_at_start": round(load_at_start, 2),
        "git_commit": commit,
        "protocol_uncommitted_changes": dirty,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.codec", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 short rounds per side")
    args = parser.parse_args(argv)
    rounds, seconds = (3, 0.05) if args.quick else (ROUNDS, ROUND_SECONDS)
    load_at_start = os.getloadavg()[0]
    started = time.perf_counter()
    print(f"runnel codec benchmark (load average {load_at_start:.2f} at start)", flush=True)
    rows = decode_rows(rounds, seconds) + encode_rows(rounds, seconds)
    rows.append(file_slice_row(rounds, seconds))
    print_table(rows, rounds)
    print(f"finished in {time.perf_counter() - started:.1f} s")
    print(json.dumps(report(rows, rounds, load_at_start)))


if __name__ == "__main__":
    main()
