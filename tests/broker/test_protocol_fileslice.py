"""Records held in a segment file travel as a part of their own, for ``os.sendfile``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from test_protocol_support import joined

from broker.protocol import (
    ApiKey,
    decode_request_header,
    decode_response,
    encode_request,
    encode_response,
    parts_size,
)
from broker.protocol.encode import INLINE_RECORDS_MAX_BYTES
from storage.segment import FileHandle, FileSlice


@pytest.fixture
def segment(tmp_path: Path) -> FileHandle:
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(os.urandom(1000) + b"B" * 3000 + os.urandom(1000))
    return FileHandle(path, create=False)


def _fetch_response(version: int, records: list[Any]) -> list[Any]:
    header = decode_request_header(joined(encode_request(ApiKey.FETCH, version, 3, "c", {}))[4:])
    partitions = [{"partition_index": i, "records": r} for i, r in enumerate(records)]
    return encode_response(header, {"responses": [{"topic": "t", "partitions": partitions}]})


@pytest.mark.parametrize("version", [4, 11, 12])
def test_file_slice_is_its_own_part(segment: FileHandle, version: int) -> None:
    file_slice = FileSlice(segment, 1000, 3000)
    parts = _fetch_response(version, [file_slice, None, file_slice])
    assert [p for p in parts if p is file_slice] == [file_slice, file_slice]
    assert parts_size(parts) == len(joined(parts))
    same_bytes = _fetch_response(version, [b"B" * 3000, None, b"B" * 3000])
    assert joined(parts) == joined(same_bytes)
    _, decoded = decode_response(ApiKey.FETCH, version, joined(parts)[4:])
    assert [p.records for p in decoded.responses[0].partitions] == [b"B" * 3000, None, b"B" * 3000]


def test_large_in_memory_records_are_not_copied() -> None:
    big = memoryview(b"x" * (INLINE_RECORDS_MAX_BYTES + 1))
    parts = _fetch_response(12, [big])
    assert any(p is big for p in parts)
    assert joined(parts) == joined(_fetch_response(12, [bytes(big)]))
