"""Cross-check against an independent codec: kafka-python's protocol classes.

For every API, version and direction both implement, bytes encoded by one decode with the
other to the same values. kafka-python builds its classes from Kafka's own message JSON, so
a disagreement here is a transcription error in runnel's schemas (or a bug in either codec).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_protocol_support import (
    CASES,
    Case,
    expected,
    from_kafka_python,
    kafka_python_classes,
    struct_values,
    to_kafka_python,
)

from broker.protocol import ApiKey, to_dict
from broker.protocol.decode import decode_struct
from broker.protocol.encode import encode_struct
from broker.protocol.schema import RECORDS, Array, Struct

CROSS_CHECK = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _kafka_python_class(case: Case) -> Any:
    cls = kafka_python_classes().get((case.spec.key, case.is_request))
    # Every API and version runnel serves is in kafka-python 3.0's table: a case without
    # one fails here rather than pass as a skip.
    assert cls is not None and 0 <= case.version <= cls.max_version, (
        f"kafka-python has no class for {case.id}"
    )
    return cls


def _bytes_records(s: Struct, value: Any) -> Any:
    """Records as bytes (kafka-python copies them; runnel returns views)."""
    if not isinstance(value, dict):
        return value
    out = {}
    for f in s.fields:
        v = value.get(f.name)
        if f.type == RECORDS and v is not None:
            v = bytes(v)
        elif isinstance(f.type, Struct) and v is not None:
            v = _bytes_records(f.type, v)
        elif isinstance(f.type, Array) and isinstance(f.type.item, Struct) and v is not None:
            v = [_bytes_records(f.type.item, e) for e in v]
        if f.name in value:
            out[f.name] = v
    return out


def _present_only(case: Case, value: dict[str, Any]) -> dict[str, Any]:
    return _restrict(case.struct, case.version, value)


def _restrict(s: Struct, version: int, value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    out = {}
    for f in s.fields:
        if not f.present(version):
            continue
        v = value[f.name]
        if isinstance(f.type, Struct) and v is not None:
            v = _restrict(f.type, version, v)
        elif isinstance(f.type, Array) and isinstance(f.type.item, Struct) and v is not None:
            v = [_restrict(f.type.item, version, e) for e in v]
        out[f.name] = v
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
@CROSS_CHECK
@given(data=st.data())
def test_ours_decoded_by_kafka_python(case: Case, data: st.DataObject) -> None:
    cls = _kafka_python_class(case)
    value = data.draw(struct_values(case.struct, case.version))
    if case.spec.key == ApiKey.API_VERSIONS and not case.is_request:
        value["error_code"] = 0  # kafka-python reads an error response as v0 (as brokers send)
    body = b"".join(
        bytes(p)  # type: ignore[arg-type]
        for p in encode_struct(case.struct, case.version, case.flexible, value, bytearray())
    )
    theirs = cls.decode(body, version=case.version)
    got = from_kafka_python(case.struct, cls._struct, theirs, case.version)
    want = _present_only(
        case, _bytes_records(case.struct, expected(case.struct, case.version, value))
    )
    assert got == want


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
@CROSS_CHECK
@given(data=st.data())
def test_kafka_python_decoded_by_ours(case: Case, data: st.DataObject) -> None:
    cls = _kafka_python_class(case)
    value = data.draw(struct_values(case.struct, case.version))
    message = to_kafka_python(case.struct, cls._struct, value, case.version, make=cls)
    body = bytes(message.encode(version=case.version))
    ours = decode_struct(case.struct, case.version, case.flexible, memoryview(body))
    got = _present_only(case, _bytes_records(case.struct, to_dict(ours)))
    want = _present_only(
        case, _bytes_records(case.struct, expected(case.struct, case.version, value))
    )
    assert got == want
