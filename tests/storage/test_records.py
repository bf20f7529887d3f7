"""Record-level batch encode/decode (storage.records) and its codecs (storage.codecs).

kafka-python serves as an independent implementation of the v2 format: its batches must
decode here and ours there, and uncompressed batches must match byte for byte.
"""

from __future__ import annotations

import contextlib
import struct
import types
from collections.abc import Iterator, Sequence

import cramjam
import kafka.codec
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from storage import codecs
from storage.batch import (
    CRC_START,
    HEADER_SIZE,
    LOG_OVERHEAD,
    CompressionType,
    TimestampType,
    compute_crc,
)
from storage.errors import CorruptRecordError, InvalidRecordError
from storage.records import (
    DecodedBatch,
    Record,
    RecordInput,
    build_batch,
    check_record_framing,
    decode_batch,
    iter_decoded,
)

ALL_CODECS = list(CompressionType)
COMPRESSED_CODECS = [c for c in CompressionType if c is not CompressionType.NONE]
TYPED_ERRORS = (CorruptRecordError, InvalidRecordError)
MiB = 1024 * 1024

SAMPLE = [
    RecordInput(b"key-0", b"value-0", 1_700_000_000_000, (("trace", b"abc"),)),
    RecordInput(None, b"null key", 1_700_000_000_005),
    RecordInput(b"null value", None, 1_699_999_999_990),  # earlier than the base: delta < 0
    RecordInput(b"", b"", 1_700_000_000_001, (("empty", b""), ("null", None), ("ünï", b"\x00"))),
    RecordInput(None, None, 1_700_000_000_002),
]


def expected_records(inputs: Sequence[RecordInput], base_offset: int = 0) -> list[Record]:
    records = []
    delta = -1
    for item in inputs:
        delta = delta + 1 if item.offset_delta is None else item.offset_delta
        records.append(
            Record(base_offset + delta, item.timestamp_ms, item.key, item.value, item.headers)
        )
    return records


def with_section(
    batch: bytes, section: bytes, *, record_count: int | None = None, attributes: int | None = None
) -> bytes:
    """Swap in a new records section (and optionally count/attributes) with a valid CRC."""
    out = bytearray(batch[:HEADER_SIZE] + section)
    struct.pack_into(">i", out, 8, len(out) - LOG_OVERHEAD)
    if attributes is not None:
        struct.pack_into(">h", out, 21, attributes)
    if record_count is not None:
        struct.pack_into(">i", out, 57, record_count)
    return rewrite_crc(out)


def rewrite_crc(batch: bytearray) -> bytes:
    struct.pack_into(">I", batch, CRC_START - 4, compute_crc(batch, 0, len(batch)))
    return bytes(batch)


@pytest.fixture
def kafka_snappy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Give kafka-python a snappy block codec when python-snappy is absent.

    kafka-python's own xerial framing code still runs; only the raw block compressor
    underneath it comes from cramjam.
    """
    if not kafka.codec.has_snappy():
        shim = types.SimpleNamespace(
            compress=lambda data: bytes(cramjam.snappy.compress_raw(data)),
            decompress=lambda data: bytes(cramjam.snappy.decompress_raw(data)),
        )
        monkeypatch.setattr(kafka.codec, "snappy", shim)
    yield


# --- round trips --------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: c.name)
def test_round_trip_sample(codec: CompressionType) -> None:
    batch = build_batch(SAMPLE, base_offset=42, compression=codec)
    decoded = decode_batch(batch)
    assert list(decoded.records) == expected_records(SAMPLE, 42)
    assert decoded.header.compression is codec
    assert decoded.header.base_offset == 42
    assert decoded.header.last_offset_delta == len(SAMPLE) - 1
    assert decoded.header.record_count == len(SAMPLE)
    assert decoded.header.base_timestamp == SAMPLE[0].timestamp_ms
    assert decoded.header.max_timestamp == max(r.timestamp_ms for r in SAMPLE)
    assert decoded.header.size_bytes == len(batch)


@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: c.name)
def test_round_trip_large_value(codec: CompressionType) -> None:
    value = bytes(range(256)) * (4 * 1024)  # 1 MiB
    inputs = [RecordInput(b"k", value, 5), RecordInput(b"after", b"small", 6)]
    decoded = decode_batch(build_batch(inputs, compression=codec))
    assert list(decoded.records) == expected_records(inputs)


@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: c.name)
def test_round_trip_many_records(codec: CompressionType) -> None:
    inputs = [
        RecordInput(f"k{i}".encode(), f"v{i}".encode() * (i % 7), 1000 + i, (("i", b"%d" % i),))
        for i in range(3000)
    ]
    decoded = decode_batch(build_batch(inputs, base_offset=10**12, compression=codec))
    assert list(decoded.records) == expected_records(inputs, 10**12)


def test_header_fields_are_written() -> None:
    batch = build_batch(
        SAMPLE,
        base_offset=7,
        compression=CompressionType.LZ4,
        producer_id=9001,
        producer_epoch=3,
        base_sequence=100,
        partition_leader_epoch=12,
        is_transactional=True,
        is_control=True,
    )
    header = decode_batch(batch).header
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (9001, 3, 100)
    assert header.partition_leader_epoch == 12
    assert header.is_transactional and header.is_control
    assert header.timestamp_type is TimestampType.CREATE_TIME
    assert header.last_sequence == 104


def test_log_append_time_gives_every_record_the_max_timestamp() -> None:
    batch = build_batch(
        SAMPLE, timestamp_type=TimestampType.LOG_APPEND_TIME, max_timestamp=1_800_000_000_000
    )
    decoded = decode_batch(batch)
    assert decoded.header.timestamp_type is TimestampType.LOG_APPEND_TIME
    assert {r.timestamp for r in decoded.records} == {1_800_000_000_000}


def test_offset_gaps_keep_the_largest_delta() -> None:
    inputs = [
        RecordInput(b"a", b"1", 10, offset_delta=0),
        RecordInput(b"b", b"2", 11, offset_delta=3),
        RecordInput(b"c", b"3", 12),  # follows on from 3
        RecordInput(b"d", b"4", 13, offset_delta=9),
    ]
    decoded = decode_batch(build_batch(inputs, base_offset=100))
    assert [r.offset for r in decoded.records] == [100, 103, 104, 109]
    assert decoded.header.last_offset_delta == 9
    assert decoded.header.next_offset == 110


def test_extreme_varints_round_trip() -> None:
    inputs = [
        RecordInput(b"k", b"v", 0),
        RecordInput(b"k", b"v", -(2**63) + 1),  # the most negative varlong delta
        RecordInput(b"k", b"v", 2**62, offset_delta=2**31 - 1),
    ]
    decoded = decode_batch(build_batch(inputs))
    assert list(decoded.records) == expected_records(inputs)


@pytest.mark.parametrize(
    "inputs",
    [
        [],
        [RecordInput(b"k", b"v", 0, offset_delta=1), RecordInput(b"k", b"v", 0, offset_delta=1)],
        [RecordInput(b"k", b"v", 0, offset_delta=-1)],
        [RecordInput(b"k", b"v", 0, offset_delta=2**31)],
    ],
    ids=["empty", "repeated-delta", "negative-delta", "delta-overflow"],
)
def test_build_rejects_bad_input(inputs: list[RecordInput]) -> None:
    with pytest.raises(ValueError):
        build_batch(inputs)


def test_build_rejects_out_of_range_header_field() -> None:
    with pytest.raises(ValueError):
        build_batch(SAMPLE, producer_epoch=2**15)


def test_iter_decoded_walks_concatenated_batches() -> None:
    first = build_batch(SAMPLE[:2], base_offset=0)
    second = build_batch(SAMPLE[2:], base_offset=2, compression=CompressionType.ZSTD)
    batches = list(iter_decoded(first + second))
    assert [b.header.base_offset for b in batches] == [0, 2]
    assert [r for b in batches for r in b.records] == expected_records(SAMPLE)
    with pytest.raises(CorruptRecordError):
        list(iter_decoded(first + second[:-1]))


# --- kafka-python interoperability --------------------------------------------------------


def kafka_python_batch(
    inputs: Sequence[RecordInput],
    codec: CompressionType = CompressionType.NONE,
    *,
    producer: tuple[int, int, int] = (-1, -1, -1),
) -> bytes:
    producer_id, producer_epoch, base_sequence = producer
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=int(codec),
        is_transactional=False,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=64 * MiB,
    )
    for offset, item in enumerate(inputs):
        builder.append(offset, item.timestamp_ms, item.key, item.value, list(item.headers))
    return bytes(builder.build())


def decode_with_kafka_python(batch: bytes) -> list[Record]:
    parsed = DefaultRecordBatch(batch)
    assert parsed.validate_crc()
    return [Record(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in parsed]


def test_uncompressed_bytes_match_kafka_python() -> None:
    theirs = kafka_python_batch(SAMPLE, producer=(4242, 7, 1000))
    ours = build_batch(
        SAMPLE,
        producer_id=4242,
        producer_epoch=7,
        base_sequence=1000,
        partition_leader_epoch=0,  # kafka-python leaves it 0; the Java producer writes -1
    )
    assert ours == theirs


@pytest.mark.usefixtures("kafka_snappy")
@pytest.mark.parametrize("codec", COMPRESSED_CODECS, ids=lambda c: c.name)
def test_kafka_python_batches_decode(codec: CompressionType) -> None:
    inputs = [*SAMPLE, RecordInput(b"big", b"0123456789" * 20_000, 7)]  # > one 32/64 KiB block
    decoded = decode_batch(kafka_python_batch(inputs, codec, producer=(1, 2, 3)))
    assert decoded.header.compression is codec
    assert list(decoded.records) == expected_records(inputs)


@pytest.mark.usefixtures("kafka_snappy")
@pytest.mark.parametrize("codec", COMPRESSED_CODECS, ids=lambda c: c.name)
def test_our_batches_decode_in_kafka_python(codec: CompressionType) -> None:
    inputs = [*SAMPLE, RecordInput(b"big", b"0123456789" * 20_000, 7)]
    batch = build_batch(inputs, base_offset=5, compression=codec)
    assert decode_with_kafka_python(batch) == expected_records(inputs, 5)


# --- codec formats ------------------------------------------------------------------------

PAYLOAD = b"".join(b"record %d with some repetition; " % i for i in range(4000))  # ~130 KiB


def test_snappy_writes_xerial_blocks_of_32_kib() -> None:
    framed = codecs.compress(CompressionType.SNAPPY, PAYLOAD)
    assert framed[:16] == b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    pos, blocks = 16, 0
    while pos < len(framed):
        (length,) = struct.unpack_from(">i", framed, pos)
        block = framed[pos + 4 : pos + 4 + length]
        assert len(cramjam.snappy.decompress_raw(block)) <= 32 * 1024
        pos += 4 + length
        blocks += 1
    assert pos == len(framed)
    assert blocks == -(-len(PAYLOAD) // (32 * 1024))


def test_snappy_reads_raw_and_framed() -> None:
    raw = bytes(cramjam.snappy.compress_raw(PAYLOAD))
    framed = codecs.compress(CompressionType.SNAPPY, PAYLOAD)
    assert codecs.decompress(CompressionType.SNAPPY, raw, MiB) == PAYLOAD
    assert codecs.decompress(CompressionType.SNAPPY, framed, MiB) == PAYLOAD


def test_snappy_raw_records_section_decodes() -> None:
    plain = build_batch(SAMPLE)
    section = bytes(cramjam.snappy.compress_raw(plain[HEADER_SIZE:]))
    batch = with_section(plain, section, attributes=int(CompressionType.SNAPPY))
    assert list(decode_batch(batch).records) == expected_records(SAMPLE)


def test_lz4_frame_has_independent_64k_blocks_and_no_checksum() -> None:
    frame = codecs.compress(CompressionType.LZ4, PAYLOAD)
    assert frame[:4] == b"\x04\x22\x4d\x18"
    flags, block_descriptor = frame[4], frame[5]
    assert flags >> 6 == 1  # frame format version 01
    assert flags & 0x20  # blocks independent
    assert not flags & 0x08  # no content size
    assert not flags & 0x04  # no content checksum
    assert (block_descriptor >> 4) & 0x7 == 4  # 64 KiB maximum block size


def test_zstd_reads_frames_without_content_size_and_several_frames() -> None:
    streamed = zstandard.ZstdCompressor(write_content_size=False).compress(PAYLOAD)
    assert zstandard.frame_content_size(streamed) == -1
    assert codecs.decompress(CompressionType.ZSTD, streamed, MiB) == PAYLOAD
    assert codecs.decompress(CompressionType.ZSTD, streamed + streamed, MiB) == PAYLOAD * 2


@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: c.name)
def test_codecs_round_trip_empty_input(codec: CompressionType) -> None:
    assert codecs.decompress(codec, codecs.compress(codec, b""), 0) == b""


# --- corruption ---------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: c.name)
def test_any_flipped_byte_from_the_crc_on_is_detected(codec: CompressionType) -> None:
    batch = build_batch(SAMPLE, compression=codec)
    for index in range(CRC_START - 4, len(batch)):
        corrupt = bytearray(batch)
        corrupt[index] ^= 0x5A
        with pytest.raises(CorruptRecordError):
            decode_batch(bytes(corrupt))


@pytest.mark.parametrize("codec", ALL_CODECS, ids=lambda c: c.name)
def test_truncated_batches_raise(codec: CompressionType) -> None:
    batch = build_batch(SAMPLE, compression=codec)
    for size in range(len(batch)):
        with pytest.raises(CorruptRecordError):
            decode_batch(batch[:size])


@pytest.mark.parametrize("codec", COMPRESSED_CODECS, ids=lambda c: c.name)
def test_decompression_bomb_is_refused(codec: CompressionType) -> None:
    batch = build_batch([RecordInput(None, bytes(16 * MiB), 0)], compression=codec)
    assert len(batch) < MiB
    with pytest.raises(CorruptRecordError, match="more than"):
        decode_batch(batch, max_uncompressed_bytes=MiB)
    assert decode_batch(batch, max_uncompressed_bytes=17 * MiB).records[0].value == bytes(16 * MiB)


def test_zstd_bomb_without_content_size_is_refused() -> None:
    bomb = zstandard.ZstdCompressor(write_content_size=False).compress(bytes(64 * MiB))
    with pytest.raises(CorruptRecordError, match="more than"):
        codecs.decompress(CompressionType.ZSTD, bomb, MiB)


@pytest.mark.parametrize("codec", COMPRESSED_CODECS, ids=lambda c: c.name)
def test_truncated_or_padded_compressed_stream_raises(codec: CompressionType) -> None:
    stream = codecs.compress(codec, PAYLOAD)
    for bad in (stream[: len(stream) // 2], stream[:-1], b"", b"\x00garbage\xff" * 3):
        with pytest.raises(CorruptRecordError):
            codecs.decompress(codec, bad, MiB)
    if codec is not CompressionType.SNAPPY:  # xerial has no end marker; raw data ends anywhere
        with pytest.raises(CorruptRecordError):
            codecs.decompress(codec, stream + b"\x01\x02", MiB)


def test_record_count_mismatch_raises() -> None:
    batch = build_batch(SAMPLE)
    section = batch[HEADER_SIZE:]
    with pytest.raises(CorruptRecordError, match="declares 6 records"):
        decode_batch(with_section(batch, section, record_count=len(SAMPLE) + 1))
    with pytest.raises(CorruptRecordError, match="follow"):
        decode_batch(with_section(batch, section, record_count=len(SAMPLE) - 1))
    with pytest.raises(CorruptRecordError, match="follow"):
        decode_batch(with_section(batch, section + b"\x00"))


def test_overlong_varint_raises() -> None:
    batch = build_batch(SAMPLE[:1])
    section = b"\xff" * 6 + batch[HEADER_SIZE + 1 :]  # a record length of six varint bytes
    with pytest.raises(CorruptRecordError, match="longer than 5 bytes"):
        decode_batch(with_section(batch, section))


def test_offset_delta_beyond_last_offset_delta_is_invalid() -> None:
    batch = bytearray(build_batch(SAMPLE))
    struct.pack_into(">i", batch, 23, len(SAMPLE) - 2)  # last offset delta one too small
    with pytest.raises(InvalidRecordError, match="offset delta"):
        decode_batch(rewrite_crc(batch))


# --- properties ---------------------------------------------------------------------------

nullable_bytes = st.none() | st.binary(max_size=64)
record_inputs = st.builds(
    RecordInput,
    key=nullable_bytes,
    value=nullable_bytes,
    timestamp_ms=st.integers(min_value=-(2**62), max_value=2**62 - 1),  # any two differ by an int64
    headers=st.lists(st.tuples(st.text(max_size=8), nullable_bytes), max_size=3).map(tuple),
    offset_delta=st.none(),
)


@st.composite
def record_lists(draw: st.DrawFn) -> list[RecordInput]:
    items = draw(st.lists(record_inputs, min_size=1, max_size=20))
    gaps = draw(st.lists(st.integers(0, 1000), min_size=len(items), max_size=len(items)))
    out, delta = [], -1
    for item, gap in zip(items, gaps, strict=True):
        delta += 1 + gap
        out.append(RecordInput(item.key, item.value, item.timestamp_ms, item.headers, delta))
    return out


@settings(max_examples=100, deadline=None)
@given(
    inputs=record_lists(),
    codec=st.sampled_from(ALL_CODECS),
    base_offset=st.integers(0, 2**62),
)
def test_round_trip_property(
    inputs: list[RecordInput], codec: CompressionType, base_offset: int
) -> None:
    batch = build_batch(inputs, base_offset=base_offset, compression=codec)
    decoded = decode_batch(batch)
    assert decoded == DecodedBatch(decoded.header, tuple(expected_records(inputs, base_offset)))
    assert decoded.header.last_offset_delta == inputs[-1].offset_delta


def assert_only_typed_errors(batch: bytes) -> None:
    """Decoding may fail, but only with the storage engine's typed errors."""
    with contextlib.suppress(*TYPED_ERRORS):
        decode_batch(batch, max_uncompressed_bytes=MiB)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    section=st.binary(max_size=200),
    record_count=st.integers(-2, 8),
    codec=st.sampled_from(ALL_CODECS),
    compress_it=st.booleans(),
)
def test_garbage_records_section_raises_typed_errors(
    section: bytes, record_count: int, codec: CompressionType, compress_it: bool
) -> None:
    """Random bytes, raw or validly compressed, behind a valid CRC: only typed errors."""
    payload = codecs.compress(codec, section) if compress_it else section
    batch = build_batch(SAMPLE[:1])
    assert_only_typed_errors(
        with_section(batch, payload, record_count=record_count, attributes=int(codec))
    )


@settings(max_examples=300, deadline=None)
@given(
    codec=st.sampled_from(ALL_CODECS),
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4),
)
def test_mutated_records_raise_typed_errors(
    codec: CompressionType, edits: list[tuple[int, int]]
) -> None:
    """Valid records with a few bytes changed, then recompressed and re-CRC'd."""
    batch = build_batch(SAMPLE)
    section = bytearray(batch[HEADER_SIZE:])
    for position, value in edits:
        section[position % len(section)] = value
    payload = codecs.compress(codec, section)
    assert_only_typed_errors(with_section(batch, payload, attributes=int(codec)))


# -- the leader's framing check ----------------------------------------------------------------


def _recrc(data: bytearray) -> bytearray:
    """Recompute the CRC after a change, as a buggy producer that checksums garbage would."""
    struct.pack_into(">I", data, CRC_START - 4, compute_crc(data, 0, len(data)))
    return data


@given(
    values=st.lists(st.binary(max_size=300) | st.none(), min_size=1, max_size=40),
    codec=st.sampled_from(list(CompressionType)),
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_well_formed_batches_pass_the_framing_check(
    values: list[bytes | None], codec: CompressionType
) -> None:
    data = build_batch([RecordInput(b"k", v, 1_000) for v in values], compression=codec)
    check_record_framing(data, 0, decode_batch(data).header)


def test_a_checksummed_batch_whose_records_do_not_tile_its_section_is_refused() -> None:
    data = bytearray(build_batch([RecordInput(None, b"v" * 100, 1_000) for _ in range(3)]))
    header = decode_batch(bytes(data)).header
    garbage = _recrc(bytearray(data[:HEADER_SIZE]) + b"\x7f" * (len(data) - HEADER_SIZE))
    with pytest.raises(CorruptRecordError, match="under the smallest record"):
        check_record_framing(garbage, 0, header)
    fewer = bytearray(data)
    struct.pack_into(">i", fewer, HEADER_SIZE - 4, 4)  # record count 4, three inside
    with pytest.raises(CorruptRecordError, match="declares 4 records"):
        check_record_framing(_recrc(fewer), 0, header._replace(record_count=4))


@pytest.mark.parametrize("codec", [CompressionType.NONE, CompressionType.LZ4])
def test_the_framing_check_keeps_the_records_section_budget(codec: CompressionType) -> None:
    """``max_uncompressed_bytes`` bounds a records section walked as it is too."""
    data = build_batch([RecordInput(None, b"v" * 100, 1_000) for _ in range(30)], compression=codec)
    header = decode_batch(data).header
    check_record_framing(data, 0, header, max_uncompressed_bytes=4_000)
    with pytest.raises(CorruptRecordError, match="3000 bytes"):
        check_record_framing(data, 0, header, max_uncompressed_bytes=3_000)


def test_a_checksummed_batch_that_does_not_decompress_is_refused() -> None:
    data = bytearray(
        build_batch([RecordInput(None, b"v" * 100, 1_000)], compression=CompressionType.GZIP)
    )
    data[HEADER_SIZE + 12] ^= 0xFF
    header = decode_batch(
        build_batch([RecordInput(None, b"v" * 100, 1_000)], compression=CompressionType.GZIP)
    ).header
    with pytest.raises(CorruptRecordError):
        check_record_framing(_recrc(data), 0, header)
