from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Batch(_message.Message):
    __slots__ = ("base_offset", "last_offset", "epoch", "data", "is_control")
    BASE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    IS_CONTROL_FIELD_NUMBER: _ClassVar[int]
    base_offset: int
    last_offset: int
    epoch: int
    data: bytes
    is_control: bool
    def __init__(self, base_offset: _Optional[int] = ..., last_offset: _Optional[int] = ..., epoch: _Optional[int] = ..., data: _Optional[bytes] = ..., is_control: _Optional[bool] = ...) -> None: ...

class SnapshotId(_message.Message):
    __slots__ = ("end_offset", "epoch")
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    end_offset: int
    epoch: int
    def __init__(self, end_offset: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class VoteRequest(_message.Message):
    __slots__ = ("epoch", "candidate_id", "last_epoch", "last_epoch_end_offset", "pre_vote")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_EPOCH_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PRE_VOTE_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    candidate_id: int
    last_epoch: int
    last_epoch_end_offset: int
    pre_vote: bool
    def __init__(self, epoch: _Optional[int] = ..., candidate_id: _Optional[int] = ..., last_epoch: _Optional[int] = ..., last_epoch_end_offset: _Optional[int] = ..., pre_vote: _Optional[bool] = ...) -> None: ...

class VoteResponse(_message.Message):
    __slots__ = ("epoch", "granted", "pre_vote", "leader_id")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    GRANTED_FIELD_NUMBER: _ClassVar[int]
    PRE_VOTE_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    granted: bool
    pre_vote: bool
    leader_id: int
    def __init__(self, epoch: _Optional[int] = ..., granted: _Optional[bool] = ..., pre_vote: _Optional[bool] = ..., leader_id: _Optional[int] = ...) -> None: ...

class BeginQuorumEpochRequest(_message.Message):
    __slots__ = ("epoch", "leader_id")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    leader_id: int
    def __init__(self, epoch: _Optional[int] = ..., leader_id: _Optional[int] = ...) -> None: ...

class BeginQuorumEpochResponse(_message.Message):
    __slots__ = ("epoch",)
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    def __init__(self, epoch: _Optional[int] = ...) -> None: ...

class EndQuorumEpochRequest(_message.Message):
    __slots__ = ("epoch", "leader_id", "preferred_successors")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_SUCCESSORS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    leader_id: int
    preferred_successors: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, epoch: _Optional[int] = ..., leader_id: _Optional[int] = ..., preferred_successors: _Optional[_Iterable[int]] = ...) -> None: ...

class EndQuorumEpochResponse(_message.Message):
    __slots__ = ("epoch",)
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    def __init__(self, epoch: _Optional[int] = ...) -> None: ...

class FetchRequest(_message.Message):
    __slots__ = ("epoch", "replica_id", "fetch_offset", "last_fetched_epoch", "max_wait_ms")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    FETCH_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_FETCHED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    replica_id: int
    fetch_offset: int
    last_fetched_epoch: int
    max_wait_ms: int
    def __init__(self, epoch: _Optional[int] = ..., replica_id: _Optional[int] = ..., fetch_offset: _Optional[int] = ..., last_fetched_epoch: _Optional[int] = ..., max_wait_ms: _Optional[int] = ...) -> None: ...

class DivergingEpoch(_message.Message):
    __slots__ = ("epoch", "end_offset")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    end_offset: int
    def __init__(self, epoch: _Optional[int] = ..., end_offset: _Optional[int] = ...) -> None: ...

class FetchResponse(_message.Message):
    __slots__ = ("epoch", "leader_id", "high_watermark", "log_start_offset", "batches", "diverging", "snapshot_id", "read_from", "read_max_bytes", "fetch_offset", "last_fetched_epoch")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    HIGH_WATERMARK_FIELD_NUMBER: _ClassVar[int]
    LOG_START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    DIVERGING_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    READ_FROM_FIELD_NUMBER: _ClassVar[int]
    READ_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    FETCH_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAST_FETCHED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    leader_id: int
    high_watermark: int
    log_start_offset: int
    batches: _containers.RepeatedCompositeFieldContainer[Batch]
    diverging: DivergingEpoch
    snapshot_id: SnapshotId
    read_from: int
    read_max_bytes: int
    fetch_offset: int
    last_fetched_epoch: int
    def __init__(self, epoch: _Optional[int] = ..., leader_id: _Optional[int] = ..., high_watermark: _Optional[int] = ..., log_start_offset: _Optional[int] = ..., batches: _Optional[_Iterable[_Union[Batch, _Mapping]]] = ..., diverging: _Optional[_Union[DivergingEpoch, _Mapping]] = ..., snapshot_id: _Optional[_Union[SnapshotId, _Mapping]] = ..., read_from: _Optional[int] = ..., read_max_bytes: _Optional[int] = ..., fetch_offset: _Optional[int] = ..., last_fetched_epoch: _Optional[int] = ...) -> None: ...

class FetchSnapshotRequest(_message.Message):
    __slots__ = ("epoch", "replica_id", "snapshot_id", "position", "max_bytes")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    replica_id: int
    snapshot_id: SnapshotId
    position: int
    max_bytes: int
    def __init__(self, epoch: _Optional[int] = ..., replica_id: _Optional[int] = ..., snapshot_id: _Optional[_Union[SnapshotId, _Mapping]] = ..., position: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class FetchSnapshotResponse(_message.Message):
    __slots__ = ("epoch", "leader_id", "snapshot_id", "position", "size", "chunk", "read_position", "read_max_bytes", "missing")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    READ_POSITION_FIELD_NUMBER: _ClassVar[int]
    READ_MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    leader_id: int
    snapshot_id: SnapshotId
    position: int
    size: int
    chunk: bytes
    read_position: int
    read_max_bytes: int
    missing: bool
    def __init__(self, epoch: _Optional[int] = ..., leader_id: _Optional[int] = ..., snapshot_id: _Optional[_Union[SnapshotId, _Mapping]] = ..., position: _Optional[int] = ..., size: _Optional[int] = ..., chunk: _Optional[bytes] = ..., read_position: _Optional[int] = ..., read_max_bytes: _Optional[int] = ..., missing: _Optional[bool] = ...) -> None: ...

class Envelope(_message.Message):
    __slots__ = ("source", "destination", "vote_request", "vote_response", "begin_quorum_epoch_request", "begin_quorum_epoch_response", "end_quorum_epoch_request", "end_quorum_epoch_response", "fetch_request", "fetch_response", "fetch_snapshot_request", "fetch_snapshot_response", "reply_to")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DESTINATION_FIELD_NUMBER: _ClassVar[int]
    VOTE_REQUEST_FIELD_NUMBER: _ClassVar[int]
    VOTE_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    BEGIN_QUORUM_EPOCH_REQUEST_FIELD_NUMBER: _ClassVar[int]
    BEGIN_QUORUM_EPOCH_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    END_QUORUM_EPOCH_REQUEST_FIELD_NUMBER: _ClassVar[int]
    END_QUORUM_EPOCH_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    FETCH_REQUEST_FIELD_NUMBER: _ClassVar[int]
    FETCH_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    FETCH_SNAPSHOT_REQUEST_FIELD_NUMBER: _ClassVar[int]
    FETCH_SNAPSHOT_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    REPLY_TO_FIELD_NUMBER: _ClassVar[int]
    source: int
    destination: int
    vote_request: VoteRequest
    vote_response: VoteResponse
    begin_quorum_epoch_request: BeginQuorumEpochRequest
    begin_quorum_epoch_response: BeginQuorumEpochResponse
    end_quorum_epoch_request: EndQuorumEpochRequest
    end_quorum_epoch_response: EndQuorumEpochResponse
    fetch_request: FetchRequest
    fetch_response: FetchResponse
    fetch_snapshot_request: FetchSnapshotRequest
    fetch_snapshot_response: FetchSnapshotResponse
    reply_to: str
    def __init__(self, source: _Optional[int] = ..., destination: _Optional[int] = ..., vote_request: _Optional[_Union[VoteRequest, _Mapping]] = ..., vote_response: _Optional[_Union[VoteResponse, _Mapping]] = ..., begin_quorum_epoch_request: _Optional[_Union[BeginQuorumEpochRequest, _Mapping]] = ..., begin_quorum_epoch_response: _Optional[_Union[BeginQuorumEpochResponse, _Mapping]] = ..., end_quorum_epoch_request: _Optional[_Union[EndQuorumEpochRequest, _Mapping]] = ..., end_quorum_epoch_response: _Optional[_Union[EndQuorumEpochResponse, _Mapping]] = ..., fetch_request: _Optional[_Union[FetchRequest, _Mapping]] = ..., fetch_response: _Optional[_Union[FetchResponse, _Mapping]] = ..., fetch_snapshot_request: _Optional[_Union[FetchSnapshotRequest, _Mapping]] = ..., fetch_snapshot_response: _Optional[_Union[FetchSnapshotResponse, _Mapping]] = ..., reply_to: _Optional[str] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
