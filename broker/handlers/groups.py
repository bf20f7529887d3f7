"""FindCoordinator: runnel has no group coordinator yet (consumer groups come with a later
issue), so every key is answered COORDINATOR_NOT_AVAILABLE, which clients retry. The API is
served rather than left out because librdkafka turns lz4 on only for brokers that advertise
it (its feature map ties lz4 to FindCoordinator), and sends lz4 batches uncompressed
otherwise."""

from __future__ import annotations

from typing import Any

from broker.context import BrokerContext
from broker.handlers.common import Reply
from broker.protocol import ErrorCode, RequestHeader

__all__ = ["find_coordinator"]

NO_COORDINATOR = "runnel has no group or transaction coordinator yet"


def find_coordinator(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    unavailable = {"node_id": -1, "host": "", "port": -1}
    code = ErrorCode.COORDINATOR_NOT_AVAILABLE
    if header.api_version >= 4:
        coordinators = [
            {"key": key, "error_code": code, "error_message": NO_COORDINATOR} | unavailable
            for key in request.coordinator_keys
        ]
        return {"throttle_time_ms": 0, "coordinators": coordinators}
    return {
        "throttle_time_ms": 0,
        "error_code": code,
        "error_message": NO_COORDINATOR,
    } | unavailable
