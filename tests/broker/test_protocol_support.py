"""Shared by the protocol tests (holds no tests itself): every (API, version, direction)
case, Hypothesis strategies that build values from the schemas, the value a decode must
return for a given input, and adapters to kafka-python's protocol classes."""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from typing import Any, NamedTuple

from hypothesis import strategies as st

from broker.protocol import API_SPECS, ApiSpec, to_dict
from broker.protocol.schema import (
    BOOL,
    BYTES,
    FLOAT64,
    INT8,
    INT16,
    INT32,
    INT64,
    RECORDS,
    STRING,
    UINT16,
    UUID,
    ZERO_UUID,
    Array,
    Field,
    FieldType,
    Struct,
)
from broker.protocol.values import value_class

_INT_RANGES = {
    INT8: (-(2**7), 2**7 - 1),
    INT16: (-(2**15), 2**15 - 1),
    INT32: (-(2**31), 2**31 - 1),
    INT64: (-(2**63), 2**63 - 1),
    UINT16: (0, 2**16 - 1),
}


class Case(NamedTuple):
    spec: ApiSpec
    version: int
    is_request: bool

    @property
    def struct(self) -> Struct:
        return self.spec.request if self.is_request else self.spec.response

    @property
    def flexible(self) -> bool:
        return self.spec.is_flexible(self.version)

    @property
    def id(self) -> str:
        kind = "request" if self.is_request else "response"
        return f"{self.spec.name}-v{self.version}-{kind}"


CASES = [
    Case(spec, version, is_request)
    for spec in API_SPECS.values()
    for version in range(spec.min_version, spec.max_version + 1)
    for is_request in (True, False)
]


def _primitive(type_: str) -> st.SearchStrategy[Any]:
    if type_ in _INT_RANGES:
        low, high = _INT_RANGES[type_]
        return st.integers(low, high)
    return {
        BOOL: st.booleans(),
        FLOAT64: st.floats(allow_nan=False),
        UUID: st.uuids(),
        STRING: st.text(max_size=8),
        BYTES: st.binary(max_size=8),
        RECORDS: st.binary(max_size=40),
    }[type_]


def _type(type_: FieldType, version: int) -> st.SearchStrategy[Any]:
    if isinstance(type_, Struct):
        return struct_values(type_, version)
    if isinstance(type_, Array):
        return st.lists(_type(type_.item, version), max_size=3)
    return _primitive(type_)


@functools.cache
def struct_values(s: Struct, version: int) -> st.SearchStrategy[dict[str, Any]]:
    """Dicts with every field present in ``version`` (null only where nullable)."""
    strategies = {}
    for f in s.fields:
        if f.present(version):
            base = _type(f.type, version)
            strategies[f.name] = st.none() | base if version in f.nullable else base
    return st.fixed_dictionaries(strategies)


def expected(s: Struct, version: int, value: Any) -> dict[str, Any]:
    """What decoding the encoding of ``value`` must give, as nested dicts."""
    defaults = value_class(s)()
    out = {}
    for f in s.fields:
        if f.present(version) and f.name in value:
            out[f.name] = _expected_field(f, version, value[f.name])
        else:
            out[f.name] = to_dict(getattr(defaults, f.name))
    return out


def _expected_field(f: Field, version: int, value: Any) -> Any:
    if value is None:
        return None
    if isinstance(f.type, Struct):
        return expected(f.type, version, value)
    if isinstance(f.type, Array) and isinstance(f.type.item, Struct):
        return [expected(f.type.item, version, v) for v in value]
    return value


# --- kafka-python adapters -------------------------------------------------------------


@functools.cache
def kafka_python_classes() -> dict[tuple[int, bool], Any]:
    """kafka-python's ApiMessage subclasses, by (api key, is request)."""
    from kafka.protocol.api_message import ApiMessage

    found: dict[tuple[int, bool], Any] = {}
    for group in ("producer", "consumer", "metadata", "admin"):
        package = importlib.import_module(f"kafka.protocol.{group}")
        for info in pkgutil.iter_modules(package.__path__):
            module = importlib.import_module(f"{package.__name__}.{info.name}")
            for obj in vars(module).values():
                is_message = inspect.isclass(obj) and issubclass(obj, ApiMessage)
                if is_message and obj.__module__ == module.__name__:
                    found[(obj.API_KEY, obj.type == "request")] = obj
    return found


def norm(name: str) -> str:
    """kafka-python and runnel spell names alike up to case and underscores."""
    return name.replace("_", "").lower()


# kafka-python renames Metadata's authorized-operations ints and decodes them as bit sets
_BITFIELD_NAMES = {"authorizedoperations"}
_NO_AUTHORIZED_OPERATIONS = -(2**31)


def _kp_fields(kp_field: Any, version: int) -> dict[str, Any]:
    return {norm(f.name): f for f in kp_field.fields.values() if f.for_version_q(version)}


def _ours_by_norm(s: Struct, version: int) -> dict[str, Field]:
    return {norm(f.name): f for f in s.fields if f.present(version)}


def _match(s: Struct, kp_fields: dict[str, Any], version: int) -> list[tuple[Field, Any]]:
    ours = _ours_by_norm(s, version)
    pairs = []
    for key, kp_field in kp_fields.items():
        mine = ours.get(key)
        if mine is None and key in _BITFIELD_NAMES:
            mine = next(f for k, f in ours.items() if k.endswith(key))
        assert mine is not None, f"{s.name}: kafka-python field {kp_field.name} unknown"
        pairs.append((mine, kp_field))
    assert len(pairs) == len(ours), f"{s.name} v{version}: field sets differ"
    return pairs


def from_kafka_python(s: Struct, kp_struct: Any, obj: Any, version: int) -> dict[str, Any]:
    """A kafka-python decoded object as runnel's nested dict (fields of ``version`` only)."""
    out = {}
    for mine, kp_field in _match(s, _kp_fields(kp_struct, version), version):
        out[mine.name] = _from_kp_value(mine, kp_field, getattr(obj, kp_field.name), version)
    return out


def _from_kp_value(mine: Field, kp_field: Any, value: Any, version: int) -> Any:
    if norm(kp_field.name) in _BITFIELD_NAMES:
        if value is None:
            return _NO_AUTHORIZED_OPERATIONS
        bits = sum(1 << b for b in value)
        return bits - 2**32 if bits >= 2**31 else bits
    if mine.type == UUID and value is None:
        return ZERO_UUID
    if value is None:
        return None
    if isinstance(mine.type, Struct):
        return from_kafka_python(mine.type, kp_field, value, version)
    if isinstance(mine.type, Array) and isinstance(mine.type.item, Struct):
        item = mine.type.item
        return [from_kafka_python(item, kp_field, v, version) for v in value]
    return value


def to_kafka_python(
    s: Struct, kp_struct: Any, value: dict[str, Any], version: int, make: Any = None
) -> Any:
    """runnel's dict as a kafka-python object of ``kp_struct``, built by ``make`` (the
    message class at top level, the field's data class below)."""
    kwargs = {}
    for mine, kp_field in _match(s, _kp_fields(kp_struct, version), version):
        kwargs[kp_field.name] = _to_kp_value(mine, kp_field, value[mine.name], version)
    return (make or kp_struct)(version=version, **kwargs)


def _to_kp_value(mine: Field, kp_field: Any, value: Any, version: int) -> Any:
    if norm(kp_field.name) in _BITFIELD_NAMES:
        if value == _NO_AUTHORIZED_OPERATIONS:
            return None
        return {b for b in range(32) if (value & 0xFFFFFFFF) >> b & 1}
    if value is None:
        return None
    if isinstance(mine.type, Struct):
        return to_kafka_python(mine.type, kp_field, value, version)
    if isinstance(mine.type, Array) and isinstance(mine.type.item, Struct):
        item = mine.type.item
        return [to_kafka_python(item, kp_field, v, version) for v in value]
    return value


def joined(parts: list[Any]) -> bytes:
    """The bytes a list of encoded parts puts on the wire (file regions read)."""
    chunks = []
    for part in parts:
        chunks.append(
            bytes(part) if isinstance(part, bytes | bytearray | memoryview) else part.read()
        )
    return b"".join(chunks)
