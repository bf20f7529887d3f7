"""Message schemas as plain data: what the compiler (``decode.py``, ``encode.py``) reads.

How this works. A message is a :class:`Struct`: a name and an ordered tuple of
:class:`Field`. A field has a snake_case name, a type, the version range in which it exists,
the versions in which it may be null, optionally a tag (then it lives in the tagged-field
section of flexible versions instead of in the fixed sequence) and a default. A type is a
primitive name (``INT32``, ``STRING``, ``RECORDS``, ...), a nested :class:`Struct`, or an
:class:`Array` of either. Version ranges are written ``"3+"``, ``"0-12"``, ``"5"`` or
``"none"``.

An :class:`ApiSpec` binds an API key to its request and response structs, the versions runnel
serves, and the first flexible version. In a flexible version strings, bytes, records and
arrays carry an unsigned-varint "length + 1" (0 = null) and every struct ends with a tagged
field section; before it, lengths are int16 (strings) or int32 (bytes, records, arrays) with
-1 = null.

Schemas are immutable and compared by identity, so a struct can key a compile cache.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "BOOL",
    "BYTES",
    "FIXED_FORMATS",
    "FLOAT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "PRIMITIVES",
    "RECORDS",
    "STRING",
    "UINT16",
    "UUID",
    "ZERO_UUID",
    "ApiSpec",
    "Array",
    "Field",
    "FieldType",
    "Struct",
    "Versions",
    "array",
    "field",
    "struct",
    "versions",
]

INT8: Final = "int8"
INT16: Final = "int16"
INT32: Final = "int32"
INT64: Final = "int64"
UINT16: Final = "uint16"
FLOAT64: Final = "float64"
BOOL: Final = "bool"
UUID: Final = "uuid"
STRING: Final = "string"
BYTES: Final = "bytes"
RECORDS: Final = "records"  # nullable bytes holding v2 record batches, kept as a view

# struct module format character of each fixed-size primitive (big-endian on the wire)
FIXED_FORMATS: Final = {
    INT8: "b",
    INT16: "h",
    INT32: "i",
    INT64: "q",
    UINT16: "H",
    FLOAT64: "d",
    BOOL: "?",
}
PRIMITIVES: Final = frozenset({*FIXED_FORMATS, UUID, STRING, BYTES, RECORDS})
ZERO_UUID: Final = uuid.UUID(int=0)
MAX_VERSION: Final = 0x7FFF
_UNSET: Final[Any] = object()


@dataclass(frozen=True, slots=True)
class Versions:
    """An inclusive version range; ``low > high`` is the empty range."""

    low: int
    high: int

    def __contains__(self, version: object) -> bool:
        return isinstance(version, int) and self.low <= version <= self.high


def versions(spec: str) -> Versions:
    """Parse ``"3+"``, ``"0-12"``, ``"5"`` or ``"none"``."""
    if spec == "none":
        return Versions(1, 0)
    if spec.endswith("+"):
        return Versions(int(spec[:-1]), MAX_VERSION)
    low, _, high = spec.partition("-")
    return Versions(int(low), int(high or low))


@dataclass(frozen=True, slots=True, eq=False)
class Struct:
    name: str
    fields: tuple[Field, ...]


@dataclass(frozen=True, slots=True)
class Array:
    item: str | Struct


FieldType = str | Struct | Array


@dataclass(frozen=True, slots=True, eq=False)
class Field:
    name: str
    type: FieldType
    versions: Versions
    nullable: Versions
    tag: int | None
    tagged: Versions
    default: Any  # for a Struct-typed field: None, meaning "a struct of defaults"

    def is_list(self) -> bool:
        return isinstance(self.type, Array)

    def present(self, version: int) -> bool:
        return version in self.versions

    def is_tagged(self, version: int, flexible: bool) -> bool:
        return flexible and self.tag is not None and version in self.tagged


def _implicit_default(type_: FieldType, nullable: Versions) -> Any:
    if isinstance(type_, Array):
        return []
    if isinstance(type_, Struct):
        return None
    if type_ == RECORDS:
        return None
    if type_ == STRING:
        return ""
    if type_ == BYTES:
        return b""
    if type_ == UUID:
        return ZERO_UUID
    if type_ == BOOL:
        return False
    if type_ == FLOAT64:
        return 0.0
    return 0


def field(
    name: str,
    type_: FieldType,
    versions_: str = "0+",
    *,
    nullable: str = "none",
    tag: int | None = None,
    tagged: str | None = None,
    default: Any = _UNSET,
) -> Field:
    """One field. A tagged field gives ``tag`` (its tagged versions default to its versions).

    ``default`` is the value of the field when absent from a version or from the dict being
    encoded; when not given it is 0 / False / "" / b"" / zero uuid / [] / null records.
    """
    if isinstance(type_, str) and type_ not in PRIMITIVES:
        raise ValueError(f"field {name}: unknown type {type_!r}")
    in_versions = versions(versions_)
    nullable_versions = versions(nullable)
    tagged_versions = versions(tagged or versions_) if tag is not None else versions("none")
    if default is _UNSET:
        default = _implicit_default(type_, nullable_versions)
    return Field(name, type_, in_versions, nullable_versions, tag, tagged_versions, default)


def struct(name: str, *fields: Field) -> Struct:
    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        raise ValueError(f"struct {name}: duplicate field names")
    return Struct(name, fields)


def array(item: str | Struct) -> Array:
    return Array(item)


@dataclass(frozen=True, slots=True)
class ApiSpec:
    """One Kafka API as runnel serves it: ``min_version``..``max_version`` are advertised in
    ApiVersions; versions ``>= flexible_from`` use compact encodings and tagged fields."""

    key: int
    name: str
    min_version: int
    max_version: int
    flexible_from: int
    request: Struct
    response: Struct

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version

    def is_flexible(self, version: int) -> bool:
        return version >= self.flexible_from
