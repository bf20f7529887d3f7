"""The compiled batch check (storage/_framing.c ``checked_header``, used by
``storage.batch.validate_batch``, ``checked_header`` and the leader's ``Log._validate``) against
the Python reference (``validate_batch`` with the compiled check turned off, and
``check_record_framing``): the same header for every batch the reference accepts, None for
every batch it refuses; well-formed, mutated (with and without a repaired CRC), truncated and
random input, at any position in a buffer."""

from __future__ import annotations

import struct
from collections.abc import Iterator

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage import batch as batch_module
from storage.batch import (
    CRC_START,
    NO_WALK,
    BatchHeader,
    CompressionType,
    checked_header,
    validate_batch,
)
from storage.config import LogConfig
from storage.errors import CorruptRecordError, InvalidRecordError
from storage.loader import load_log
from storage.log import Log
from storage.records import RecordInput, build_batch, check_record_framing

compiled = batch_module._compiled_check
needs_compiled = pytest.mark.skipif(
    compiled is None, reason="storage._framing is not built (no C compiler at install)"
)
_CRC_AT = CRC_START - 4


@pytest.fixture
def python_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """validate_batch and checked_header as they run where the module is not built."""
    monkeypatch.setattr(batch_module, "_compiled_check", None)
    yield


def _reference(buf: bytes, pos: int, walk_max: int) -> BatchHeader | None:
    """What the Python code says of the batch at ``pos`` (the compiled check off)."""
    saved, batch_module._compiled_check = batch_module._compiled_check, None
    try:
        header = validate_batch(buf, pos)
        if walk_max >= 0 and header.compression is CompressionType.NONE:
            check_record_framing(buf, pos, header, max_uncompressed_bytes=walk_max)
    except (CorruptRecordError, InvalidRecordError):
        return None
    finally:
        batch_module._compiled_check = saved
    return header


def _batch(values: list[bytes], codec: CompressionType = CompressionType.NONE) -> bytes:
    records = [RecordInput(b"k%d" % i, v, 1_000 + i) for i, v in enumerate(values)]
    return build_batch(records, base_offset=7, compression=codec, producer_id=3)


def _with_crc(data: bytearray, pos: int) -> bytes:
    """``data`` with the CRC of the batch at ``pos`` recomputed over its declared length."""
    (length,) = struct.unpack_from(">i", data, pos + 8)
    end = min(len(data), pos + 12 + max(length, 0))
    if end > pos + CRC_START:
        struct.pack_into(">I", data, pos + _CRC_AT, crc32c.crc32c(data[pos + CRC_START : end]))
    return bytes(data)


def _agree(buf: bytes, pos: int) -> None:
    for walk_max in (NO_WALK, 1 << 20, 40):
        expected = _reference(buf, pos, walk_max)
        assert checked_header(buf, pos, walk_max) == expected, f"walk_max={walk_max}"


@needs_compiled
@given(
    values=st.lists(st.binary(max_size=500), min_size=1, max_size=30),
    codec=st.sampled_from([CompressionType.NONE, CompressionType.GZIP, CompressionType.LZ4]),
    prefix=st.binary(max_size=20),
)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_well_formed_batches_give_the_reference_header(
    values: list[bytes], codec: CompressionType, prefix: bytes
) -> None:
    data = prefix + _batch(values, codec) + b"tail"
    header = checked_header(data, len(prefix), 1 << 20)
    assert header is not None
    assert isinstance(header, BatchHeader)
    assert header == _reference(data, len(prefix), 1 << 20)
    assert validate_batch(memoryview(data), len(prefix)) == header  # any bytes-like object


@needs_compiled
@given(
    values=st.lists(st.binary(max_size=200), min_size=1, max_size=12),
    flips=st.lists(
        st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=4
    ),
    repair_crc=st.booleans(),
    cut=st.integers(min_value=0, max_value=70),
)
@settings(max_examples=600, deadline=None)
def test_mutated_batches_agree_with_the_reference(
    values: list[bytes], flips: list[tuple[int, int]], repair_crc: bool, cut: int
) -> None:
    data = bytearray(_batch(values))
    for where, byte in flips:
        data[where % len(data)] = byte
    # A repaired CRC reaches the checks behind it: counts, codec, the records' framing.
    mutated = _with_crc(data, 0) if repair_crc else bytes(data)
    _agree(mutated[: max(0, len(mutated) - cut)], 0)


@needs_compiled
@given(data=st.binary(max_size=200), pos=st.integers(min_value=-3, max_value=210))
@settings(max_examples=400, deadline=None)
def test_random_bytes_agree_with_the_reference(data: bytes, pos: int) -> None:
    _agree(data, pos)


@needs_compiled
@pytest.mark.parametrize(
    ("at", "fmt", "value"),
    [
        (0, ">q", -1),  # base offset
        (8, ">i", 48),  # batch length below the header
        (8, ">i", 10_000),  # batch length past the end
        (16, ">b", 1),  # magic
        (21, ">h", 5),  # codec id 5, 6 and 7 are unknown
        (21, ">h", 7),
        (23, ">i", -1),  # last offset delta
        (57, ">i", -1),  # record count
    ],
)
def test_each_header_check_refuses(at: int, fmt: str, value: int) -> None:
    data = bytearray(_batch([b"v" * 10] * 2))
    struct.pack_into(fmt, data, at, value)
    mutated = _with_crc(data, 0)
    assert _reference(mutated, 0, NO_WALK) is None
    assert checked_header(mutated, 0, NO_WALK) is None


@needs_compiled
def test_the_walk_is_bounded_by_walk_max_and_skips_compressed_batches() -> None:
    plain = _batch([b"v" * 100] * 3)
    section = len(plain) - 61
    assert checked_header(plain, 0, section) is not None
    assert checked_header(plain, 0, section - 1) is None  # the reference's budget error
    assert checked_header(plain, 0, NO_WALK) is not None
    # A compressed batch is not walked here (it must be decompressed first): the caller
    # checks its framing itself.
    wrong_count = bytearray(_batch([b"v" * 100] * 3, CompressionType.GZIP))
    struct.pack_into(">i", wrong_count, 57, 4)
    repaired = _with_crc(wrong_count, 0)
    assert checked_header(repaired, 0, 1 << 20) is not None
    assert _reference(repaired, 0, NO_WALK) is not None


@needs_compiled
def test_argument_errors_are_raised() -> None:
    assert compiled is not None
    data = _batch([b"v"])
    with pytest.raises(TypeError):
        compiled("not bytes", 0, crc32c.crc32c, NO_WALK)
    with pytest.raises(TypeError):
        compiled(data, 0, crc32c.crc32c)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="boom"):
        compiled(data, 0, _failing_crc, NO_WALK)  # the CRC function's error comes through


def _failing_crc(_data: memoryview) -> int:
    raise ValueError("boom")


def _leader_log(tmp_path_factory: pytest.TempPathFactory) -> Log:
    return load_log(tmp_path_factory.mktemp("log") / "t-0", LogConfig())


@pytest.mark.parametrize("built", [True, False], ids=["compiled", "python"])
def test_a_leader_append_refuses_bad_framing_with_the_reference_message(
    built: bool, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    if built and compiled is None:
        pytest.skip("storage._framing is not built")
    if not built:
        monkeypatch.setattr(batch_module, "_compiled_check", None)
    log = _leader_log(tmp_path_factory)
    try:
        good = _batch([b"v" * 50] * 3)
        bad = bytearray(good)
        bad[61] += 2  # the first record's length prefix: the records no longer tile
        with pytest.raises(CorruptRecordError, match="batch at offset 7"):  # the CRC repaired
            log.append_as_leader(_with_crc(bad, 0), 1)
        assert log.log_end_offset == 0
        # A compressed batch is walked after decompression, by the caller: its framing too.
        packed = bytearray(_batch([b"v" * 50] * 3, CompressionType.GZIP))
        packed[len(packed) // 2 + 30] ^= 0xFF
        with pytest.raises(CorruptRecordError):
            log.append_as_leader(_with_crc(packed, 0), 1)
        assert log.log_end_offset == 0
        info = log.append_as_leader(good, 1)
        assert (info.first_offset, info.last_offset) == (0, 2)
    finally:
        log.close()


def test_checked_header_is_none_without_the_module(python_only: None) -> None:
    assert checked_header(_batch([b"v"]), 0, 1 << 20) is None
    assert validate_batch(_batch([b"v"]), 0).record_count == 1  # the Python reference
