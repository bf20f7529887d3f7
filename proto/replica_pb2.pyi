from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class UpperBound(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LOG_END: _ClassVar[UpperBound]
    HIGH_WATERMARK: _ClassVar[UpperBound]
LOG_END: UpperBound
HIGH_WATERMARK: UpperBound

class ReadBatchesRequest(_message.Message):
    __slots__ = ("topic", "partition", "topic_id", "start_offset", "end_offset", "upper_bound", "max_batches")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    UPPER_BOUND_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCHES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    topic_id: bytes
    start_offset: int
    end_offset: int
    upper_bound: UpperBound
    max_batches: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., topic_id: _Optional[bytes] = ..., start_offset: _Optional[int] = ..., end_offset: _Optional[int] = ..., upper_bound: _Optional[_Union[UpperBound, str]] = ..., max_batches: _Optional[int] = ...) -> None: ...

class BatchMeta(_message.Message):
    __slots__ = ("base_offset", "last_offset", "leader_epoch", "crc", "size_bytes")
    BASE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CRC_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    base_offset: int
    last_offset: int
    leader_epoch: int
    crc: int
    size_bytes: int
    def __init__(self, base_offset: _Optional[int] = ..., last_offset: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., crc: _Optional[int] = ..., size_bytes: _Optional[int] = ...) -> None: ...

class ReadBatchesChunk(_message.Message):
    __slots__ = ("batches", "broker_id", "log_start_offset", "high_watermark", "log_end_offset", "next_offset", "end_reached", "compacted_below")
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LOG_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    END_REACHED_FIELD_NUMBER: _ClassVar[int]
    COMPACTED_BELOW_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedCompositeFieldContainer[BatchMeta]
    broker_id: int
    log_start_offset: int
    high_watermark: int
    log_end_offset: int
    next_offset: int
    end_reached: bool
    compacted_below: int
    def __init__(self, batches: _Optional[_Iterable[_Union[BatchMeta, _Mapping]]] = ..., broker_id: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., high_watermark: _Optional[int] = ..., log_end_offset: _Optional[int] = ..., next_offset: _Optional[int] = ..., end_reached: _Optional[bool] = ..., compacted_below: _Optional[int] = ...) -> None: ...
