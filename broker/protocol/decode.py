"""The one generic decoder: schema + version -> a compiled, bounds-checked function.

How this works. ``struct_decoder(struct, version, flexible)`` generates (once, cached) the
source of ``decode(buf, pos) -> (value, pos)`` for exactly that version: fixed-size runs of
fields are one ``unpack_from``; strings, bytes, records and arrays read their length, check
it against the bytes left *before* slicing or allocating, then read; nested structs call
their own compiled decoder; in flexible versions the tagged section decodes known tags
(each within the byte count its header gave) and skips unknown ones. The result is an
instance of the struct's value class (``values.py``) with absent fields at their defaults.
``records`` come back as a ``memoryview`` of the input buffer: no copy.

``decode_struct`` is the boundary: it runs a compiled decoder over a whole buffer, demands it
be consumed exactly, and turns every low-level failure (``IndexError`` past the end,
``struct.error``, bad UTF-8) into ``ProtocolError``.
"""

from __future__ import annotations

import functools
import struct
import uuid
from collections.abc import Callable
from typing import Any

from broker.protocol.codegen import Source, fixed_runs, fixed_struct, is_fixed, layout, min_size
from broker.protocol.errors import ProtocolError
from broker.protocol.schema import (
    FIXED_FORMATS,
    RECORDS,
    STRING,
    UUID,
    Array,
    Field,
    Struct,
    Versions,
)
from broker.protocol.values import default_expr, value_class
from broker.protocol.wire import fail, read_uvarint, unpack_array

__all__ = ["DecodeFn", "as_view", "decode_struct", "decode_with", "struct_decoder"]

DecodeFn = Callable[[memoryview, int], tuple[Any, int]]

_I16 = struct.Struct(">h").unpack_from
_I32 = struct.Struct(">i").unpack_from
_BASE_NS: dict[str, Any] = {
    "_fail": fail,
    "_uv": read_uvarint,
    "_I16": _I16,
    "_I32": _I32,
    "_UUID": uuid.UUID,
    "_unpack_array": unpack_array,
}


def as_view(data: bytes | bytearray | memoryview) -> memoryview:
    view = data if isinstance(data, memoryview) else memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


def decode_struct(
    s: Struct, version: int, flexible: bool, buf: memoryview, *, trailing_ok: bool = False
) -> Any:
    """Decode all of ``buf`` as ``s`` at ``version``; only ``ProtocolError`` escapes.
    ``trailing_ok``: bytes after a complete message are ignored, as Kafka's brokers ignore
    them in requests (librdkafka 2.16's Metadata v12 for all topics carries three)."""
    return decode_with(struct_decoder(s, version, flexible), s, version, buf, trailing_ok)


def decode_with(
    decode: DecodeFn, s: Struct, version: int, buf: memoryview, trailing_ok: bool
) -> Any:
    """``decode_struct`` with ``s``'s compiled decoder at hand."""
    try:
        value, pos = decode(buf, 0)
    except ProtocolError:
        raise
    except (IndexError, struct.error, UnicodeDecodeError, ValueError, OverflowError) as e:
        raise ProtocolError(f"malformed {s.name} v{version}: {e}") from None
    if pos != len(buf) and not trailing_ok:
        raise ProtocolError(f"{s.name} v{version}: {len(buf) - pos} trailing bytes")
    return value


@functools.cache
def struct_decoder(s: Struct, version: int, flexible: bool) -> DecodeFn:
    src = Source(f"decode {s.name} v{version}")
    src.ns.update(_BASE_NS)
    untagged, tagged = layout(s, version, flexible)
    tag_fns = {f.name: _tagged_decoder(f, version, flexible) for f in tagged}
    src.add(0, "def decode(buf, pos):")
    src.add(1, "end = len(buf)")
    for run in fixed_runs(untagged):
        if is_fixed(run[0]):
            targets = "".join(f"f_{f.name}, " for f in run)
            unpack = src.const(fixed_struct(run).unpack_from, "S")
            src.add(1, f"({targets}) = {unpack}(buf, pos)")
            src.add(1, f"pos += {fixed_struct(run).size}")
        else:
            _read(src, 1, run[0], f"f_{run[0].name}", s, version, flexible)
    for f in tagged:
        src.add(1, f"f_{f.name} = {default_expr(f, src.ns, '_d_')}")
    if flexible:
        _read_tagged_section(src, s, tagged, tag_fns)
    args = [
        f"f_{f.name}" if f.present(version) else default_expr(f, src.ns, "_d_") for f in s.fields
    ]
    src.ns["_C"] = value_class(s)
    src.add(1, f"return _C({', '.join(args)}), pos")
    return src.build("decode")


def _tagged_decoder(f: Field, version: int, flexible: bool) -> DecodeFn:
    src = Source(f"decode tagged {f.name} v{version}")
    src.ns.update(_BASE_NS)
    src.add(0, "def decode(buf, pos):")
    src.add(1, "end = len(buf)")
    _read(src, 1, f, "value", Struct(f.name, ()), version, flexible)
    src.add(1, "return value, pos")
    return src.build("decode")


def _read_tagged_section(
    src: Source, s: Struct, tagged: list[Field], fns: dict[str, DecodeFn]
) -> None:
    src.add(1, "ntags = buf[pos]")
    src.add(1, "pos += 1")
    src.add(1, "if ntags:  # rare: most structs carry no tagged fields")
    src.add(2, "if ntags >= 0x80:")
    src.add(3, "ntags, pos = _uv(buf, pos - 1)")
    src.add(2, "if ntags > end - pos:")
    src.add(3, f"raise _fail('{s.name}: tagged field count exceeds remaining bytes', pos)")
    src.add(2, "for _ in range(ntags):")
    _read_uvarint(src, 3, "tag")
    _read_uvarint(src, 3, "size")
    src.add(3, "stop = pos + size")
    src.add(3, "if stop > end:")
    src.add(4, f"raise _fail('{s.name}: tagged field longer than remaining bytes', pos)")
    keyword = "if"
    for f in tagged:
        fn = src.const(fns[f.name], "T")
        src.add(3, f"{keyword} tag == {f.tag}:")
        src.add(4, f"f_{f.name}, used = {fn}(buf[:stop], pos)")
        src.add(4, "if used != stop:")
        src.add(5, f"raise _fail('{s.name}.{f.name}: tagged field size mismatch', pos)")
        keyword = "elif"
    src.add(3, "pos = stop")


def _read_uvarint(src: Source, ind: int, target: str) -> None:
    src.add(ind, f"{target} = buf[pos]")
    src.add(ind, f"if {target} < 0x80:")
    src.add(ind + 1, "pos += 1")
    src.add(ind, "else:")
    src.add(ind + 1, f"{target}, pos = _uv(buf, pos)")


def _read_length(src: Source, ind: int, n: str, type_: object, flexible: bool) -> None:
    """Into ``n``: the length, -1 for null (compact lengths are stored plus one)."""
    if flexible:
        _read_uvarint(src, ind, n)
        src.add(ind, f"{n} -= 1")
    elif type_ == STRING:
        src.add(ind, f"({n},) = _I16(buf, pos)")
        src.add(ind, "pos += 2")
    else:
        src.add(ind, f"({n},) = _I32(buf, pos)")
        src.add(ind, "pos += 4")


def _read(
    src: Source, ind: int, f: Field, target: str, s: Struct, version: int, flexible: bool
) -> None:
    """Emit code reading one value of ``f`` into ``target``."""
    where = f"{s.name}.{f.name}"
    type_ = f.type
    if isinstance(type_, Struct):
        fn = src.const(struct_decoder(type_, version, flexible), "D")
        src.add(ind, f"{target}, pos = {fn}(buf, pos)")
        return
    if isinstance(type_, str) and type_ in FIXED_FORMATS:
        unpack = src.const(fixed_struct([f]), "S")
        src.add(ind, f"({target},) = {unpack}.unpack_from(buf, pos)")
        src.add(ind, f"pos += {src.ns[unpack].size}")
        return
    if type_ == UUID:
        src.add(ind, "if pos + 16 > end:")
        src.add(ind + 1, f"raise _fail('{where}: truncated uuid', pos)")
        src.add(ind, f"{target} = _UUID(bytes=bytes(buf[pos:pos + 16]))")
        src.add(ind, "pos += 16")
        return
    n = src.var("n")
    _read_length(src, ind, n, type_, flexible)
    src.add(ind, f"if {n} < 0:")
    if version in f.nullable:
        src.add(ind + 1, f"if {n} != -1:")
        src.add(ind + 2, f"raise _fail('{where}: negative length', pos)")
        src.add(ind + 1, f"{target} = None")
    else:
        src.add(ind + 1, f"raise _fail('{where}: null or negative length', pos)")
    src.add(ind, "else:")
    if isinstance(type_, Array):
        _read_array(src, ind + 1, f, type_, n, target, s, version, flexible)
        return
    src.add(ind + 1, f"if pos + {n} > end:")
    src.add(ind + 2, f"raise _fail('{where}: length exceeds remaining bytes', pos)")
    if type_ == STRING:
        src.add(ind + 1, f"{target} = str(buf[pos:pos + {n}], 'utf-8')")
    elif type_ == RECORDS:
        src.add(ind + 1, f"{target} = buf[pos:pos + {n}]")
    else:
        src.add(ind + 1, f"{target} = bytes(buf[pos:pos + {n}])")
    src.add(ind + 1, f"pos += {n}")


def _read_array(
    src: Source,
    ind: int,
    f: Field,
    type_: Array,
    n: str,
    target: str,
    s: Struct,
    version: int,
    flexible: bool,
) -> None:
    item = type_.item
    size = max(1, min_size(item, version, flexible))
    src.add(ind, f"if {n} * {size} > end - pos:")
    src.add(ind + 1, f"raise _fail('{s.name}.{f.name}: array length exceeds remaining bytes', pos)")
    if isinstance(item, str) and item in FIXED_FORMATS:
        src.add(ind, f"{target} = _unpack_array('{FIXED_FORMATS[item]}', {n}, buf, pos)")
        src.add(ind, f"pos += {n} * {size}")
        return
    src.add(ind, f"{target} = []")
    elem = src.var("e")
    src.add(ind, f"for _ in range({n}):")
    item_field = Field(f.name, item, f.versions, Versions(1, 0), None, f.tagged, None)
    _read(src, ind + 1, item_field, elem, s, version, flexible)
    src.add(ind + 1, f"{target}.append({elem})")
