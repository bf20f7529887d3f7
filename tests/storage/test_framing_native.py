"""The compiled record-framing walk (storage/_framing.c) against the Python reference
(storage.records.walk_record_lengths): the same count for every section the reference
accepts, -1 for every section it refuses; well-formed, mutated and random sections."""

from __future__ import annotations

import shutil
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from storage.batch import HEADER_SIZE
from storage.errors import CorruptRecordError
from storage.records import RecordInput, build_batch, compiled_framing, walk_record_lengths

record_count: Callable[[bytes | memoryview], int] | None
try:
    from storage._framing import record_count
except ImportError:  # the build is optional (setup.py); the broker then walks in Python
    record_count = None

_CAN_BUILD = (
    shutil.which("cc") is not None
    and (Path(sysconfig.get_paths()["include"]) / "Python.h").exists()
)

needs_compiled = pytest.mark.skipif(
    record_count is None, reason="storage._framing is not built (no C compiler at install)"
)


def _reference(section: bytes) -> int:
    try:
        return walk_record_lengths(section)
    except CorruptRecordError:
        return -1


def _section(values: Sequence[bytes | None]) -> bytes:
    return build_batch([RecordInput(None, v, 1_000) for v in values])[HEADER_SIZE:]


def test_the_walk_is_compiled_wherever_it_can_be_built() -> None:
    # make install builds it (setup.py); a machine with a compiler and Python's headers
    # that ends up without it means the build broke and produce runs the slow walk
    if not _CAN_BUILD:
        pytest.skip("no C compiler or Python.h here: the pure-Python walk is expected")
    assert compiled_framing()


@needs_compiled
@given(values=st.lists(st.binary(max_size=20_000) | st.none(), min_size=1, max_size=60))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_well_formed_sections_count_the_same(values: list[bytes | None]) -> None:
    section = _section(values)
    assert record_count is not None
    assert record_count(section) == walk_record_lengths(section) == len(values)
    assert record_count(memoryview(section)) == len(values)  # any bytes-like object


@needs_compiled
@given(
    values=st.lists(st.binary(max_size=300), min_size=1, max_size=20),
    flips=st.lists(st.tuples(st.integers(min_value=0), st.integers(0, 255)), max_size=4),
    cut=st.integers(min_value=0, max_value=30),
)
@settings(max_examples=500, deadline=None)
def test_mutated_sections_agree_with_the_reference(
    values: list[bytes], flips: list[tuple[int, int]], cut: int
) -> None:
    section = bytearray(_section(values))
    for where, byte in flips:
        section[where % len(section)] = byte
    mutated = bytes(section[: len(section) - cut])
    assert record_count is not None
    assert record_count(mutated) == _reference(mutated)


@needs_compiled
@given(data=st.binary(max_size=400))
@settings(max_examples=500, deadline=None)
def test_random_bytes_agree_with_the_reference(data: bytes) -> None:
    assert record_count is not None
    assert record_count(data) == _reference(data)


@needs_compiled
@pytest.mark.parametrize(
    ("section", "expected"),
    [
        (b"", 0),
        (b"\x0c" + b"\x00" * 6, 1),  # one 6-byte body
        (b"\x0a" + b"\x00" * 5, -1),  # a 5-byte body is under the smallest record
        (b"\x0c" + b"\x00" * 5, -1),  # the body runs past the end
        (b"\x0c" + b"\x00" * 6 + b"\x00", -1),  # a trailing zero-length prefix
        (b"\x80", -1),  # a prefix that runs past the end
        (b"\x80\x80\x80\x80\x80\x00", -1),  # a prefix longer than 5 bytes
        (b"\xfe\xff\xff\xff\x1f", -1),  # a prefix that overflows 32 bits
        (b"\xfe\xff\xff\xff\x0f", -1),  # int32 max: far past the end
        (b"\x01", -1),  # zigzag -1
    ],
)
def test_edge_cases(section: bytes, expected: int) -> None:
    assert record_count is not None
    assert record_count(section) == expected == _reference(section)


@needs_compiled
def test_it_refuses_what_is_not_bytes_like() -> None:
    assert record_count is not None
    with pytest.raises(TypeError):
        record_count("not bytes")  # type: ignore[arg-type]


def test_check_record_framing_works_without_the_compiled_walk(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from storage import records

    monkeypatch.setattr(records, "_compiled_record_count", None)
    batch = build_batch([RecordInput(None, b"v" * 100, 1_000) for _ in range(3)])
    header = records.decode_batch(batch).header
    records.check_record_framing(batch, 0, header)
    with pytest.raises(CorruptRecordError, match="declares 4 records"):
        records.check_record_framing(batch, 0, header._replace(record_count=4))
