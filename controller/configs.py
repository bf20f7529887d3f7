"""Config decisions of the active controller: which topic and broker settings exist and what
values they take, IncrementalAlterConfigs, AllocateProducerIds and DescribeCluster.

How this works. Config entries travel as text (``ConfigRecord``, name -> value) and are
checked here, once, before they are committed: a name must be in one of the tables below and
its value must parse and satisfy ``storage.config.LogConfig``'s own validation, including the
relations between settings (``segment.jitter.ms`` below ``segment.ms``). To check a relation
the entries are laid over ``log_defaults`` (the node's ``[log]`` section) and a ``LogConfig``
is built; the same function (``topic_log_config``) later turns a topic's committed entries into
the ``LogConfig`` of its partition logs. What is committed is the value's canonical text
(``" 100"`` -> ``"100"``, ``"delete,compact"`` -> ``"compact,delete"``), so every node reads
the same bytes and equal settings compare equal.

Topic configs (Kafka's names; -1 means "no limit" where Kafka allows it):

    cleanup.policy             delete | compact | compact,delete   LogConfig.cleanup_policy
    delete.retention.ms        int >= 0                            delete_retention_ms
    flush.messages             int >= 1 (2**63-1: never)           flush_messages
    flush.ms                   int >= 1 (2**63-1: never)           flush_ms
    index.interval.bytes       int >= 0                            index_interval_bytes
    max.message.bytes          int >= 61                           max_message_bytes
    message.timestamp.after.max.ms   int >= 0 (2**63-1: no limit)  message_timestamp_after_max_ms
    message.timestamp.before.max.ms  int >= 0 (2**63-1: no limit)  message_timestamp_before_max_ms
    message.timestamp.type     CreateTime | LogAppendTime          message_timestamp_type
    min.cleanable.dirty.ratio  0.0 .. 1.0                          min_cleanable_dirty_ratio
    min.compaction.lag.ms      int >= 0                            min_compaction_lag_ms
    min.insync.replicas        int >= 1                            (replication, not the log)
    retention.bytes            int >= 0, or any negative (-1)      retention_bytes
    retention.ms               int >= 0, or -1                     retention_ms
    segment.bytes              int >= 1 MiB (new values)           segment_bytes
    segment.index.bytes        int >= 24                           segment_index_bytes
    segment.jitter.ms          int >= 0, below segment.ms          segment_jitter_ms
    segment.ms                 int >= 1                            segment_ms
    unclean.leader.election.enable  true | false                   (elections, not the log)

The flush settings' "never" (None in LogConfig) reads as Kafka's default, 2**63-1; -1, which
runnel once committed for it, is still read but no longer accepted in a request (Kafka wants
at least 1). Any negative retention.bytes is committed as -1. A new segment.bytes (topic, or
log.segment.bytes) must be at least 1 MiB, Kafka 4's minimum: with tiny segments every batch
takes a file descriptor; a smaller value committed before is still read, and the node's own
``[log] segment_bytes`` (the operator's file) keeps the storage engine's minimum, 128.

Kafka topic configs runnel does not implement (``_FIXED``: compression.type, preallocate,
max.compaction.lag.ms, the tiered-storage and throttling ones, ...) accept only the value that
describes what runnel does (compression.type=producer: batches are stored as sent) and refuse
any other with INVALID_CONFIG saying so; an accepted one is committed and described like any
other. Names Kafka does not know are refused as unknown.

APPEND and SUBTRACT (Kafka's IncrementalAlterConfigs ops 2 and 3, ``AlterConfigOp``'s) work
on the list-typed configs (``_LISTS``) as in Kafka's ConfigurationControlManager: the current
entry, else the default (``log_defaults``), split at commas, gains the values not yet in it or
loses the given ones, and the result is checked as a SET. On any other config they are
INVALID_CONFIG.

Broker configs (resource name "" for the cluster-wide default, or a broker id, read as Kafka
reads it, with Java's Integer.parseInt: "0101" is broker 101, and its entries are kept under
"101", the name brokers read; Kafka keeps them under "0101", where no broker reads them): the
broker-wide defaults of some topic configs, under Kafka's broker names:

    log.cleanup.policy, log.flush.interval.messages, log.flush.interval.ms,
    log.message.timestamp.after.max.ms, log.message.timestamp.before.max.ms,
    log.retention.bytes, log.retention.ms, log.roll.ms, log.segment.bytes, message.max.bytes,
    min.insync.replicas, unclean.leader.election.enable (each as the topic config it defaults)

The controller's elections read ``unclean.leader.election.enable`` of the topic, else of the
cluster-wide resource "" (a broker id's value is not used by elections: no broker elects),
else the controller's static setting (controller/elections.py, ``unclean_allowed``).

Each topic config has Kafka's type (``ConfigType``, from its LogConfig definition; a broker
config has its topic config's) and a sentence on what it does in runnel (``config_doc``), for
DescribeConfigs.

Every decision here is pure: the image and the request in, an ``Outcome`` (records and
answer) out, or ``DecisionError`` for a request refused as a whole (controller/outcome.py).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from enum import IntEnum
from itertools import chain
from typing import Any, cast

from controller import records as rec
from controller.elections import registration
from controller.image import MetadataImage
from controller.outcome import DecisionError, Outcome
from controller.records import ConfigResourceType, MetadataRecord
from controller.topic_names import check_topic_name
from proto import controller_pb2 as cpb
from proto import metadata_pb2 as mpb
from storage.batch import TimestampType
from storage.config import LogConfig
from storage.errors import invariant

__all__ = [
    "BROKER_CONFIGS",
    "ConfigType",
    "broker_entries_as_topic",
    "broker_id_of",
    "config_doc",
    "config_type",
    "PRODUCER_ID_BLOCK_SIZE",
    "TOPIC_CONFIGS",
    "allocate_producer_ids",
    "as_error_code",
    "describe_cluster",
    "canonical_value",
    "describe_topic_configs",
    "stored_resource_name",
    "incremental_alter_configs",
    "topic_log_config",
    "validate_topic_configs",
]

PRODUCER_ID_BLOCK_SIZE = 1000  # Kafka's block size
_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1
_INTEGER = re.compile(r"-?[0-9]+")
_JAVA_INT = re.compile(r"([+-]?)0*(\d*)")  # Java's Integer.parseInt (Character.digit: any Nd)
_DECIMAL = re.compile(r"-?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?")  # unambiguous
_MAX_VALUE_CHARS = 1000
_TIMESTAMP_TYPES = {
    "CreateTime": TimestampType.CREATE_TIME,
    "LogAppendTime": TimestampType.LOG_APPEND_TIME,
}
_TIMESTAMP_NAMES = {v: k for k, v in _TIMESTAMP_TYPES.items()}

Parse = Callable[[str], Any]
TOPIC = ConfigResourceType.TOPIC
BROKER = ConfigResourceType.BROKER


def as_error_code(code: int) -> cpb.ErrorCode:
    """A ``DecisionError`` code as the generated stubs type it (they have no ValueType)."""
    return cast(cpb.ErrorCode, code)


# -- parsing one value -------------------------------------------------------------------------


def _no(value: int) -> bool:
    return False


def _minus_one(value: int) -> bool:
    return value == -1


def _negative(value: int) -> bool:
    return value < 0


def _max(value: int) -> bool:
    return value == _INT64_MAX


def _minus_one_or_max(value: int) -> bool:
    return value in (-1, _INT64_MAX)


def _integer(
    maximum: int, *, minimum: int | None = None, unlimited: Callable[[int], bool] = _no
) -> Parse:
    """Parses decimal text; a value ``unlimited`` holds for becomes None ("no limit"). Lower
    bounds of LogConfig fields are left to LogConfig, so its message and ours cannot disagree."""

    def parse(text: str) -> int | None:
        if not _INTEGER.fullmatch(text):
            raise ValueError("not an integer")
        value = int(text)
        if unlimited(value):
            return None
        if value > maximum:
            raise ValueError(f"above the maximum {maximum}")
        if minimum is not None and value < minimum:
            raise ValueError(f"below the minimum {minimum}")
        return value

    return parse


def _ratio(text: str) -> float:
    if not _DECIMAL.fullmatch(text) or not math.isfinite(value := float(text)):
        raise ValueError("not a decimal number")
    if not 0.0 <= value <= 1.0:
        raise ValueError("not between 0 and 1")
    return value


def _cleanup_policy(text: str) -> str:
    parts = {part.strip() for part in text.split(",")}
    if not parts or not parts <= {"delete", "compact"}:
        raise ValueError("not delete, compact or compact,delete")
    return ",".join(sorted(parts))  # "compact", "compact,delete" or "delete"


def _timestamp_type(text: str) -> TimestampType:
    if text not in _TIMESTAMP_TYPES:
        raise ValueError("not CreateTime or LogAppendTime")
    return _TIMESTAMP_TYPES[text]


def _boolean(text: str) -> bool:
    if text.lower() not in ("true", "false"):
        raise ValueError("not true or false")
    return text.lower() == "true"


def _compression_type(text: str) -> str:
    if text not in _COMPRESSION_TYPES:
        raise ValueError(f"not one of {', '.join(_COMPRESSION_TYPES)}")
    return text


_COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")  # Kafka's


def _list(text: str) -> str:
    """A LIST config's items, stripped, empty ones dropped, joined by commas."""
    return ",".join(part.strip() for part in text.split(",") if part.strip())


def _canonical(value: object, unlimited: str = "-1") -> str:
    if value is None:
        return unlimited
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, TimestampType):
        return _TIMESTAMP_NAMES[value]
    return str(value)


# -- the tables --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Setting:
    field: str | None  # the LogConfig field it sets; None: not a log setting
    parse: Parse
    unlimited: str = "-1"  # the text of None (no limit)
    set_minimum: int | None = None  # a lower bound checked on new values only
    only: str | None = None  # the one value runnel supports (a Kafka config it does not do)
    why: str = ""  # why ``only``: what runnel does instead


def _fixed(value: str, parse: Parse, why: str) -> _Setting:
    return _Setting(None, parse, only=value, why=why)


_NEVER = str(_INT64_MAX)  # Kafka's default of the flush settings
_NO_TIERS = "runnel has no tiered storage"
_FIXED: Mapping[str, _Setting] = {
    "compression.type": _fixed(
        "producer",
        _compression_type,
        "runnel stores batches as the producer compressed them",
    ),
    "compression.gzip.level": _fixed("-1", _integer(_INT32_MAX), "runnel never recompresses"),
    "compression.lz4.level": _fixed("9", _integer(_INT32_MAX), "runnel never recompresses"),
    "compression.zstd.level": _fixed("3", _integer(_INT32_MAX), "runnel never recompresses"),
    "file.delete.delay.ms": _fixed(
        "0", _integer(_INT64_MAX), "runnel unlinks a deleted segment's files at once"
    ),
    "follower.replication.throttled.replicas": _fixed(
        "", _list, "runnel does not throttle replication"
    ),
    "leader.replication.throttled.replicas": _fixed(
        "", _list, "runnel does not throttle replication"
    ),
    "local.retention.bytes": _fixed("-2", _integer(_INT64_MAX), _NO_TIERS),
    "local.retention.ms": _fixed("-2", _integer(_INT64_MAX), _NO_TIERS),
    "max.compaction.lag.ms": _fixed(
        _NEVER, _integer(_INT64_MAX), "runnel's cleaner does not force compaction by age"
    ),
    "preallocate": _fixed("false", _boolean, "runnel does not preallocate segment files"),
    "remote.log.copy.disable": _fixed("false", _boolean, _NO_TIERS),
    "remote.log.delete.on.disable": _fixed("false", _boolean, _NO_TIERS),
    "remote.storage.enable": _fixed("false", _boolean, _NO_TIERS),
}

TOPIC_CONFIGS: Mapping[str, _Setting] = {
    "cleanup.policy": _Setting("cleanup_policy", _cleanup_policy),
    "delete.retention.ms": _Setting("delete_retention_ms", _integer(_INT64_MAX)),
    "flush.messages": _Setting(
        "flush_messages",
        _integer(_INT64_MAX, unlimited=_minus_one_or_max),
        unlimited=_NEVER,
        set_minimum=1,
    ),
    "flush.ms": _Setting(
        "flush_ms",
        _integer(_INT64_MAX, unlimited=_minus_one_or_max),
        unlimited=_NEVER,
        set_minimum=1,
    ),
    "index.interval.bytes": _Setting("index_interval_bytes", _integer(_INT32_MAX)),
    "max.message.bytes": _Setting("max_message_bytes", _integer(_INT32_MAX)),
    "message.timestamp.after.max.ms": _Setting(
        "message_timestamp_after_max_ms", _integer(_INT64_MAX, unlimited=_max), unlimited=_NEVER
    ),
    "message.timestamp.before.max.ms": _Setting(
        "message_timestamp_before_max_ms", _integer(_INT64_MAX, unlimited=_max), unlimited=_NEVER
    ),
    "message.timestamp.type": _Setting("message_timestamp_type", _timestamp_type),
    "min.cleanable.dirty.ratio": _Setting("min_cleanable_dirty_ratio", _ratio),
    "min.compaction.lag.ms": _Setting("min_compaction_lag_ms", _integer(_INT64_MAX)),
    "min.insync.replicas": _Setting(None, _integer(_INT32_MAX, minimum=1)),
    "retention.bytes": _Setting("retention_bytes", _integer(_INT64_MAX, unlimited=_negative)),
    "retention.ms": _Setting("retention_ms", _integer(_INT64_MAX, unlimited=_minus_one)),
    # Kafka 4's minimum (KIP-1030): a client may not make every batch a file (descriptors).
    "segment.bytes": _Setting("segment_bytes", _integer(_INT32_MAX), set_minimum=1024 * 1024),
    "segment.index.bytes": _Setting("segment_index_bytes", _integer(_INT32_MAX)),
    "segment.jitter.ms": _Setting("segment_jitter_ms", _integer(_INT64_MAX)),
    "segment.ms": _Setting("segment_ms", _integer(_INT64_MAX)),
    "unclean.leader.election.enable": _Setting(None, _boolean),
    **_FIXED,
}


class ConfigType(IntEnum):
    """Kafka's DescribeConfigsResponse.ConfigType ids: the type of a config's definition."""

    UNKNOWN = 0
    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


_B, _S, _I, _L, _D, _LIST = (
    ConfigType.BOOLEAN, ConfigType.STRING, ConfigType.INT, ConfigType.LONG, ConfigType.DOUBLE,
    ConfigType.LIST,
)  # fmt: skip
# Each topic config's type, as Kafka's LogConfig defines it, and what it does in runnel (the
# configs runnel does not implement say so from their ``why``: ``config_doc``).
_DESCRIBED: Mapping[str, tuple[ConfigType, str]] = {
    "cleanup.policy": (
        _LIST,
        "What happens to old records: delete drops whole segments past retention.ms or "
        "retention.bytes; compact keeps the latest record of each key; or both.",
    ),
    "compression.gzip.level": (_I, ""),
    "compression.lz4.level": (_I, ""),
    "compression.type": (_S, ""),
    "compression.zstd.level": (_I, ""),
    "delete.retention.ms": (
        _L,
        "How long compaction keeps a key's tombstone (a record with a null value) once its "
        "segment is cleaned, so that consumers behind can still see the delete.",
    ),
    "file.delete.delay.ms": (_L, ""),
    "flush.messages": (
        _L,
        "Records a partition appends between fsyncs of its log; 9223372036854775807: never "
        "(the operating system writes the pages back).",
    ),
    "flush.ms": (
        _L,
        "Milliseconds after a partition's last fsync that it syncs what it appended since; "
        "9223372036854775807: never.",
    ),
    "follower.replication.throttled.replicas": (_LIST, ""),
    "index.interval.bytes": (
        _I,
        "Bytes of batches between two entries of a segment's offset and time indexes.",
    ),
    "leader.replication.throttled.replicas": (_LIST, ""),
    "local.retention.bytes": (_L, ""),
    "local.retention.ms": (_L, ""),
    "max.compaction.lag.ms": (_L, ""),
    "max.message.bytes": (
        _I,
        "The largest record batch, as the producer sent it (compressed), that a leader "
        "appends; a larger one is answered MESSAGE_TOO_LARGE.",
    ),
    "message.timestamp.after.max.ms": (
        _L,
        "How far past the leader's clock a CreateTime batch's largest timestamp may be; "
        "beyond it the batch is INVALID_TIMESTAMP. 9223372036854775807: no limit.",
    ),
    "message.timestamp.before.max.ms": (
        _L,
        "How far before the leader's clock a CreateTime batch's first timestamp may be; "
        "beyond it the batch is INVALID_TIMESTAMP. 9223372036854775807: no limit.",
    ),
    "message.timestamp.type": (
        _S,
        "CreateTime keeps the timestamps the producer set; LogAppendTime stamps every batch "
        "with the leader's clock as it appends it.",
    ),
    "min.cleanable.dirty.ratio": (
        _D,
        "A compacted log is cleaned once this share of it (by bytes) has not been cleaned yet.",
    ),
    "min.compaction.lag.ms": (
        _L,
        "The least time a record stays in the log as written before compaction may remove it.",
    ),
    "min.insync.replicas": (
        _I,
        "The fewest in-sync replicas an acks=-1 write needs; with fewer, the leader refuses it "
        "(NOT_ENOUGH_REPLICAS).",
    ),
    "preallocate": (_B, ""),
    "remote.log.copy.disable": (_B, ""),
    "remote.log.delete.on.disable": (_B, ""),
    "remote.storage.enable": (_B, ""),
    "retention.bytes": (
        _L,
        "The most bytes a partition keeps under the delete policy: its oldest segments go "
        "first. -1: no limit.",
    ),
    "retention.ms": (
        _L,
        "How long a partition keeps a segment under the delete policy, counted from the "
        "segment's largest timestamp. -1: forever.",
    ),
    "segment.bytes": (_I, "The size at which a partition starts a new segment file."),
    "segment.index.bytes": (
        _I,
        "The most bytes each of a segment's offset and time indexes may take; a full index "
        "starts a new segment.",
    ),
    "segment.jitter.ms": (
        _L,
        "Up to this much, drawn at random, is taken off segment.ms for each segment, so that "
        "partitions do not all start new segments at once.",
    ),
    "segment.ms": (
        _L,
        "The age at which a partition starts a new segment even if the current one is not "
        "full, so that retention and compaction can act on it.",
    ),
    "unclean.leader.election.enable": (
        _B,
        "Whether the controller may elect a replica outside the ISR when no ISR replica is "
        "alive: the partition comes back, but records committed only on the ISR are lost.",
    ),
}
# The configs whose type is LIST in Kafka: APPEND and SUBTRACT work on these alone.
_LISTS = frozenset(n for n, (kind, _) in _DESCRIBED.items() if kind == ConfigType.LIST)
APPEND, SUBTRACT = cpb.APPEND, cpb.SUBTRACT  # Kafka's OpType ids 2 and 3
_OP_NAMES = {APPEND: "APPEND", SUBTRACT: "SUBTRACT"}
# The values of the settings that are not the log's when nothing sets them (Kafka's).
_NOT_LOG_DEFAULTS = {"min.insync.replicas": "1", "unclean.leader.election.enable": "false"}

invariant(_DESCRIBED.keys() == TOPIC_CONFIGS.keys(), "a topic config without a type")
invariant(
    all(bool(doc) == (TOPIC_CONFIGS[n].only is None) for n, (_, doc) in _DESCRIBED.items()),
    "an implemented topic config without documentation, or a fixed one with its own",
)

# Broker name -> the topic config it is the default of (Kafka's ServerTopicConfigSynonyms; the
# broker config's type in Kafka's KafkaConfig is its topic config's type).
BROKER_CONFIGS: Mapping[str, str] = {
    "log.cleanup.policy": "cleanup.policy",
    "log.flush.interval.messages": "flush.messages",
    "log.flush.interval.ms": "flush.ms",
    "log.retention.bytes": "retention.bytes",
    "log.retention.ms": "retention.ms",
    "log.roll.ms": "segment.ms",
    "log.message.timestamp.after.max.ms": "message.timestamp.after.max.ms",
    "log.message.timestamp.before.max.ms": "message.timestamp.before.max.ms",
    "log.segment.bytes": "segment.bytes",
    "message.max.bytes": "max.message.bytes",
    "min.insync.replicas": "min.insync.replicas",
    "unclean.leader.election.enable": "unclean.leader.election.enable",
}


# -- checking entries --------------------------------------------------------------------------


def validate_topic_configs(
    entries: Iterable[tuple[str, str]], log_defaults: LogConfig
) -> dict[str, str]:
    """The canonical text of each entry, or ``DecisionError``: INVALID_REQUEST for a name
    given twice, INVALID_CONFIG for an unknown name, a value that does not parse or break a
    ``LogConfig`` rule, alone or together with the other entries."""
    entries = list(entries)
    _refuse_repeats([name for name, _ in entries], "config")
    canonical = {name: _canonical_value(name, value, TOPIC) for name, value in entries}
    topic_log_config(canonical, log_defaults)
    return canonical


def topic_log_config(entries: Mapping[str, str], log_defaults: LogConfig) -> LogConfig:
    """``log_defaults`` with a topic's config entries laid over it; ``DecisionError``
    (INVALID_CONFIG) if an entry is unknown or the result breaks a ``LogConfig`` rule."""
    changes: dict[str, Any] = {}
    for name, text in entries.items():
        setting = _topic_setting(name)
        if setting.field is None:
            continue
        value = _parse(name, text, setting.parse)
        try:
            replace(log_defaults, **{setting.field: value})
        except ValueError as e:
            raise _invalid(name, text, str(e)) from None
        changes[setting.field] = value
    try:
        return replace(log_defaults, **changes)
    except ValueError as e:
        raise DecisionError(cpb.INVALID_CONFIG, f"configs {dict(entries)}: {e}") from None


def broker_entries_as_topic(image: MetadataImage, resource: str) -> dict[str, str]:
    """A broker resource's dynamic configs ("" cluster-wide, or a broker id) under the names
    of the topic configs they are the defaults of."""
    entries = image.configs.get((int(ConfigResourceType.BROKER), resource), {})
    return {BROKER_CONFIGS[n]: v for n, v in entries.items() if n in BROKER_CONFIGS}


def describe_topic_configs(
    entries: Mapping[str, str], log_defaults: LogConfig
) -> list[tuple[str, str, bool]]:
    """Every topic config as (name, value text, set on the topic?), by name: the topic's
    own entries, and for the rest the value its logs run with (``log_defaults``)."""
    config = topic_log_config(entries, log_defaults)
    out = []
    for name in sorted(TOPIC_CONFIGS):
        if name in entries:
            out.append((name, entries[name], True))
        else:
            out.append((name, _value_in(config, name), False))
    return out


def _value_in(config: LogConfig, name: str) -> str:
    """The text of topic config ``name`` for logs running with ``config``."""
    setting = TOPIC_CONFIGS[name]
    if setting.only is not None:
        return setting.only
    if setting.field is None:
        return _NOT_LOG_DEFAULTS[name]
    return _canonical(getattr(config, setting.field), setting.unlimited)


def _topic_setting(name: str) -> _Setting:
    setting = TOPIC_CONFIGS.get(name)
    if setting is None:
        raise DecisionError(
            cpb.INVALID_CONFIG,
            f"unknown topic config {_short(name)}; supported: {', '.join(sorted(TOPIC_CONFIGS))}",
        )
    return setting


def _setting(name: str, kind: ConfigResourceType) -> _Setting:
    """How to read config ``name`` of a ``kind`` resource; ``DecisionError`` if unknown."""
    if kind == ConfigResourceType.TOPIC:
        return _topic_setting(name)
    if name not in BROKER_CONFIGS:
        supported = ", ".join(sorted(BROKER_CONFIGS))
        raise DecisionError(
            cpb.INVALID_CONFIG, f"unknown broker config {_short(name)}; supported: {supported}"
        )
    return TOPIC_CONFIGS[BROKER_CONFIGS[name]]


def config_type(name: str, kind: ConfigResourceType) -> ConfigType:
    """The type of a known topic or broker config (a broker config's is its topic config's)."""
    return _DESCRIBED[name if kind == TOPIC else BROKER_CONFIGS[name]][0]


def config_doc(name: str, kind: ConfigResourceType) -> str:
    """What a known topic or broker config does in runnel, in a sentence or two."""
    topic_name = name if kind == TOPIC else BROKER_CONFIGS[name]
    setting = TOPIC_CONFIGS[topic_name]
    doc = _DESCRIBED[topic_name][1]
    if setting.only is not None:
        doc = f"Not implemented: {setting.why}. Only {setting.only or repr('')} is accepted."
    if kind == TOPIC:
        return doc
    if topic_name == "unclean.leader.election.enable":
        doc += ' The controller reads the cluster-wide value (resource ""), not a broker\'s.'
    return f"The default of topic config {topic_name} for the topics that do not set it. {doc}"


def broker_id_of(name: str) -> int | None:
    """The broker id a BROKER resource name gives, read as Kafka reads it on the broker and on
    the controller (Java's Integer.parseInt: an optional sign, then decimal digits, any
    Unicode ones, within 32 bits; so "0101" and "+101" are 101), or None if it gives none.
    Leading zeros other than ASCII ones count as digits here (Java skips them too): eleven or
    more digits are refused unread. Entries are kept under ``str(id)``, the name brokers read."""
    match = _JAVA_INT.fullmatch(name)
    if match is None or match[0] in ("", "+", "-") or len(match[2]) > 10:
        return None
    value = int(match[1] + (match[2] or "0"))
    return value if -(2**31) <= value < 2**31 else None


def canonical_value(name: str, text: str, kind: ConfigResourceType) -> str:
    """The text the controller commits for ``text``; DecisionError if it would refuse it."""
    return _canonical_value(name, text, kind)


def _canonical_value(name: str, text: str, kind: ConfigResourceType) -> str:
    """The canonical text of a new value: parsed, then held to what runnel supports."""
    setting = _setting(name, kind)
    canonical = _canonical(_parse(name, text, setting.parse), setting.unlimited)
    if setting.only is not None and canonical != setting.only:
        shown = canonical if canonical.isprintable() and len(canonical) <= 60 else _short(text)
        runs = f"{name}={setting.only or repr('')}"
        raise DecisionError(
            cpb.INVALID_CONFIG, f"{name}={shown} is not supported: {setting.why} ({runs})"
        )
    if setting.set_minimum is not None and int(text.strip()) < setting.set_minimum:
        raise _invalid(name, text, f"below the minimum {setting.set_minimum}")
    return canonical


def _parse(name: str, text: str, parse: Parse) -> Any:
    if len(text) > _MAX_VALUE_CHARS:
        raise _invalid(name, text, f"longer than {_MAX_VALUE_CHARS} characters")
    try:
        return parse(text.strip())
    except ValueError as e:
        raise _invalid(name, text, str(e)) from None


def _invalid(name: str, text: str, why: str) -> DecisionError:
    shown = _short(text)
    return DecisionError(cpb.INVALID_CONFIG, f"invalid value {shown} for config {name!r}: {why}")


def _short(text: str) -> str:
    """``text`` quoted for a message, cut short if long (it comes from a client)."""
    return repr(text) if len(text) <= 60 else f"{text[:60]!r}..."


def _refuse_repeats(names: Iterable[str], what: str) -> None:
    repeated = sorted(name for name, n in Counter(names).items() if n > 1)
    if repeated:
        raise DecisionError(cpb.INVALID_REQUEST, f"{what} {repeated[0]!r} is given twice")


def _broker_log_check(entries: Mapping[str, str], log_defaults: LogConfig) -> None:
    """Broker-level log defaults must make a valid LogConfig too (as topic entries)."""
    as_topic = {
        topic_name: value
        for name, value in entries.items()
        if (topic_name := BROKER_CONFIGS.get(name)) is not None
    }
    topic_log_config(as_topic, log_defaults)


# -- IncrementalAlterConfigs -------------------------------------------------------------------


def incremental_alter_configs(
    image: MetadataImage,
    request: cpb.IncrementalAlterConfigsRequest,
    log_defaults: LogConfig | None = None,
) -> Outcome[cpb.IncrementalAlterConfigsResponse]:
    """Sets, deletes, appends to and subtracts from config entries of topics and brokers,
    resource by resource.

    A resource's changes apply all or not at all; its result names the first problem. A
    resource named twice is refused both times (INVALID_REQUEST); "0101" and "101" name the
    same broker, whose entries are kept under "101" (``broker_id_of``). Only entries whose
    value changes become records (a delete is a ``ConfigRecord`` without a value)."""
    defaults = log_defaults or LogConfig()
    keys = Counter((r.resource_type, _stored_name(r)) for r in request.resources)
    records: list[MetadataRecord] = []
    response = cpb.IncrementalAlterConfigsResponse()
    for resource in request.resources:
        result = response.resources.add(
            resource_type=resource.resource_type, resource_name=resource.resource_name
        )
        try:
            if keys[(resource.resource_type, _stored_name(resource))] > 1:
                raise DecisionError(cpb.INVALID_REQUEST, "the resource is named twice")
            changes = _alter_resource(image, resource, defaults)
        except DecisionError as e:
            result.error, result.message = as_error_code(e.code), e.message
            continue
        records += changes
    return Outcome(() if request.validate_only else tuple(records), response)


def _alter_resource(
    image: MetadataImage, resource: cpb.AlterConfigsResource, log_defaults: LogConfig
) -> list[MetadataRecord]:
    kind = _resource_kind(image, resource)
    stored = _stored_name(resource)
    _refuse_repeats((c.name for c in resource.configs), "config")
    current = image.configs.get((kind, stored), {})
    entries = dict(current)
    for change in resource.configs:
        if change.op == cpb.SET:
            entries[change.name] = _canonical_value(change.name, change.value, kind)
        elif change.op == cpb.DELETE:
            _setting(change.name, kind)  # deleting a misspelt name would silently do nothing
            entries.pop(change.name, None)
        elif change.op in _OP_NAMES:
            now = entries.get(change.name)
            entries[change.name] = _list_change(change, kind, now, log_defaults)
        else:
            raise DecisionError(cpb.INVALID_REQUEST, f"unknown operation {change.op}")
    if kind == TOPIC:
        topic_log_config(entries, log_defaults)
    else:
        _broker_log_check(entries, log_defaults)
    names = sorted(set(current) | set(entries))
    return [
        rec.config(kind, stored, name, entries.get(name))
        for name in names
        if current.get(name) != entries.get(name)
    ]


def _list_change(
    change: cpb.AlterableConfig,
    kind: ConfigResourceType,
    current: str | None,
    log_defaults: LogConfig,
) -> str:
    """The canonical text after APPEND or SUBTRACT of ``change.value``'s items to the current
    entry, else to the default (Kafka's ``getParts``)."""
    _setting(change.name, kind)  # an unknown name is refused as unknown
    topic_name = change.name if kind == TOPIC else BROKER_CONFIGS[change.name]
    if topic_name not in _LISTS:
        raise DecisionError(
            cpb.INVALID_CONFIG,
            f"Can't {_OP_NAMES[change.op]} to key {change.name} because its type is not LIST.",
        )
    if current is None:
        current = _value_in(log_defaults, topic_name)
    items = _list(current).split(",") if _list(current) else []
    given = _list(change.value).split(",") if _list(change.value) else []
    if change.op == APPEND:
        items += [item for item in dict.fromkeys(given) if item not in items]
    else:
        items = [item for item in items if item not in given]
    return _canonical_value(change.name, ",".join(items), kind)


def stored_resource_name(resource_type: int, name: str) -> str:
    """The name a config resource's entries are kept under: a broker id as ``str(id)``
    ("0101" is "101"), any other name as given. The broker forwards alters under it."""
    if resource_type == int(BROKER) and (broker_id := broker_id_of(name)) is not None:
        return str(broker_id)
    return name


def _stored_name(resource: cpb.AlterConfigsResource) -> str:
    return stored_resource_name(resource.resource_type, resource.resource_name)


def _resource_kind(image: MetadataImage, resource: cpb.AlterConfigsResource) -> ConfigResourceType:
    name = resource.resource_name
    if resource.resource_type == int(TOPIC):
        # Kafka's ControllerConfigurationValidator.validateTopicName, before the lookup
        if not name:
            raise DecisionError(cpb.INVALID_REQUEST, "Default topic resources are not allowed.")
        check_topic_name(name)
        if name not in image.topic_ids:
            raise DecisionError(cpb.UNKNOWN_TOPIC_OR_PARTITION, f"no topic named {name!r}")
        return TOPIC
    if resource.resource_type == int(BROKER):
        broker_id = broker_id_of(name) if name else 0
        if broker_id is None:  # Kafka's ControllerConfigurationValidator.validateBrokerName
            raise DecisionError(
                cpb.INVALID_REQUEST, "Unable to parse broker name as a base 10 number."
            )
        if broker_id < 0:
            raise DecisionError(cpb.INVALID_REQUEST, "Invalid negative broker ID.")
        return BROKER
    raise DecisionError(
        cpb.INVALID_REQUEST, f"resource type {resource.resource_type} is not TOPIC or BROKER"
    )


# -- AllocateProducerIds -----------------------------------------------------------------------


def allocate_producer_ids(
    image: MetadataImage,
    request: cpb.AllocateProducerIdsRequest,
    block_size: int = PRODUCER_ID_BLOCK_SIZE,
) -> Outcome[cpb.AllocateProducerIdsResponse]:
    """The next ``block_size`` producer ids, for a broker registered at ``broker_epoch``
    (fenced or not, as in Kafka: it may be catching up and about to produce)."""
    registration(image, request.broker_id, request.broker_epoch)
    start = image.next_producer_id
    if start > _INT64_MAX - block_size:
        raise DecisionError(cpb.UNKNOWN_SERVER_ERROR, "every producer id is taken")
    record = rec.producer_ids(request.broker_id, request.broker_epoch, start + block_size)
    answer = cpb.AllocateProducerIdsResponse(producer_id_start=start, producer_id_len=block_size)
    return Outcome((record,), answer)


# -- DescribeCluster ---------------------------------------------------------------------------


def describe_cluster(
    image: MetadataImage,
    sessions_metadata_offsets: Mapping[int, int],
    controller_epoch: int,
    committed_offset: int,
    *,
    image_digest: str | None = None,
) -> cpb.DescribeClusterResponse:
    """The cluster as the committed ``image`` has it. ``sessions_metadata_offsets`` is each
    broker's last reported metadata offset (missing: never reported, -1); ``image_digest``
    may be passed when the caller has it, since computing it encodes the whole image."""
    partitions, replicas, leaders = _count_partitions(image)
    response = cpb.DescribeClusterResponse(
        controller_epoch=controller_epoch,
        metadata_offset=committed_offset,
        image_digest=image.digest() if image_digest is None else image_digest,
        topics=len(image.topics),
        partitions=partitions,
    )
    for broker_id in sorted(image.brokers):
        b = image.brokers[broker_id]
        response.brokers.add(
            broker_id=broker_id,
            broker_epoch=b.broker_epoch,
            listeners=[mpb.Listener(name=x.name, host=x.host, port=x.port) for x in b.listeners],
            rack=b.rack or "",
            fenced=b.fenced,
            in_controlled_shutdown=b.in_controlled_shutdown,
            metadata_offset=sessions_metadata_offsets.get(broker_id, -1),
            partitions=replicas[broker_id],
            leaders=leaders[broker_id],
        )
    return response


def _count_partitions(image: MetadataImage) -> tuple[int, Counter[int], Counter[int]]:
    """The partitions, and the replicas and leaderships per broker: one pass over all."""
    partitions = [p for t in image.topics.values() for p in t.partitions.values()]
    replicas = Counter(chain.from_iterable(p.replicas for p in partitions))
    return len(partitions), replicas, Counter(p.leader for p in partitions)
