"""Whole messages: request/response headers, the 4-byte size prefix, and the public codec.

How this works. A request frame (after its int32 size) is a header then a body. Header v1 is
api_key int16, api_version int16, correlation_id int32, client_id (nullable string with an
int16 length); header v2 adds a tagged-field section and is used when the API version is
flexible (client_id stays a non-compact string). A response is correlation_id int32, plus a
tagged section (header v1) when the version is flexible, except ApiVersions, whose responses
always use header v0 so that any client can read them.

``decode_request_header`` reads api_key and api_version first and picks v1 or v2 from
``API_SPECS``. For an API key runnel does not implement, or a version outside its range, it
still returns the header parsed as v1 so the caller can answer UNSUPPORTED_VERSION (a
flexible client's header tags are then left unread: the body is not parsed anyway).

ApiVersions has one more rule, as in Kafka: a broker answers an ApiVersions request of a
version it does not support with a v0 response (``encode_response`` does so), and a client
that cannot parse an ApiVersions response at its version retries it as v0
(``decode_response`` does so).

Bytes after a complete request body are ignored, as Kafka's brokers ignore them:
librdkafka 2.16 sends a Metadata v12 request for all topics with three extra bytes
(apparently the rest of the four bytes it reserves for the topics count, of which a compact
null uses one). Responses, read by
runnel's own clients and tests, must be consumed exactly.

Encoders return a list of parts (see ``wire.Part``) beginning with the size prefix; the first
part is always a bytearray holding the prefix and the header.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

from broker.protocol.decode import DecodeFn, as_view, decode_struct, decode_with, struct_decoder
from broker.protocol.encode import EncodeFn, encode_struct, struct_encoder
from broker.protocol.errors import ProtocolError
from broker.protocol.keys import ApiKey
from broker.protocol.schema import ApiSpec
from broker.protocol.specs import API_SPECS
from broker.protocol.wire import Part, parts_size, read_uvarint

__all__ = [
    "RequestHeader",
    "decode_request",
    "decode_request_header",
    "decode_response",
    "encode_request",
    "encode_response",
]

_REQUEST_HEAD = struct.Struct(">hhih")  # api_key, api_version, correlation_id, client_id len
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_SIZE_PLACEHOLDER = b"\x00\x00\x00\x00"


class RequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    header_size: int  # bytes of the frame taken by the header; the body follows


def _spec(api_key: int, version: int) -> ApiSpec | None:
    spec = API_SPECS.get(api_key)
    return spec if spec is not None and spec.supports(version) else None


class _Served(NamedTuple):
    """What serving one implemented (API, version) needs, looked up once per request."""

    spec: ApiSpec
    flexible: bool
    decode_request: DecodeFn  # the request body's compiled decoder
    encode_response: EncodeFn  # the response body's compiled encoder
    response_tags: bool  # response header v1: a tagged section after the correlation id


_SERVED: dict[tuple[int, int], _Served] = {}  # only implemented versions: bounded


def _served(api_key: int, version: int) -> _Served | None:
    served = _SERVED.get((api_key, version))
    if served is None:
        spec = _spec(api_key, version)
        if spec is None:
            return None
        flexible = spec.is_flexible(version)
        served = _SERVED[(api_key, version)] = _Served(
            spec,
            flexible,
            struct_decoder(spec.request, version, flexible),
            struct_encoder(spec.response, version, flexible),
            flexible and api_key != ApiKey.API_VERSIONS,
        )
    return served


def _skip_tagged_section(buf: memoryview, pos: int) -> int:
    count, pos = read_uvarint(buf, pos)
    if count > len(buf) - pos:
        raise ProtocolError("header: tagged field count exceeds remaining bytes")
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += size
        if pos > len(buf):
            raise ProtocolError("header: tagged field longer than remaining bytes")
    return pos


def decode_request_header(frame: bytes | bytearray | memoryview) -> RequestHeader:
    """The header of a request frame (size prefix already removed). Raises ProtocolError."""
    buf = as_view(frame)
    try:
        api_key, version, correlation_id, n = _REQUEST_HEAD.unpack_from(buf, 0)
        pos = _REQUEST_HEAD.size
        client_id: str | None = None
        if n >= 0:
            if pos + n > len(buf):
                raise ProtocolError("request header: client_id longer than the frame")
            client_id = str(buf[pos : pos + n], "utf-8")
            pos += n
        elif n != -1:
            raise ProtocolError("request header: negative client_id length")
        served = _served(api_key, version)
        if served is not None and served.flexible:
            if buf[pos] == 0:  # the usual header v2: no tagged fields
                pos += 1
            else:
                pos = _skip_tagged_section(buf, pos)
    except (struct.error, IndexError, UnicodeDecodeError) as e:
        raise ProtocolError(f"malformed request header: {e}") from None
    return RequestHeader(api_key, version, correlation_id, client_id, pos)


def decode_request(header: RequestHeader, frame: bytes | bytearray | memoryview) -> Any:
    """The request body after ``header`` in the same frame. Raises ProtocolError, also for an
    API or version runnel does not implement (check ``API_SPECS`` first to answer those)."""
    served = _served(header.api_key, header.api_version)
    if served is None:
        raise ProtocolError(f"unsupported api {header.api_key} v{header.api_version}")
    body = as_view(frame)[header.header_size :]
    return decode_with(served.decode_request, served.spec.request, header.api_version, body, True)


def encode_response(header: RequestHeader, value: Any) -> list[Part]:
    """Size prefix, response header and body for the request ``header`` answers."""
    served = _served(header.api_key, header.api_version)
    if served is None and header.api_key == ApiKey.API_VERSIONS:
        served = _served(ApiKey.API_VERSIONS, 0)
    if served is None:
        raise ValueError(f"runnel does not implement api {header.api_key} v{header.api_version}")
    head = bytearray(_SIZE_PLACEHOLDER)
    head += _I32.pack(header.correlation_id)
    if served.response_tags:
        head.append(0)  # response header v1: no tagged fields
    parts: list[Part] = []
    tail = served.encode_response(value, head, parts)
    if tail:
        parts.append(tail)
    return _sized(head, parts)


def encode_request(
    api_key: int, version: int, correlation_id: int, client_id: str | None, value: Any
) -> list[Part]:
    """Size prefix, request header (v1, or v2 when flexible) and body."""
    spec = _require_spec(api_key, version)
    flexible = spec.is_flexible(version)
    out = bytearray(_SIZE_PLACEHOLDER)
    out += struct.pack(">hhi", api_key, version, correlation_id)
    if client_id is None:
        out += _I16.pack(-1)
    else:
        raw = client_id.encode()
        out += _I16.pack(len(raw))
        out += raw
    if flexible:
        out.append(0)
    return _sized(out, encode_struct(spec.request, version, flexible, value, out))


def decode_response(
    api_key: int, version: int, frame: bytes | bytearray | memoryview
) -> tuple[int, Any]:
    """``(correlation_id, body)`` of a response frame (size prefix removed)."""
    spec = _spec(api_key, version)
    if spec is None:
        raise ProtocolError(f"unsupported api {api_key} v{version}")
    buf = as_view(frame)
    flexible = spec.is_flexible(version)
    try:
        (correlation_id,) = _I32.unpack_from(buf, 0)
        pos = 4
        if flexible and api_key != ApiKey.API_VERSIONS:
            pos = _skip_tagged_section(buf, pos)
    except (struct.error, IndexError) as e:
        raise ProtocolError(f"malformed response header: {e}") from None
    try:
        return correlation_id, decode_struct(spec.response, version, flexible, buf[pos:])
    except ProtocolError:
        if api_key != ApiKey.API_VERSIONS or version == 0:
            raise
        return correlation_id, decode_struct(spec.response, 0, False, buf[pos:])


def _require_spec(api_key: int, version: int) -> ApiSpec:
    spec = _spec(api_key, version)
    if spec is None:
        raise ValueError(f"runnel does not implement api {api_key} v{version}")
    return spec


def _sized(head: bytearray, parts: list[Part]) -> list[Part]:
    """Fill the size prefix at the start of ``head``, which is always ``parts[0]``."""
    _I32.pack_into(head, 0, parts_size(parts) - 4)
    return parts
