from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ConfigResourceType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONFIG_RESOURCE_UNKNOWN: _ClassVar[ConfigResourceType]
    TOPIC: _ClassVar[ConfigResourceType]
    BROKER: _ClassVar[ConfigResourceType]
CONFIG_RESOURCE_UNKNOWN: ConfigResourceType
TOPIC: ConfigResourceType
BROKER: ConfigResourceType

class Listener(_message.Message):
    __slots__ = ("name", "host", "port")
    NAME_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    name: str
    host: str
    port: int
    def __init__(self, name: _Optional[str] = ..., host: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class RegisterBrokerRecord(_message.Message):
    __slots__ = ("broker_id", "incarnation_id", "broker_epoch", "listeners", "rack", "fenced")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LISTENERS_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    FENCED_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    incarnation_id: bytes
    broker_epoch: int
    listeners: _containers.RepeatedCompositeFieldContainer[Listener]
    rack: str
    fenced: bool
    def __init__(self, broker_id: _Optional[int] = ..., incarnation_id: _Optional[bytes] = ..., broker_epoch: _Optional[int] = ..., listeners: _Optional[_Iterable[_Union[Listener, _Mapping]]] = ..., rack: _Optional[str] = ..., fenced: _Optional[bool] = ...) -> None: ...

class UnregisterBrokerRecord(_message.Message):
    __slots__ = ("broker_id", "broker_epoch")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    broker_epoch: int
    def __init__(self, broker_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ...) -> None: ...

class FenceBrokerRecord(_message.Message):
    __slots__ = ("broker_id", "broker_epoch")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    broker_epoch: int
    def __init__(self, broker_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ...) -> None: ...

class UnfenceBrokerRecord(_message.Message):
    __slots__ = ("broker_id", "broker_epoch")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    broker_epoch: int
    def __init__(self, broker_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ...) -> None: ...

class BrokerRegistrationChangeRecord(_message.Message):
    __slots__ = ("broker_id", "broker_epoch", "fenced", "in_controlled_shutdown")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    FENCED_FIELD_NUMBER: _ClassVar[int]
    IN_CONTROLLED_SHUTDOWN_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    broker_epoch: int
    fenced: bool
    in_controlled_shutdown: bool
    def __init__(self, broker_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ..., fenced: _Optional[bool] = ..., in_controlled_shutdown: _Optional[bool] = ...) -> None: ...

class TopicRecord(_message.Message):
    __slots__ = ("name", "topic_id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    topic_id: bytes
    def __init__(self, name: _Optional[str] = ..., topic_id: _Optional[bytes] = ...) -> None: ...

class PartitionRecord(_message.Message):
    __slots__ = ("topic_id", "partition_id", "replicas", "isr", "leader", "leader_epoch", "partition_epoch")
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTITION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    topic_id: bytes
    partition_id: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    isr: _containers.RepeatedScalarFieldContainer[int]
    leader: int
    leader_epoch: int
    partition_epoch: int
    def __init__(self, topic_id: _Optional[bytes] = ..., partition_id: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ..., isr: _Optional[_Iterable[int]] = ..., leader: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., partition_epoch: _Optional[int] = ...) -> None: ...

class BrokerIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class PartitionChangeRecord(_message.Message):
    __slots__ = ("topic_id", "partition_id", "leader", "isr", "replicas")
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    topic_id: bytes
    partition_id: int
    leader: int
    isr: BrokerIds
    replicas: BrokerIds
    def __init__(self, topic_id: _Optional[bytes] = ..., partition_id: _Optional[int] = ..., leader: _Optional[int] = ..., isr: _Optional[_Union[BrokerIds, _Mapping]] = ..., replicas: _Optional[_Union[BrokerIds, _Mapping]] = ...) -> None: ...

class RemoveTopicRecord(_message.Message):
    __slots__ = ("topic_id",)
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    topic_id: bytes
    def __init__(self, topic_id: _Optional[bytes] = ...) -> None: ...

class ConfigRecord(_message.Message):
    __slots__ = ("resource_type", "resource_name", "name", "value")
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    resource_type: ConfigResourceType
    resource_name: str
    name: str
    value: str
    def __init__(self, resource_type: _Optional[_Union[ConfigResourceType, str]] = ..., resource_name: _Optional[str] = ..., name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class ProducerIdsRecord(_message.Message):
    __slots__ = ("broker_id", "broker_epoch", "next_producer_id")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    NEXT_PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    broker_epoch: int
    next_producer_id: int
    def __init__(self, broker_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ..., next_producer_id: _Optional[int] = ...) -> None: ...

class FeatureLevelRecord(_message.Message):
    __slots__ = ("name", "feature_level")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FEATURE_LEVEL_FIELD_NUMBER: _ClassVar[int]
    name: str
    feature_level: int
    def __init__(self, name: _Optional[str] = ..., feature_level: _Optional[int] = ...) -> None: ...

class NoOpRecord(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BrokerEpochHighWaterRecord(_message.Message):
    __slots__ = ("broker_epoch",)
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    broker_epoch: int
    def __init__(self, broker_epoch: _Optional[int] = ...) -> None: ...

class MetadataRecord(_message.Message):
    __slots__ = ("register_broker", "unregister_broker", "fence_broker", "unfence_broker", "broker_registration_change", "topic", "partition", "partition_change", "remove_topic", "config", "producer_ids", "feature_level", "no_op", "broker_epoch_high_water")
    REGISTER_BROKER_FIELD_NUMBER: _ClassVar[int]
    UNREGISTER_BROKER_FIELD_NUMBER: _ClassVar[int]
    FENCE_BROKER_FIELD_NUMBER: _ClassVar[int]
    UNFENCE_BROKER_FIELD_NUMBER: _ClassVar[int]
    BROKER_REGISTRATION_CHANGE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    PARTITION_CHANGE_FIELD_NUMBER: _ClassVar[int]
    REMOVE_TOPIC_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_IDS_FIELD_NUMBER: _ClassVar[int]
    FEATURE_LEVEL_FIELD_NUMBER: _ClassVar[int]
    NO_OP_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_HIGH_WATER_FIELD_NUMBER: _ClassVar[int]
    register_broker: RegisterBrokerRecord
    unregister_broker: UnregisterBrokerRecord
    fence_broker: FenceBrokerRecord
    unfence_broker: UnfenceBrokerRecord
    broker_registration_change: BrokerRegistrationChangeRecord
    topic: TopicRecord
    partition: PartitionRecord
    partition_change: PartitionChangeRecord
    remove_topic: RemoveTopicRecord
    config: ConfigRecord
    producer_ids: ProducerIdsRecord
    feature_level: FeatureLevelRecord
    no_op: NoOpRecord
    broker_epoch_high_water: BrokerEpochHighWaterRecord
    def __init__(self, register_broker: _Optional[_Union[RegisterBrokerRecord, _Mapping]] = ..., unregister_broker: _Optional[_Union[UnregisterBrokerRecord, _Mapping]] = ..., fence_broker: _Optional[_Union[FenceBrokerRecord, _Mapping]] = ..., unfence_broker: _Optional[_Union[UnfenceBrokerRecord, _Mapping]] = ..., broker_registration_change: _Optional[_Union[BrokerRegistrationChangeRecord, _Mapping]] = ..., topic: _Optional[_Union[TopicRecord, _Mapping]] = ..., partition: _Optional[_Union[PartitionRecord, _Mapping]] = ..., partition_change: _Optional[_Union[PartitionChangeRecord, _Mapping]] = ..., remove_topic: _Optional[_Union[RemoveTopicRecord, _Mapping]] = ..., config: _Optional[_Union[ConfigRecord, _Mapping]] = ..., producer_ids: _Optional[_Union[ProducerIdsRecord, _Mapping]] = ..., feature_level: _Optional[_Union[FeatureLevelRecord, _Mapping]] = ..., no_op: _Optional[_Union[NoOpRecord, _Mapping]] = ..., broker_epoch_high_water: _Optional[_Union[BrokerEpochHighWaterRecord, _Mapping]] = ...) -> None: ...
