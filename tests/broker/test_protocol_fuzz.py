"""Hostile input: random bytes and damaged valid frames into every decoder.

Only ``ProtocolError`` may escape, and every decode must finish quickly: a length field set
to 2**31-1 in a 50-byte frame must fail at once, not allocate or loop (the timeout marks turn
a hang into a failure).
"""

from __future__ import annotations

import contextlib
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_protocol_support import CASES, Case, joined, struct_values

from broker.protocol import (
    ApiKey,
    ProtocolError,
    decode_request,
    decode_request_header,
    decode_response,
    encode_request,
    encode_response,
)
from broker.protocol.decode import decode_struct

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_HOSTILE_WORDS = [
    b"\x7f\xff\xff\xff",
    b"\xff\xff\xff\xff",
    b"\x80\x00\x00\x00",
    b"\xff\xfe",
    b"\x7f\xff",
    b"\xff\xff\xff\xff\x0f",  # the largest 5-byte unsigned varint
    b"\xff\xff\xff\xff\xff\x01",  # a 6-byte varint
]


def _decode_everything(case: Case, frame: bytes) -> None:
    """Run every decoder that could see ``frame``; anything but ProtocolError propagates."""
    for decode in (
        lambda: decode_request(decode_request_header(frame), frame),
        lambda: decode_response(case.spec.key, case.version, frame),
        lambda: decode_struct(case.struct, case.version, case.flexible, memoryview(frame)),
    ):
        with contextlib.suppress(ProtocolError):
            decode()


def _valid_frame(case: Case, value: dict[str, Any]) -> bytes:
    key, version = case.spec.key, case.version
    if case.is_request:
        return joined(encode_request(key, version, 1, "fuzz", value))[4:]
    header = decode_request_header(joined(encode_request(key, version, 1, None, {}))[4:])
    return joined(encode_response(header, value))[4:]


@st.composite
def _damaged(draw: st.DrawFn, frame: bytes) -> bytes:
    data = bytearray(frame)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "word", "insert", "delete"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[at:]
        elif kind == "word":
            word = draw(st.sampled_from(_HOSTILE_WORDS))
            data[at : at + len(word)] = word
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 8))]
    return bytes(data)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
@FUZZ
@given(data=st.data())
def test_damaged_frames_raise_only_protocol_error(case: Case, data: st.DataObject) -> None:
    frame = _valid_frame(case, data.draw(struct_values(case.struct, case.version)))
    _decode_everything(case, data.draw(_damaged(frame)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES[::7], ids=[c.id for c in CASES[::7]])
@FUZZ
@given(frame=st.binary(max_size=200))
def test_random_bytes_raise_only_protocol_error(case: Case, frame: bytes) -> None:
    _decode_everything(case, frame)


@pytest.mark.timeout(60)
@FUZZ
@given(
    api_key=st.sampled_from([int(k) for k in ApiKey] + [-1, 999]),
    version=st.integers(-(2**15), 2**15 - 1),
    tail=st.binary(max_size=64),
)
def test_random_headers_raise_only_protocol_error(api_key: int, version: int, tail: bytes) -> None:
    frame = struct.pack(">hh", api_key, version) + tail
    try:
        header = decode_request_header(frame)
        decode_request(header, frame)
    except ProtocolError:
        pass


@pytest.mark.timeout(10)
@pytest.mark.parametrize("length", [2**31 - 1, 2**20, -2])
def test_hostile_array_length_fails_fast(length: int) -> None:
    # Metadata v1 request: topics array (int32 length) with nothing behind it
    frame = struct.pack(">hhih", ApiKey.METADATA, 1, 1, -1) + struct.pack(">i", length)
    with pytest.raises(ProtocolError):
        decode_request(decode_request_header(frame), frame)


@pytest.mark.timeout(10)
def test_hostile_compact_length_fails_fast() -> None:
    # Metadata v9 request (flexible): empty header tags, topics length as a 5-byte varint
    head = struct.pack(">hhih", ApiKey.METADATA, 9, 1, -1) + b"\x00"
    for varint in (b"\xff\xff\xff\xff\x0f", b"\x80\x80\x80\x80\x80\x01"):
        frame = head + varint + b"\x00"
        with pytest.raises(ProtocolError):
            decode_request(decode_request_header(frame), frame)
