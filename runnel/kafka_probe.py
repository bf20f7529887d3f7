"""Ask a broker's Kafka listener which brokers it lists: the last step of "healthy" for
``runnel cluster up``. A broker opens its listener only after it is unfenced and its own
metadata shows it so, and learns of the other brokers' unfencing a moment after the
controller does; clients started right after ``up`` returns must find every broker.
"""

from __future__ import annotations

import socket
import struct

from broker.protocol import ApiKey, ProtocolError, decode_response, encode_request

__all__ = ["listed_brokers"]

METADATA_VERSION = 1  # the oldest served: brokers and the controller id, no topics asked
PROBE_TIMEOUT_S = 2.0
MAX_RESPONSE_BYTES = 1 << 20


def listed_brokers(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> list[int] | None:
    """The broker ids the listener at ``host:port`` lists, or None if it does not answer."""
    request = b"".join(
        bytes(part)  # type: ignore[arg-type]
        for part in encode_request(
            ApiKey.METADATA, METADATA_VERSION, 1, "runnel-up", {"topics": []}
        )
    )
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(request)
            (size,) = struct.unpack(">i", _read(sock, 4))
            if not 0 < size <= MAX_RESPONSE_BYTES:
                return None
            _, response = decode_response(ApiKey.METADATA, METADATA_VERSION, _read(sock, size))
    except (OSError, ProtocolError, struct.error):
        return None
    return sorted(b.node_id for b in response.brokers)


def _read(sock: socket.socket, size: int) -> memoryview:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise OSError("closed")
        data += chunk
    return memoryview(data)
