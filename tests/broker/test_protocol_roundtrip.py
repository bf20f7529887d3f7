"""Round trips of every API x version x direction, and the framing rules around them."""

from __future__ import annotations

import contextlib
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_protocol_support import CASES, Case, expected, joined, struct_values

from broker.protocol import (
    API_SPECS,
    ApiKey,
    ProtocolError,
    decode_request,
    decode_request_header,
    decode_response,
    encode_request,
    encode_response,
    framing,
    parts_size,
    to_dict,
)
from broker.protocol.decode import decode_struct
from broker.protocol.encode import encode_struct

ROUND_TRIP = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _frame(parts: list[Any]) -> memoryview:
    data = joined(parts)
    (size,) = struct.unpack_from(">i", data)
    assert size == len(data) - 4 == parts_size(parts) - 4
    return memoryview(data)[4:]


def _round_trip(case: Case, value: dict[str, Any], correlation_id: int) -> Any:
    key = case.spec.key
    if case.is_request:
        parts = encode_request(key, case.version, correlation_id, "client-1", value)
        frame = _frame(parts)
        header = decode_request_header(frame)
        assert header[:4] == (key, case.version, correlation_id, "client-1")
        return decode_request(header, frame), parts
    request = encode_request(key, case.version, correlation_id, None, {})
    header = decode_request_header(_frame(request))
    parts = encode_response(header, value)
    got_id, decoded = decode_response(key, case.version, _frame(parts))
    assert got_id == correlation_id
    return decoded, parts


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
@ROUND_TRIP
@given(data=st.data(), correlation_id=st.integers(-(2**31), 2**31 - 1))
def test_every_version_round_trips(case: Case, data: st.DataObject, correlation_id: int) -> None:
    value = data.draw(struct_values(case.struct, case.version))
    decoded, parts = _round_trip(case, value, correlation_id)
    assert to_dict(decoded) == expected(case.struct, case.version, value)
    again, again_parts = _round_trip(case, decoded, correlation_id)  # objects encode too
    assert again == decoded
    assert joined(again_parts) == joined(parts)


def test_decoded_attributes_and_zero_copy_records() -> None:
    value = {
        "acks": -1,
        "timeout_ms": 30_000,
        "topic_data": [{"name": "t", "partition_data": [{"index": 3, "records": b"batch"}]}],
    }
    frame = _frame(encode_request(ApiKey.PRODUCE, 9, 1, "c", value))
    request = decode_request(decode_request_header(frame), frame)
    records = request.topic_data[0].partition_data[0].records
    assert isinstance(records, memoryview) and bytes(records) == b"batch"
    assert records.obj is frame.obj  # a view of the frame, not a copy
    assert request.transactional_id is None and request.acks == -1
    with pytest.raises(AttributeError):
        request.not_a_field = 1  # __slots__


def test_absent_fields_hold_defaults() -> None:
    frame = _frame(encode_request(ApiKey.FETCH, 4, 1, None, {"max_wait_ms": 500}))
    request = decode_request(decode_request_header(frame), frame)
    assert (request.session_epoch, request.rack_id, request.cluster_id) == (-1, "", None)
    assert request.max_bytes == 0x7FFFFFFF
    response = decode_response(ApiKey.FETCH, 12, _frame(_fetch_response(12, {})))[1]
    partition = response.responses[0].partitions[0]
    assert partition.current_leader.leader_id == -1 and partition.snapshot_id.epoch == -1


def _fetch_response(version: int, partition: dict[str, Any]) -> list[Any]:
    header = decode_request_header(_frame(encode_request(ApiKey.FETCH, version, 9, "c", {})))
    partition = {"partition_index": 0, "records": b"r", **partition}
    return encode_response(header, {"responses": [{"topic": "t", "partitions": [partition]}]})


def test_tagged_fields_written_only_when_not_default() -> None:
    plain = joined(_fetch_response(12, {}))
    explicit = joined(_fetch_response(12, {"current_leader": {"leader_id": -1}}))
    assert plain == explicit
    tagged = joined(_fetch_response(12, {"current_leader": {"leader_id": 2, "leader_epoch": 7}}))
    assert len(tagged) == len(plain) + 1 + 1 + 8 + 1  # tag, size, two int32, struct's tags
    decoded = decode_response(ApiKey.FETCH, 12, memoryview(tagged)[4:])[1]
    leader = decoded.responses[0].partitions[0].current_leader
    assert (leader.leader_id, leader.leader_epoch) == (2, 7)


def test_unknown_tagged_fields_are_skipped() -> None:
    spec = API_SPECS[ApiKey.API_VERSIONS]
    body = bytearray(
        encode_struct(spec.request, 3, True, {"client_software_name": "x"}, bytearray())[0]
    )
    assert body[-1] == 0
    body[-1:] = b"\x02" + b"\x09\x03abc" + b"\x20\x00"  # tags 9 and 32, unknown
    decoded = decode_struct(spec.request, 3, True, memoryview(bytes(body)))
    assert decoded.client_software_name == "x"


def test_request_header_v2_keeps_a_non_compact_client_id() -> None:
    parts = encode_request(ApiKey.METADATA, 9, 5, "abc", {"topics": None})
    frame = joined(parts)[4:]
    assert frame[8:13] == b"\x00\x03abc" and frame[13] == 0  # int16 length, then no tags
    assert decode_request_header(frame).header_size == 14


def test_request_header_v2_tagged_fields_are_skipped() -> None:
    body = joined(encode_request(ApiKey.METADATA, 9, 5, "abc", {"topics": None}))[18:]
    head = struct.pack(">hhih", ApiKey.METADATA, 9, 5, 3) + b"abc"
    tags = b"\x02" + b"\x00\x02xy" + b"\x05\x00"  # two tags in the header, unknown
    header = decode_request_header(head + tags + body)
    assert header.header_size == len(head) + len(tags)
    assert decode_request(header, head + tags + body).topics is None


def test_the_served_versions_table_holds_implemented_versions_only() -> None:
    for api_key in range(-3, 80):
        for version in range(-2, 30):
            with contextlib.suppress(ProtocolError):
                decode_request_header(struct.pack(">hhih", api_key, version, 1, -1) + b"\x00")
    implemented = sum(s.max_version - s.min_version + 1 for s in API_SPECS.values())
    assert 0 < len(framing._SERVED) <= implemented


def test_api_versions_response_uses_header_v0_even_when_flexible() -> None:
    header = decode_request_header(_frame(encode_request(ApiKey.API_VERSIONS, 3, 77, "c", {})))
    frame = joined(encode_response(header, {"error_code": 0, "api_keys": []}))[4:]
    assert frame[:4] == struct.pack(">i", 77)
    assert frame[4:6] == b"\x00\x00"  # error code right after the correlation id
    metadata = decode_request_header(_frame(encode_request(ApiKey.METADATA, 9, 78, "c", {})))
    frame = joined(encode_response(metadata, {}))[4:]
    assert frame[4] == 0  # response header v1: its tagged section


@pytest.mark.parametrize(("api_key", "version"), [(ApiKey.JOIN_GROUP, 5), (ApiKey.FETCH, 99)])
def test_unsupported_api_header_is_parsed_as_v1(api_key: int, version: int) -> None:
    frame = struct.pack(">hhih", api_key, version, 42, 3) + b"cli" + b"\x00rest"
    header = decode_request_header(frame)
    assert header == (api_key, version, 42, "cli", 13)
    with pytest.raises(ProtocolError):
        decode_request(header, frame)


def test_null_client_id() -> None:
    header = decode_request_header(struct.pack(">hhih", 18, 0, 1, -1))
    assert header.client_id is None and header.header_size == 10


def test_trailing_bytes_are_ignored_in_requests_only() -> None:
    # librdkafka 2.16's Metadata v12 request for all topics, as captured from
    # confluent-kafka 2.16.1: a null topics array, two false bools, no tags, then 01 00 00
    frame = struct.pack(">hhih", ApiKey.METADATA, 12, 3, 7) + b"rdkafka\x00" + b"\0\0\0\0\1\0\0"
    request = decode_request(decode_request_header(frame), frame)
    assert request.topics is None and request.allow_auto_topic_creation is False
    response = joined(encode_response(decode_request_header(frame), {}))[4:] + b"\x00"
    with pytest.raises(ProtocolError, match="trailing"):
        decode_response(ApiKey.METADATA, 12, response)


def test_api_specs_are_the_served_ranges() -> None:
    ranges = {k: (s.min_version, s.max_version, s.flexible_from) for k, s in API_SPECS.items()}
    assert ranges == {
        0: (3, 10, 9),  # Produce: v10 names the current leader (KIP-951)
        1: (4, 16, 12),  # Fetch: topic ids from v13, node_endpoints from v16 (KIP-951)
        2: (1, 7, 6),
        3: (1, 12, 9),
        18: (0, 3, 3),
        19: (2, 7, 5),
        20: (1, 6, 4),
        21: (0, 2, 2),
        22: (0, 4, 2),
        23: (2, 4, 4),
        32: (1, 4, 4),
        33: (0, 2, 2),
        37: (0, 3, 2),
        43: (0, 2, 2),  # ElectLeaders: librdkafka 2.16 asks up to v2
        44: (0, 1, 1),
        60: (0, 1, 0),
        10: (0, 4, 3),  # FindCoordinator: every key COORDINATOR_NOT_AVAILABLE (no groups yet)
    }


def test_api_versions_of_an_unsupported_version_is_answered_as_v0() -> None:
    frame = struct.pack(">hhih", ApiKey.API_VERSIONS, 9, 5, -1) + b"\x00\x00\x00"
    header = decode_request_header(frame)
    value = {"error_code": 35, "api_keys": [{"api_key": 18}]}
    parts = encode_response(header, value)
    v0 = joined(encode_response(header._replace(api_version=0), value))
    assert joined(parts) == v0
    # a v3 client reading it falls back to v0, as Kafka's clients do
    correlation_id, decoded = decode_response(ApiKey.API_VERSIONS, 3, _frame(parts))
    assert (correlation_id, decoded.error_code, decoded.api_keys[0].api_key) == (5, 35, 18)
