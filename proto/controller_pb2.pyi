from proto import metadata_pb2 as _metadata_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NONE: _ClassVar[ErrorCode]
    UNKNOWN_SERVER_ERROR: _ClassVar[ErrorCode]
    UNKNOWN_TOPIC_OR_PARTITION: _ClassVar[ErrorCode]
    REQUEST_TIMED_OUT: _ClassVar[ErrorCode]
    INVALID_TOPIC_EXCEPTION: _ClassVar[ErrorCode]
    TOPIC_ALREADY_EXISTS: _ClassVar[ErrorCode]
    INVALID_PARTITIONS: _ClassVar[ErrorCode]
    INVALID_REPLICATION_FACTOR: _ClassVar[ErrorCode]
    INVALID_REPLICA_ASSIGNMENT: _ClassVar[ErrorCode]
    INVALID_CONFIG: _ClassVar[ErrorCode]
    NOT_CONTROLLER: _ClassVar[ErrorCode]
    INVALID_REQUEST: _ClassVar[ErrorCode]
    POLICY_VIOLATION: _ClassVar[ErrorCode]
    FENCED_LEADER_EPOCH: _ClassVar[ErrorCode]
    STALE_BROKER_EPOCH: _ClassVar[ErrorCode]
    PREFERRED_LEADER_NOT_AVAILABLE: _ClassVar[ErrorCode]
    ELIGIBLE_LEADERS_NOT_AVAILABLE: _ClassVar[ErrorCode]
    ELECTION_NOT_NEEDED: _ClassVar[ErrorCode]
    DUPLICATE_BROKER_REGISTRATION: _ClassVar[ErrorCode]
    BROKER_ID_NOT_REGISTERED: _ClassVar[ErrorCode]
    NEW_LEADER_ELECTED: _ClassVar[ErrorCode]
    INELIGIBLE_REPLICA: _ClassVar[ErrorCode]
    INVALID_UPDATE_VERSION: _ClassVar[ErrorCode]
    UNKNOWN_TOPIC_ID: _ClassVar[ErrorCode]

class ElectionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PREFERRED: _ClassVar[ElectionType]
    UNCLEAN: _ClassVar[ElectionType]

class AlterConfigOp(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SET: _ClassVar[AlterConfigOp]
    DELETE: _ClassVar[AlterConfigOp]
    APPEND: _ClassVar[AlterConfigOp]
    SUBTRACT: _ClassVar[AlterConfigOp]
NONE: ErrorCode
UNKNOWN_SERVER_ERROR: ErrorCode
UNKNOWN_TOPIC_OR_PARTITION: ErrorCode
REQUEST_TIMED_OUT: ErrorCode
INVALID_TOPIC_EXCEPTION: ErrorCode
TOPIC_ALREADY_EXISTS: ErrorCode
INVALID_PARTITIONS: ErrorCode
INVALID_REPLICATION_FACTOR: ErrorCode
INVALID_REPLICA_ASSIGNMENT: ErrorCode
INVALID_CONFIG: ErrorCode
NOT_CONTROLLER: ErrorCode
INVALID_REQUEST: ErrorCode
POLICY_VIOLATION: ErrorCode
FENCED_LEADER_EPOCH: ErrorCode
STALE_BROKER_EPOCH: ErrorCode
PREFERRED_LEADER_NOT_AVAILABLE: ErrorCode
ELIGIBLE_LEADERS_NOT_AVAILABLE: ErrorCode
ELECTION_NOT_NEEDED: ErrorCode
DUPLICATE_BROKER_REGISTRATION: ErrorCode
BROKER_ID_NOT_REGISTERED: ErrorCode
NEW_LEADER_ELECTED: ErrorCode
INELIGIBLE_REPLICA: ErrorCode
INVALID_UPDATE_VERSION: ErrorCode
UNKNOWN_TOPIC_ID: ErrorCode
PREFERRED: ElectionType
UNCLEAN: ElectionType
SET: AlterConfigOp
DELETE: AlterConfigOp
APPEND: AlterConfigOp
SUBTRACT: AlterConfigOp

class ResponseHeader(_message.Message):
    __slots__ = ("error", "message", "controller_id", "controller_address")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    error: ErrorCode
    message: str
    controller_id: int
    controller_address: str
    def __init__(self, error: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ..., controller_id: _Optional[int] = ..., controller_address: _Optional[str] = ...) -> None: ...

class RegisterBrokerRequest(_message.Message):
    __slots__ = ("broker_id", "incarnation_id", "listeners", "rack")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_ID_FIELD_NUMBER: _ClassVar[int]
    LISTENERS_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    incarnation_id: bytes
    listeners: _containers.RepeatedCompositeFieldContainer[_metadata_pb2.Listener]
    rack: str
    def __init__(self, broker_id: _Optional[int] = ..., incarnation_id: _Optional[bytes] = ..., listeners: _Optional[_Iterable[_Union[_metadata_pb2.Listener, _Mapping]]] = ..., rack: _Optional[str] = ...) -> None: ...

class RegisterBrokerResponse(_message.Message):
    __slots__ = ("header", "broker_epoch")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    broker_epoch: int
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., broker_epoch: _Optional[int] = ...) -> None: ...

class BrokerHeartbeatRequest(_message.Message):
    __slots__ = ("broker_id", "broker_epoch", "metadata_offset", "want_fence", "want_shutdown")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    METADATA_OFFSET_FIELD_NUMBER: _ClassVar[int]
    WANT_FENCE_FIELD_NUMBER: _ClassVar[int]
    WANT_SHUTDOWN_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    broker_epoch: int
    metadata_offset: int
    want_fence: bool
    want_shutdown: bool
    def __init__(self, broker_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ..., metadata_offset: _Optional[int] = ..., want_fence: _Optional[bool] = ..., want_shutdown: _Optional[bool] = ...) -> None: ...

class BrokerHeartbeatResponse(_message.Message):
    __slots__ = ("header", "is_caught_up", "is_fenced", "should_shut_down")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    IS_CAUGHT_UP_FIELD_NUMBER: _ClassVar[int]
    IS_FENCED_FIELD_NUMBER: _ClassVar[int]
    SHOULD_SHUT_DOWN_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    is_caught_up: bool
    is_fenced: bool
    should_shut_down: bool
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., is_caught_up: _Optional[bool] = ..., is_fenced: _Optional[bool] = ..., should_shut_down: _Optional[bool] = ...) -> None: ...

class ConfigEntry(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class CreatableTopic(_message.Message):
    __slots__ = ("name", "num_partitions", "replication_factor", "configs")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUM_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    num_partitions: int
    replication_factor: int
    configs: _containers.RepeatedCompositeFieldContainer[ConfigEntry]
    def __init__(self, name: _Optional[str] = ..., num_partitions: _Optional[int] = ..., replication_factor: _Optional[int] = ..., configs: _Optional[_Iterable[_Union[ConfigEntry, _Mapping]]] = ...) -> None: ...

class CreateTopicsRequest(_message.Message):
    __slots__ = ("topics", "validate_only")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[CreatableTopic]
    validate_only: bool
    def __init__(self, topics: _Optional[_Iterable[_Union[CreatableTopic, _Mapping]]] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class CreatableTopicResult(_message.Message):
    __slots__ = ("name", "error", "message", "topic_id", "num_partitions", "replication_factor")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    name: str
    error: ErrorCode
    message: str
    topic_id: bytes
    num_partitions: int
    replication_factor: int
    def __init__(self, name: _Optional[str] = ..., error: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ..., topic_id: _Optional[bytes] = ..., num_partitions: _Optional[int] = ..., replication_factor: _Optional[int] = ...) -> None: ...

class CreateTopicsResponse(_message.Message):
    __slots__ = ("header", "topics")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    topics: _containers.RepeatedCompositeFieldContainer[CreatableTopicResult]
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., topics: _Optional[_Iterable[_Union[CreatableTopicResult, _Mapping]]] = ...) -> None: ...

class DeleteTopicsRequest(_message.Message):
    __slots__ = ("names", "topic_ids")
    class TopicIdsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    NAMES_FIELD_NUMBER: _ClassVar[int]
    TOPIC_IDS_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    topic_ids: _containers.ScalarMap[str, bytes]
    def __init__(self, names: _Optional[_Iterable[str]] = ..., topic_ids: _Optional[_Mapping[str, bytes]] = ...) -> None: ...

class TopicResult(_message.Message):
    __slots__ = ("name", "error", "message", "topic_id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    error: ErrorCode
    message: str
    topic_id: bytes
    def __init__(self, name: _Optional[str] = ..., error: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ..., topic_id: _Optional[bytes] = ...) -> None: ...

class DeleteTopicsResponse(_message.Message):
    __slots__ = ("header", "topics")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    topics: _containers.RepeatedCompositeFieldContainer[TopicResult]
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., topics: _Optional[_Iterable[_Union[TopicResult, _Mapping]]] = ...) -> None: ...

class CreatePartitionsTopic(_message.Message):
    __slots__ = ("name", "count")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    name: str
    count: int
    def __init__(self, name: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class CreatePartitionsRequest(_message.Message):
    __slots__ = ("topics", "validate_only")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[CreatePartitionsTopic]
    validate_only: bool
    def __init__(self, topics: _Optional[_Iterable[_Union[CreatePartitionsTopic, _Mapping]]] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class CreatePartitionsResponse(_message.Message):
    __slots__ = ("header", "topics")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    topics: _containers.RepeatedCompositeFieldContainer[TopicResult]
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., topics: _Optional[_Iterable[_Union[TopicResult, _Mapping]]] = ...) -> None: ...

class IsrMember(_message.Message):
    __slots__ = ("broker_id", "broker_epoch")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    broker_epoch: int
    def __init__(self, broker_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ...) -> None: ...

class IsrChange(_message.Message):
    __slots__ = ("topic_id", "partition_id", "leader_epoch", "partition_epoch", "new_isr")
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTITION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    NEW_ISR_FIELD_NUMBER: _ClassVar[int]
    topic_id: bytes
    partition_id: int
    leader_epoch: int
    partition_epoch: int
    new_isr: _containers.RepeatedCompositeFieldContainer[IsrMember]
    def __init__(self, topic_id: _Optional[bytes] = ..., partition_id: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., partition_epoch: _Optional[int] = ..., new_isr: _Optional[_Iterable[_Union[IsrMember, _Mapping]]] = ...) -> None: ...

class AlterPartitionRequest(_message.Message):
    __slots__ = ("broker_id", "broker_epoch", "changes")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    broker_epoch: int
    changes: _containers.RepeatedCompositeFieldContainer[IsrChange]
    def __init__(self, broker_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ..., changes: _Optional[_Iterable[_Union[IsrChange, _Mapping]]] = ...) -> None: ...

class IsrChangeResult(_message.Message):
    __slots__ = ("error", "message", "partition")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    error: ErrorCode
    message: str
    partition: _metadata_pb2.PartitionRecord
    def __init__(self, error: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ..., partition: _Optional[_Union[_metadata_pb2.PartitionRecord, _Mapping]] = ...) -> None: ...

class AlterPartitionResponse(_message.Message):
    __slots__ = ("header", "results")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    results: _containers.RepeatedCompositeFieldContainer[IsrChangeResult]
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., results: _Optional[_Iterable[_Union[IsrChangeResult, _Mapping]]] = ...) -> None: ...

class TopicPartitions(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ...) -> None: ...

class ElectLeadersRequest(_message.Message):
    __slots__ = ("partitions", "election_type")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    ELECTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[TopicPartitions]
    election_type: ElectionType
    def __init__(self, partitions: _Optional[_Iterable[_Union[TopicPartitions, _Mapping]]] = ..., election_type: _Optional[_Union[ElectionType, str]] = ...) -> None: ...

class PartitionResult(_message.Message):
    __slots__ = ("topic", "partition", "error", "message")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error: ErrorCode
    message: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ...) -> None: ...

class ElectLeadersResponse(_message.Message):
    __slots__ = ("header", "partitions")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionResult]
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., partitions: _Optional[_Iterable[_Union[PartitionResult, _Mapping]]] = ...) -> None: ...

class AlterableConfig(_message.Message):
    __slots__ = ("name", "op", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OP_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    op: AlterConfigOp
    value: str
    def __init__(self, name: _Optional[str] = ..., op: _Optional[_Union[AlterConfigOp, str]] = ..., value: _Optional[str] = ...) -> None: ...

class AlterConfigsResource(_message.Message):
    __slots__ = ("resource_type", "resource_name", "configs")
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    resource_type: _metadata_pb2.ConfigResourceType
    resource_name: str
    configs: _containers.RepeatedCompositeFieldContainer[AlterableConfig]
    def __init__(self, resource_type: _Optional[_Union[_metadata_pb2.ConfigResourceType, str]] = ..., resource_name: _Optional[str] = ..., configs: _Optional[_Iterable[_Union[AlterableConfig, _Mapping]]] = ...) -> None: ...

class IncrementalAlterConfigsRequest(_message.Message):
    __slots__ = ("resources", "validate_only")
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    resources: _containers.RepeatedCompositeFieldContainer[AlterConfigsResource]
    validate_only: bool
    def __init__(self, resources: _Optional[_Iterable[_Union[AlterConfigsResource, _Mapping]]] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class ResourceResult(_message.Message):
    __slots__ = ("resource_type", "resource_name", "error", "message")
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    resource_type: _metadata_pb2.ConfigResourceType
    resource_name: str
    error: ErrorCode
    message: str
    def __init__(self, resource_type: _Optional[_Union[_metadata_pb2.ConfigResourceType, str]] = ..., resource_name: _Optional[str] = ..., error: _Optional[_Union[ErrorCode, str]] = ..., message: _Optional[str] = ...) -> None: ...

class IncrementalAlterConfigsResponse(_message.Message):
    __slots__ = ("header", "resources")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    resources: _containers.RepeatedCompositeFieldContainer[ResourceResult]
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., resources: _Optional[_Iterable[_Union[ResourceResult, _Mapping]]] = ...) -> None: ...

class AllocateProducerIdsRequest(_message.Message):
    __slots__ = ("broker_id", "broker_epoch")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    broker_epoch: int
    def __init__(self, broker_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ...) -> None: ...

class AllocateProducerIdsResponse(_message.Message):
    __slots__ = ("header", "producer_id_start", "producer_id_len")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_START_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_LEN_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    producer_id_start: int
    producer_id_len: int
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., producer_id_start: _Optional[int] = ..., producer_id_len: _Optional[int] = ...) -> None: ...

class DescribeClusterRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BrokerDescription(_message.Message):
    __slots__ = ("broker_id", "broker_epoch", "listeners", "rack", "fenced", "in_controlled_shutdown", "metadata_offset", "partitions", "leaders")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LISTENERS_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    FENCED_FIELD_NUMBER: _ClassVar[int]
    IN_CONTROLLED_SHUTDOWN_FIELD_NUMBER: _ClassVar[int]
    METADATA_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    LEADERS_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    broker_epoch: int
    listeners: _containers.RepeatedCompositeFieldContainer[_metadata_pb2.Listener]
    rack: str
    fenced: bool
    in_controlled_shutdown: bool
    metadata_offset: int
    partitions: int
    leaders: int
    def __init__(self, broker_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ..., listeners: _Optional[_Iterable[_Union[_metadata_pb2.Listener, _Mapping]]] = ..., rack: _Optional[str] = ..., fenced: _Optional[bool] = ..., in_controlled_shutdown: _Optional[bool] = ..., metadata_offset: _Optional[int] = ..., partitions: _Optional[int] = ..., leaders: _Optional[int] = ...) -> None: ...

class DescribeClusterResponse(_message.Message):
    __slots__ = ("header", "controller_epoch", "metadata_offset", "image_digest", "brokers", "topics", "partitions")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    METADATA_OFFSET_FIELD_NUMBER: _ClassVar[int]
    IMAGE_DIGEST_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    controller_epoch: int
    metadata_offset: int
    image_digest: str
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerDescription]
    topics: int
    partitions: int
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., controller_epoch: _Optional[int] = ..., metadata_offset: _Optional[int] = ..., image_digest: _Optional[str] = ..., brokers: _Optional[_Iterable[_Union[BrokerDescription, _Mapping]]] = ..., topics: _Optional[int] = ..., partitions: _Optional[int] = ...) -> None: ...

class DescribeTopicsRequest(_message.Message):
    __slots__ = ("names",)
    NAMES_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, names: _Optional[_Iterable[str]] = ...) -> None: ...

class ConfigValue(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class TopicDescription(_message.Message):
    __slots__ = ("name", "error", "topic_id", "partitions", "configs")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    error: ErrorCode
    topic_id: bytes
    partitions: _containers.RepeatedCompositeFieldContainer[_metadata_pb2.PartitionRecord]
    configs: _containers.RepeatedCompositeFieldContainer[ConfigValue]
    def __init__(self, name: _Optional[str] = ..., error: _Optional[_Union[ErrorCode, str]] = ..., topic_id: _Optional[bytes] = ..., partitions: _Optional[_Iterable[_Union[_metadata_pb2.PartitionRecord, _Mapping]]] = ..., configs: _Optional[_Iterable[_Union[ConfigValue, _Mapping]]] = ...) -> None: ...

class DescribeTopicsResponse(_message.Message):
    __slots__ = ("header", "topics")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    header: ResponseHeader
    topics: _containers.RepeatedCompositeFieldContainer[TopicDescription]
    def __init__(self, header: _Optional[_Union[ResponseHeader, _Mapping]] = ..., topics: _Optional[_Iterable[_Union[TopicDescription, _Mapping]]] = ...) -> None: ...
