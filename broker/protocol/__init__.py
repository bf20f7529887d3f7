"""runnel's Kafka wire-protocol codec: schemas as data, one compiled encoder and decoder.

How this works. Each API's request and response is described once as data
(``schemas_*.py``, notation in ``schema.py``). On first use of a (struct, version) the
decoder and encoder compile a specialised Python function from that data (``decode.py``,
``encode.py``) and cache it. Decoding returns ``__slots__`` objects with snake_case
attributes and ``records`` as zero-copy ``memoryview`` slices of the frame; any malformed input
raises ``ProtocolError``. Encoding takes nested dicts (or decoded objects) and returns a list
of parts, in which records held in a segment file appear as the ``FileSlice`` itself, ready
for ``os.sendfile``. ``framing.py`` adds the headers and the size prefix.

The package does no I/O. See docs/protocol.md.
"""

from broker.protocol.errors import ErrorCode, ProtocolError
from broker.protocol.framing import (
    RequestHeader,
    decode_request,
    decode_request_header,
    decode_response,
    encode_request,
    encode_response,
)
from broker.protocol.keys import ApiKey
from broker.protocol.schema import ApiSpec
from broker.protocol.specs import API_SPECS
from broker.protocol.values import Value, to_dict
from broker.protocol.wire import FileRegion, Part, parts_size

__all__ = [
    "API_SPECS",
    "ApiKey",
    "ApiSpec",
    "ErrorCode",
    "FileRegion",
    "Part",
    "ProtocolError",
    "RequestHeader",
    "Value",
    "decode_request",
    "decode_request_header",
    "decode_response",
    "encode_request",
    "encode_response",
    "parts_size",
    "to_dict",
]
