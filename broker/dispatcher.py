"""The Kafka request dispatcher: the listener's ``RequestHandler``.

How this works. For each frame the listener hands over, the request header is decoded, the
API and version checked against what ApiVersions advertises, the body decoded and the API's
handler (``broker/handlers``) called; its reply, ready or awaitable, is encoded with the
response header of the request's version. Nothing decoded refers to the frame once the
handler has returned (``frames_in_flight``). A frame that does not decode raises
``ProtocolError`` and the listener closes that connection (it logs why). An API or version
runnel does not serve is answered UNSUPPORTED_VERSION: for ApiVersions with a version 0 body
that lists what is supported (KIP-511, so the client can retry with a version it shares), for
any other API with the correlation id and the error code alone, since no schema exists for
the version asked. Produce v0-v2 are advertised but not served (``ADVERTISED_MIN_VERSION``):
such a request closes the connection, as Apache Kafka 4.0 does.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import struct
from collections.abc import Awaitable, Mapping
from typing import Any, cast

from broker.context import BrokerContext
from broker.handlers import HANDLERS
from broker.handlers.common import Handler, then
from broker.handlers.metadata import ADVERTISED_MIN_VERSION, supported_api_versions
from broker.protocol import (
    API_SPECS,
    ApiKey,
    ErrorCode,
    RequestHeader,
    decode_request,
    decode_request_header,
    encode_response,
)
from broker.server import CloseConnection, ConnectionInfo, Part

__all__ = ["KafkaDispatcher"]

_log = logging.getLogger(__name__)
_UNSUPPORTED = struct.Struct(">iih")  # size, correlation id, error code


class KafkaDispatcher:
    """Decodes, routes and encodes; one per broker, shared by every connection."""

    # Done with a frame when ``handle`` returns (the listener reuses its memory while the
    # request waits, as Kafka releases a request's buffer when its handler returns): the
    # decoder copies every field but ``records``, which only Produce requests carry, and
    # Produce appends them before it returns (acks=-1 then waits for the high watermark).
    frames_in_flight = False

    def __init__(
        self, context: BrokerContext, handlers: Mapping[int, Handler] | None = None
    ) -> None:
        self.context = context
        self.handlers = dict(HANDLERS if handlers is None else handlers)
        self.requests_by_api: dict[int, int] = {}
        self.unsupported_requests = 0

    def handle(
        self, frame: memoryview, connection: ConnectionInfo
    ) -> list[Part] | Awaitable[list[Part] | None] | None:
        header = decode_request_header(frame)
        spec = API_SPECS.get(header.api_key)
        handler = self.handlers.get(header.api_key)
        if spec is None or handler is None or not spec.supports(header.api_version):
            if spec is not None and _advertised_only(header.api_key, header.api_version):
                raise CloseConnection(
                    f"{spec.name} v{header.api_version} (message format v0/v1) is not supported"
                )
            return self._unsupported(header, connection)
        self.requests_by_api[header.api_key] = self.requests_by_api.get(header.api_key, 0) + 1
        request = decode_request(header, frame)
        reply = handler(self.context, header, request)
        if reply is None or isinstance(reply, dict):
            return _encode(header, reply)
        # Chained, so that cancelling the answer (its connection closed) reaches the reply;
        # a coroutine runs as a task from now, so that a cancel before its first step closes
        # it rather than dropping it unawaited (Python warns: "was never awaited").
        return then(asyncio.ensure_future(reply), functools.partial(_encode, header))

    def _unsupported(self, header: RequestHeader, connection: ConnectionInfo) -> list[Part]:
        self.unsupported_requests += 1
        # A client asking for a newer ApiVersions than ours is the normal negotiation
        # (KIP-511); anything else unsupported is worth an operator's attention.
        level = logging.DEBUG if header.api_key == ApiKey.API_VERSIONS else logging.WARNING
        _log.log(
            level,
            "unsupported request api_key=%d api_version=%d client_id=%r peer=%s",
            header.api_key,
            header.api_version,
            header.client_id,
            connection.peer,
        )
        if header.api_key == ApiKey.API_VERSIONS:
            v0 = header._replace(api_version=0)
            body = {
                "error_code": ErrorCode.UNSUPPORTED_VERSION,
                "api_keys": supported_api_versions(),
            }
            return _encode(v0, body) or []
        return [_UNSUPPORTED.pack(6, header.correlation_id, ErrorCode.UNSUPPORTED_VERSION)]


def _advertised_only(api_key: int, version: int) -> bool:
    """Advertised in ApiVersions below what is served (Produce v0-v2)."""
    served_from = API_SPECS[api_key].min_version
    return ADVERTISED_MIN_VERSION.get(api_key, served_from) <= version < served_from


def _encode(header: RequestHeader, value: dict[str, Any] | None) -> list[Part] | None:
    # The codec's file parts are whatever it was given: the handlers give FileSlices.
    return None if value is None else cast(list[Part], encode_response(header, value))
