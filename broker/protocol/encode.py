"""The one generic encoder: schema + version -> a compiled function writing parts.

How this works. ``struct_encoder(struct, version, flexible)`` generates (once, cached)
``encode(value, out, parts) -> out``. ``value`` is a dict keyed by snake_case field names (a
missing key means the field's default) or any object with those attributes, such as a
decoded value. Fields are appended to the bytearray ``out``; consecutive fixed-size fields
are one ``struct.pack``. Records that live in a file (a ``FileRegion``) or are large are not
copied: ``out`` is closed into ``parts`` after their length prefix, the records become a part
of their own, and a fresh ``out`` is returned to the caller, which keeps writing into it.

In flexible versions each struct ends with its tagged section: a tagged field is written
only when its value differs from the default (a struct-typed one is compared by its encoding
against the encoding of a struct of defaults), in ascending tag order.

Encoding a value that does not fit its schema (a null where none is allowed, an int out of
range) is a programmer error and raises whatever the failing operation raises.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable
from typing import Any

from broker.protocol.codegen import Source, fixed_runs, fixed_struct, is_fixed, layout
from broker.protocol.schema import (
    FIXED_FORMATS,
    RECORDS,
    STRING,
    UUID,
    ZERO_UUID,
    Array,
    Field,
    Struct,
    Versions,
)
from broker.protocol.wire import Part, pack_array, uvarint

__all__ = ["INLINE_RECORDS_MAX_BYTES", "EncodeFn", "encode_struct", "struct_encoder"]

# records up to this size are copied into the current chunk; larger ones become own parts
INLINE_RECORDS_MAX_BYTES = 4 * 1024

EncodeFn = Callable[[Any, bytearray, list[Part]], bytearray]

_BASE_NS: dict[str, Any] = {
    "_uv": uvarint,
    "_I16": struct.Struct(">h").pack,
    "_I32": struct.Struct(">i").pack,
    "_ZERO_UUID_BYTES": ZERO_UUID.bytes,
    "_BYTESLIKE": (bytes, bytearray),
    "_VIEW": memoryview,
    "_INLINE_MAX": INLINE_RECORDS_MAX_BYTES,
    "_pack_array": pack_array,
    "_EMPTY": {},
    "_NULL_ERROR": TypeError,
}


def encode_struct(
    s: Struct, version: int, flexible: bool, value: Any, out: bytearray
) -> list[Part]:
    """Encode ``value`` after the bytes already in ``out``; returns the parts."""
    parts: list[Part] = []
    out = struct_encoder(s, version, flexible)(value, out, parts)
    if out:
        parts.append(out)
    return parts


@functools.cache
def struct_encoder(s: Struct, version: int, flexible: bool) -> EncodeFn:
    src = Source(f"encode {s.name} v{version}")
    src.ns.update(_BASE_NS)
    untagged, tagged = layout(s, version, flexible)
    src.add(0, "def encode(v, out, parts):")
    _fetch_fields(src, untagged + tagged)
    for run in fixed_runs(untagged):
        if is_fixed(run[0]):
            pack = src.const(fixed_struct(run).pack, "S")
            src.add(1, f"out += {pack}({', '.join(f'f_{f.name}' for f in run)})")
        else:
            _write(src, 1, run[0], f"f_{run[0].name}", "out", s, version, flexible)
    if flexible:
        _write_tagged_section(src, tagged, s, version)
    src.add(1, "return out")
    return src.build("encode")


def _fetch_fields(src: Source, fields: list[Field]) -> None:
    """Bind ``f_<name>`` from a dict (missing key = default) or an object's attributes."""
    if not fields:
        return
    defaults = {f.name: src.const(_missing_value(f), "d") for f in fields}
    src.add(1, "if type(v) is dict:")
    for f in fields:
        src.add(2, f"f_{f.name} = v.get('{f.name}', {defaults[f.name]})")
    src.add(1, "else:")
    for f in fields:
        src.add(2, f"f_{f.name} = getattr(v, '{f.name}', {defaults[f.name]})")


def _missing_value(f: Field) -> Any:
    if isinstance(f.type, Array) and f.default is not None:
        return ()
    return f.default  # None for a struct: "all defaults"


def _write_tagged_section(src: Source, tagged: list[Field], s: Struct, version: int) -> None:
    if not tagged:
        src.add(1, "out.append(0)")
        return
    if len(tagged) >= 0x80:
        raise NotImplementedError(f"{s.name}: 128 or more tagged fields")
    src.add(1, "tags = []")
    for f in tagged:
        x = f"f_{f.name}"
        if isinstance(f.type, Struct):
            default_bytes = bytes(struct_encoder(f.type, version, True)({}, bytearray(), []))
            src.add(1, f"if {x} is not None:")
            src.add(2, "t = bytearray()")
            _write(src, 2, f, x, "t", s, version, True)
            src.add(2, f"if t != {src.const(default_bytes, 'b')}:")
            src.add(3, f"tags.append(({f.tag}, t))")
            continue
        if isinstance(f.type, Array):
            cond = f"{x} is not None" if f.default is None else x
        else:
            cond = f"{x} != {src.const(f.default, 'd')}"
        src.add(1, f"if {cond}:")
        src.add(2, "t = bytearray()")
        _write(src, 2, f, x, "t", s, version, True)
        src.add(2, f"tags.append(({f.tag}, t))")
    src.add(1, "out.append(len(tags))  # fewer than 0x80 tagged fields: one varint byte")
    src.add(1, "for tag, t in tags:")
    src.add(2, "out += _uv(tag)")
    src.add(2, "out += _uv(len(t))")
    src.add(2, "out += t")


def _write_length(src: Source, ind: int, out: str, n: str, type_: object, flex: bool) -> None:
    if flex:
        src.add(ind, f"if {n} < 0x7F:")
        src.add(ind + 1, f"{out}.append({n} + 1)")
        src.add(ind, "else:")
        src.add(ind + 1, f"{out} += _uv({n} + 1)")
    elif type_ == STRING:
        src.add(ind, f"{out} += _I16({n})")
    else:
        src.add(ind, f"{out} += _I32({n})")


def _write_null(
    src: Source, ind: int, out: str, f: Field, where: str, version: int, flex: bool
) -> None:
    if version not in f.nullable:
        src.add(ind, f"raise _NULL_ERROR('{where} is not nullable in v{version}')")
    elif flex:
        src.add(ind, f"{out}.append(0)")
    elif f.type == STRING:
        src.add(ind, f"{out} += b'\\xff\\xff'")
    else:
        src.add(ind, f"{out} += b'\\xff\\xff\\xff\\xff'")


def _write(
    src: Source, ind: int, f: Field, x: str, out: str, s: Struct, version: int, flex: bool
) -> None:
    """Emit code appending the value in ``x`` of field ``f`` to ``out``."""
    where = f"{s.name}.{f.name}"
    type_ = f.type
    if isinstance(type_, Struct):
        fn = src.const(struct_encoder(type_, version, flex), "E")
        src.add(ind, f"{out} = {fn}(_EMPTY if {x} is None else {x}, {out}, parts)")
        return
    if isinstance(type_, str) and type_ in FIXED_FORMATS:
        src.add(ind, f"{out} += {src.const(fixed_struct([f]).pack, 'S')}({x})")
        return
    if type_ == UUID:
        src.add(ind, f"{out} += _ZERO_UUID_BYTES if {x} is None else {x}.bytes")
        return
    src.add(ind, f"if {x} is None:")
    _write_null(src, ind + 1, out, f, where, version, flex)
    src.add(ind, "else:")
    ind += 1
    n = src.var("n")
    if isinstance(type_, Array):
        src.add(ind, f"{n} = len({x})")
        _write_length(src, ind, out, n, type_, flex)
        _write_items(src, ind, f, type_, x, out, s, version, flex)
    elif type_ == RECORDS:
        _write_records(src, ind, x, out, n, flex)
    else:
        b = src.var("b")
        src.add(ind, f"{b} = {x}.encode()" if type_ == STRING else f"{b} = {x}")
        src.add(ind, f"{n} = len({b})")
        _write_length(src, ind, out, n, type_, flex)
        src.add(ind, f"{out} += {b}")


def _write_records(src: Source, ind: int, x: str, out: str, n: str, flex: bool) -> None:
    inline = src.var("inline")
    kind = src.var("kind")
    src.add(ind, f"{kind} = type({x})")  # exact types first: isinstance misses are slow
    src.add(ind, f"if {kind} is bytes or {kind} is bytearray or isinstance({x}, _BYTESLIKE):")
    src.add(ind + 1, f"{n} = len({x})")
    src.add(ind + 1, f"{inline} = {n} <= _INLINE_MAX")
    src.add(ind, f"elif {kind} is _VIEW:")
    src.add(ind + 1, f"{n} = {x}.nbytes")
    src.add(ind + 1, f"{inline} = {n} <= _INLINE_MAX")
    src.add(ind, "else:  # a file region: sent with sendfile, never read here")
    src.add(ind + 1, f"{n} = {x}.length")
    src.add(ind + 1, f"{inline} = False")
    _write_length(src, ind, out, n, RECORDS, flex)
    src.add(ind, f"if {inline}:")
    src.add(ind + 1, f"{out} += {x}")
    src.add(ind, "else:")
    src.add(ind + 1, f"parts.append({out})")
    src.add(ind + 1, f"parts.append({x})")
    src.add(ind + 1, f"{out} = bytearray()")


def _write_items(
    src: Source,
    ind: int,
    f: Field,
    type_: Array,
    x: str,
    out: str,
    s: Struct,
    version: int,
    flex: bool,
) -> None:
    item = type_.item
    if isinstance(item, str) and item in FIXED_FORMATS:
        src.add(ind, f"{out} += _pack_array('{FIXED_FORMATS[item]}', {x})")
        return
    elem = src.var("e")
    src.add(ind, f"for {elem} in {x}:")
    item_field = Field(f.name, item, f.versions, Versions(1, 0), None, f.tagged, None)
    _write(src, ind + 1, item_field, elem, out, s, version, flex)
