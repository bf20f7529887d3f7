"""Decoded values: one generated ``__slots__`` class per schema struct.

How this works. ``value_class(struct)`` builds (once, cached) a class whose slots are the
struct's snake_case field names, in schema order, across all versions. Its ``__init__`` takes
every field positionally or by keyword; an omitted field gets its schema default (a fresh list
or struct for mutable defaults). The decoder calls the class with every field, so a decoded
object always has every attribute; fields absent from the decoded version hold defaults.

Instances compare equal field by field (records views compare by content), ``repr`` shows the
fields, and ``to_dict()`` turns a value back into nested dicts (the encoder accepts either).
"""

from __future__ import annotations

import functools
from typing import Any

from broker.protocol.schema import Array, Field, Struct

__all__ = ["MISSING", "Value", "default_expr", "to_dict", "value_class"]


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class Value:
    """Base of every generated class (for ``isinstance`` checks and shared methods)."""

    __slots__ = ()
    _fields: tuple[str, ...] = ()

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in self._fields)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._fields)
        return f"{type(self).__name__}({inner})"

    def to_dict(self) -> dict[str, Any]:
        return {n: to_dict(getattr(self, n)) for n in self._fields}


def to_dict(value: Any) -> Any:
    """Nested dicts/lists for a decoded value (leaves, views included, unchanged)."""
    if isinstance(value, Value):
        return value.to_dict()
    if isinstance(value, list):
        return [to_dict(v) for v in value]
    return value


def default_expr(f: Field, ns: dict[str, Any], prefix: str) -> str:
    """Python source for a fresh default of ``f``; constants are bound in ``ns``."""
    if isinstance(f.type, Array) and f.default is not None:
        return "[]"
    if isinstance(f.type, Struct) and f.default is None:
        ns[f"{prefix}{f.name}"] = value_class(f.type)
        return f"{prefix}{f.name}()"
    ns[f"{prefix}{f.name}"] = f.default
    return f"{prefix}{f.name}"


@functools.cache
def value_class(struct: Struct) -> type[Value]:
    names = tuple(f.name for f in struct.fields)
    ns: dict[str, Any] = {"MISSING": MISSING}
    params, body = [], []
    for f in struct.fields:
        default = default_expr(f, ns, "_d_")
        if default.endswith(")") or default == "[]":  # mutable: build one per instance
            params.append(f"{f.name}=MISSING")
            body.append(f"    self.{f.name} = {default} if {f.name} is MISSING else {f.name}")
        else:
            params.append(f"{f.name}={default}")
            body.append(f"    self.{f.name} = {f.name}")
    src = f"def __init__(self, {', '.join(params)}):\n" + "\n".join(body or ["    pass"])
    exec(compile(src, f"<value {struct.name}>", "exec"), ns)
    attrs: dict[str, Any] = {
        "__slots__": names,
        "_fields": names,
        "__match_args__": names,
        "__init__": ns["__init__"],
        "__module__": __name__,
    }
    return type(struct.name, (Value,), attrs)
