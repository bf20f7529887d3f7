"""Config, producer-id and describe-cluster decisions: one test per rule, named after it.

Images are built by replaying records through ``MetadataDelta``, and every decision's records
are replayed the same way, to prove they apply and that the image then says what the answer
said. A refused request (or resource) must leave no records behind.
"""

from __future__ import annotations

import pytest

from controller import records as rec
from controller.configs import (
    BROKER_CONFIGS,
    TOPIC_CONFIGS,
    allocate_producer_ids,
    describe_cluster,
    describe_topic_configs,
    incremental_alter_configs,
    topic_log_config,
    validate_topic_configs,
)
from controller.image import MetadataDelta, MetadataImage
from controller.outcome import DecisionError
from controller.records import ConfigResourceType, MetadataRecord
from proto import controller_pb2 as cpb
from proto import metadata_pb2 as mpb
from storage.batch import TimestampType
from storage.config import LogConfig

TOPIC = ConfigResourceType.TOPIC
BROKER = ConfigResourceType.BROKER
ORDERS = bytes(range(16))


def replay(
    image: MetadataImage, records: tuple[MetadataRecord, ...] | list[MetadataRecord]
) -> MetadataImage:
    delta = MetadataDelta(image)
    for offset, record in enumerate(records, start=image.offset + 1):
        delta.replay(record, offset)
    return delta.apply()


def cluster(*extra: MetadataRecord) -> MetadataImage:
    """Brokers 1-3 (epochs 101-103, racks r1, r2, none), unfenced; topic "orders" with two
    partitions of three replicas; then ``extra``."""
    records: list[MetadataRecord] = []
    for b, rack in ((1, "r1"), (2, "r2"), (3, None)):
        records.append(
            rec.register_broker(b, 100 + b, bytes([b]) * 16, [("PLAINTEXT", f"h{b}", 9092)], rack)
        )
        records.append(rec.unfence_broker(b, 100 + b))
    records += [
        rec.topic("orders", ORDERS),
        rec.partition(ORDERS, 0, [1, 2, 3], [1, 2, 3], leader=1),
        rec.partition(ORDERS, 1, [2, 3, 1], [2, 3], leader=2),
    ]
    return replay(MetadataImage.EMPTY, [*records, *extra])


def alter(
    resource_type: ConfigResourceType,
    name: str,
    *changes: tuple[str, int, str],
    validate_only: bool = False,
) -> cpb.IncrementalAlterConfigsRequest:
    request = cpb.IncrementalAlterConfigsRequest(validate_only=validate_only)
    resource = request.resources.add(resource_type=resource_type.name, resource_name=name)
    for key, op, value in changes:
        resource.configs.add(name=key, op=op, value=value)
    return request


def set_(key: str, value: str) -> tuple[str, int, str]:
    return (key, cpb.SET, value)


def delete(key: str) -> tuple[str, int, str]:
    return (key, cpb.DELETE, "")


def refused(
    image: MetadataImage, request: cpb.IncrementalAlterConfigsRequest
) -> cpb.ResourceResult:
    """The only resource's result, which must be an error; and no records."""
    outcome = incremental_alter_configs(image, request)
    assert outcome.records == ()
    (result,) = outcome.response.resources
    assert result.error != cpb.NONE and result.message
    return result


# -- IncrementalAlterConfigs: topics -----------------------------------------------------------


def test_set_topic_config_writes_a_config_record_the_image_then_holds() -> None:
    image = cluster()
    outcome = incremental_alter_configs(
        image,
        alter(TOPIC, "orders", set_("retention.ms", "3600000"), set_("cleanup.policy", "compact")),
    )
    (result,) = outcome.response.resources
    assert (result.error, result.resource_name, result.resource_type) == (
        cpb.NONE,
        "orders",
        mpb.TOPIC,
    )
    after = replay(image, outcome.records)
    assert after.configs[(TOPIC, "orders")] == {
        "retention.ms": "3600000",
        "cleanup.policy": "compact",
    }


def test_delete_topic_config_writes_a_record_without_a_value() -> None:
    image = cluster(rec.config(TOPIC, "orders", "retention.ms", "1000"))
    outcome = incremental_alter_configs(image, alter(TOPIC, "orders", delete("retention.ms")))
    (record,) = outcome.records
    assert not record.config.HasField("value")
    assert (TOPIC, "orders") not in replay(image, outcome.records).configs


def test_only_changed_entries_become_records() -> None:
    image = cluster(rec.config(TOPIC, "orders", "retention.ms", "1000"))
    request = alter(TOPIC, "orders", set_("retention.ms", "1000"), delete("segment.ms"))
    outcome = incremental_alter_configs(image, request)
    assert outcome.records == ()
    assert outcome.response.resources[0].error == cpb.NONE


@pytest.mark.parametrize(
    ("key", "given", "committed"),
    [
        ("retention.ms", " 100 ", "100"),
        ("retention.ms", "-1", "-1"),
        ("cleanup.policy", "delete,compact", "compact,delete"),
        ("cleanup.policy", "compact, delete", "compact,delete"),
        ("min.cleanable.dirty.ratio", ".25", "0.25"),
        ("message.timestamp.type", "LogAppendTime", "LogAppendTime"),
    ],
)
def test_values_are_committed_as_canonical_text(key: str, given: str, committed: str) -> None:
    image = cluster()
    outcome = incremental_alter_configs(image, alter(TOPIC, "orders", set_(key, given)))
    assert replay(image, outcome.records).configs[(TOPIC, "orders")] == {key: committed}


def test_unknown_topic_config_name_is_invalid_config() -> None:
    result = refused(cluster(), alter(TOPIC, "orders", set_("retention.hours", "1")))
    assert result.error == cpb.INVALID_CONFIG
    assert "unknown topic config 'retention.hours'" in result.message
    assert "retention.ms" in result.message  # the supported names are listed


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("segment.bytes", "abc", "not an integer"),
        ("segment.bytes", "5", "below the minimum 1048576"),
        ("segment.bytes", "1048575", "below the minimum 1048576"),  # Kafka 4's
        ("segment.bytes", str(2**31), "above the maximum"),
        ("retention.ms", "-2", "retention_ms must be at least 0"),
        ("retention.ms", "1.5", "not an integer"),
        ("cleanup.policy", "forever", "not delete, compact"),
        ("min.cleanable.dirty.ratio", "1.5", "not between 0 and 1"),
        ("min.cleanable.dirty.ratio", "nan", "not a decimal number"),
        ("message.timestamp.type", "Now", "not CreateTime or LogAppendTime"),
        ("min.insync.replicas", "0", "below the minimum 1"),
        ("max.message.bytes", "", "not an integer"),
        ("unclean.leader.election.enable", "yes", "not true or false"),
    ],
)
def test_impossible_topic_config_values_are_invalid_config(key: str, value: str, why: str) -> None:
    result = refused(cluster(), alter(TOPIC, "orders", set_(key, value)))
    assert result.error == cpb.INVALID_CONFIG
    assert f"invalid value {value!r} for config {key!r}" in result.message
    assert why in result.message


def test_a_value_longer_than_the_limit_is_invalid_config_and_not_echoed_whole() -> None:
    value = "1" * 100_000 + "x"  # also: the ratio pattern must not backtrack on it
    result = refused(cluster(), alter(TOPIC, "orders", set_("min.cleanable.dirty.ratio", value)))
    assert result.error == cpb.INVALID_CONFIG
    assert "longer than 1000 characters" in result.message and len(result.message) < 300


def test_a_long_malformed_decimal_within_the_limit_is_refused_as_not_a_decimal() -> None:
    value = "0." + "1" * 990 + "x"
    result = refused(cluster(), alter(TOPIC, "orders", set_("min.cleanable.dirty.ratio", value)))
    assert "not a decimal number" in result.message


def test_settings_are_checked_together_with_the_topic_s_current_entries() -> None:
    image = cluster(rec.config(TOPIC, "orders", "segment.ms", "1000"))
    result = refused(image, alter(TOPIC, "orders", set_("segment.jitter.ms", "1000")))
    assert result.error == cpb.INVALID_CONFIG
    assert "segment_jitter_ms must be below segment_ms" in result.message


APPEND, SUBTRACT = 2, 3  # Kafka's OpType ids, in AlterConfigOp's open enum


def test_append_adds_the_values_not_yet_in_a_list_config_to_its_default() -> None:
    image = cluster()  # cleanup.policy unset: the default, "delete", is appended to
    outcome = incremental_alter_configs(
        image, alter(TOPIC, "orders", ("cleanup.policy", APPEND, "compact,delete"))
    )
    assert outcome.response.resources[0].error == cpb.NONE
    assert replay(image, outcome.records).configs[(TOPIC, "orders")] == {
        "cleanup.policy": "compact,delete"
    }


def test_subtract_removes_values_and_the_result_is_checked_as_a_set() -> None:
    image = cluster(rec.config(TOPIC, "orders", "cleanup.policy", "compact,delete"))
    outcome = incremental_alter_configs(
        image, alter(TOPIC, "orders", ("cleanup.policy", SUBTRACT, "delete"))
    )
    assert replay(image, outcome.records).configs[(TOPIC, "orders")] == {
        "cleanup.policy": "compact"
    }
    emptied = alter(TOPIC, "orders", ("cleanup.policy", SUBTRACT, "compact,delete"))
    result = refused(image, emptied)
    assert result.error == cpb.INVALID_CONFIG and "not delete, compact" in result.message


def test_append_and_subtract_work_on_the_broker_default_cleanup_policy() -> None:
    image = cluster()
    outcome = incremental_alter_configs(
        image, alter(BROKER, "", ("log.cleanup.policy", APPEND, "compact"))
    )
    image = replay(image, outcome.records)
    assert image.configs[(BROKER, "")] == {"log.cleanup.policy": "compact,delete"}
    outcome = incremental_alter_configs(
        image, alter(BROKER, "", ("log.cleanup.policy", SUBTRACT, "compact"))
    )
    assert replay(image, outcome.records).configs[(BROKER, "")] == {"log.cleanup.policy": "delete"}


@pytest.mark.parametrize(
    ("kind", "key", "op"),
    [
        (TOPIC, "retention.ms", APPEND),
        (TOPIC, "compression.type", SUBTRACT),
        (BROKER, "log.retention.ms", APPEND),
    ],
)
def test_append_or_subtract_to_a_config_that_is_not_a_list_is_invalid_config(
    kind: ConfigResourceType, key: str, op: int
) -> None:
    result = refused(cluster(), alter(kind, "orders" if kind == TOPIC else "", (key, op, "1")))
    name = {APPEND: "APPEND", SUBTRACT: "SUBTRACT"}[op]
    assert (result.error, result.message) == (
        cpb.INVALID_CONFIG,
        f"Can't {name} to key {key} because its type is not LIST.",
    )


def test_append_to_an_unknown_name_is_refused_as_unknown() -> None:
    result = refused(cluster(), alter(TOPIC, "orders", ("retention.hours", APPEND, "1")))
    assert result.error == cpb.INVALID_CONFIG and "unknown topic config" in result.message


@pytest.mark.parametrize(
    ("given", "committed", "field"),
    [("60000", "60000", 60_000), ("0", "0", 0), (str(2**63 - 1), str(2**63 - 1), None)],
)
def test_the_timestamp_bounds_are_settable_and_the_longest_one_means_no_limit(
    given: str, committed: str, field: int | None
) -> None:
    image = cluster()
    for key in ("message.timestamp.after.max.ms", "message.timestamp.before.max.ms"):
        outcome = incremental_alter_configs(image, alter(TOPIC, "orders", set_(key, given)))
        assert outcome.response.resources[0].error == cpb.NONE
        entries = replay(image, outcome.records).configs[(TOPIC, "orders")]
        assert entries == {key: committed}
        log = topic_log_config(entries, LogConfig())
        assert getattr(log, key.replace(".", "_")) == field


def test_a_negative_timestamp_bound_is_invalid_config() -> None:
    result = refused(
        cluster(), alter(TOPIC, "orders", set_("message.timestamp.after.max.ms", "-1"))
    )
    assert result.error == cpb.INVALID_CONFIG, result


@pytest.mark.parametrize(
    ("key", "given", "committed"),
    [
        ("compression.type", "producer", "producer"),
        ("preallocate", "False", "false"),
        ("max.compaction.lag.ms", str(2**63 - 1), str(2**63 - 1)),
        ("file.delete.delay.ms", "0", "0"),
        ("local.retention.ms", "-2", "-2"),
        ("remote.storage.enable", "false", "false"),
        ("leader.replication.throttled.replicas", "", ""),
        ("compression.zstd.level", "3", "3"),
    ],
)
def test_kafka_configs_runnel_does_not_implement_accept_what_runnel_does(
    key: str, given: str, committed: str
) -> None:
    image = cluster()
    outcome = incremental_alter_configs(image, alter(TOPIC, "orders", set_(key, given)))
    assert outcome.response.resources[0].error == cpb.NONE
    entries = replay(image, outcome.records).configs[(TOPIC, "orders")]
    assert entries == {key: committed}
    assert (key, committed, True) in describe_topic_configs(entries, LogConfig())


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "compression.type",
            "zstd",
            "compression.type=zstd is not supported: runnel stores batches as the producer "
            "compressed them (compression.type=producer)",
        ),
        (
            "preallocate",
            "true",
            "preallocate=true is not supported: runnel does not preallocate segment files "
            "(preallocate=false)",
        ),
        (
            "follower.replication.throttled.replicas",
            "*",
            "follower.replication.throttled.replicas=* is not supported: runnel does not "
            "throttle replication (follower.replication.throttled.replicas='')",
        ),
    ],
)
def test_kafka_configs_runnel_does_not_implement_refuse_other_values_saying_so(
    key: str, value: str, message: str
) -> None:
    result = refused(cluster(), alter(TOPIC, "orders", set_(key, value)))
    assert (result.error, result.message) == (cpb.INVALID_CONFIG, message)
    with pytest.raises(DecisionError, match="is not supported"):  # CreateTopics too
        validate_topic_configs([(key, value)], LogConfig())


def test_a_config_kafka_4_no_longer_knows_stays_unknown() -> None:
    result = refused(
        cluster(), alter(TOPIC, "orders", set_("message.downconversion.enable", "true"))
    )
    assert "unknown topic config" in result.message


@pytest.mark.parametrize("key", ["flush.messages", "flush.ms"])
def test_flush_settings_take_at_least_one_and_show_never_as_kafka_s_maximum(key: str) -> None:
    never = str(2**63 - 1)
    assert (key, never, False) in describe_topic_configs({}, LogConfig())
    for value in ("-1", "0"):
        result = refused(cluster(), alter(TOPIC, "orders", set_(key, value)))
        assert result.error == cpb.INVALID_CONFIG and "below the minimum 1" in result.message
    image = cluster()
    outcome = incremental_alter_configs(image, alter(TOPIC, "orders", set_(key, never)))
    entries = replay(image, outcome.records).configs[(TOPIC, "orders")]
    assert entries == {key: never}
    assert topic_log_config(entries, LogConfig()) == LogConfig()  # never: no flush by this
    assert topic_log_config({key: "-1"}, LogConfig()) == LogConfig()  # as committed before


@pytest.mark.parametrize("value", ["-1", "-2", str(-(2**63))])
def test_any_negative_retention_bytes_is_unlimited(value: str) -> None:
    image = cluster(rec.config(TOPIC, "orders", "retention.bytes", "1000"))
    outcome = incremental_alter_configs(
        image, alter(TOPIC, "orders", set_("retention.bytes", value))
    )
    entries = replay(image, outcome.records).configs[(TOPIC, "orders")]
    assert entries == {"retention.bytes": "-1"}
    assert topic_log_config(entries, LogConfig()).retention_bytes is None


def test_alter_configs_of_an_unknown_topic_is_unknown_topic_or_partition() -> None:
    result = refused(cluster(), alter(TOPIC, "nope", set_("retention.ms", "1")))
    assert result.error == cpb.UNKNOWN_TOPIC_OR_PARTITION
    assert "'nope'" in result.message


def test_alter_configs_checks_a_topic_name_before_looking_it_up() -> None:
    """Kafka's controller (ControllerConfigurationValidator.validateTopicName): no default
    topic resource, and a name that breaks the rules is INVALID_TOPIC_EXCEPTION, not
    unknown."""
    empty = refused(cluster(), alter(TOPIC, "", set_("retention.ms", "1")))
    assert (empty.error, empty.message) == (
        cpb.INVALID_REQUEST,
        "Default topic resources are not allowed.",
    )
    for name in ("bad name!", "..", "x" * 250):
        result = refused(cluster(), alter(TOPIC, name, set_("retention.ms", "1")))
        assert result.error == cpb.INVALID_TOPIC_EXCEPTION, name
    assert refused(cluster(), alter(TOPIC, "ok.name", set_("retention.ms", "1"))).error == (
        cpb.UNKNOWN_TOPIC_OR_PARTITION  # legal and absent
    )


def test_deleting_an_unknown_config_name_is_invalid_config() -> None:
    result = refused(cluster(), alter(TOPIC, "orders", delete("retention.msec")))
    assert result.error == cpb.INVALID_CONFIG


def test_a_resource_applies_all_of_its_changes_or_none() -> None:
    request = alter(TOPIC, "orders", set_("retention.ms", "1"), set_("segment.bytes", "x"))
    assert refused(cluster(), request).error == cpb.INVALID_CONFIG


def test_a_config_named_twice_in_one_resource_is_invalid_request() -> None:
    request = alter(TOPIC, "orders", set_("retention.ms", "1"), delete("retention.ms"))
    result = refused(cluster(), request)
    assert result.error == cpb.INVALID_REQUEST
    assert "'retention.ms' is given twice" in result.message


def test_a_resource_named_twice_is_refused_both_times() -> None:
    request = alter(TOPIC, "orders", set_("retention.ms", "1"))
    request.resources.add().CopyFrom(request.resources[0])
    outcome = incremental_alter_configs(cluster(), request)
    assert outcome.records == ()
    assert [r.error for r in outcome.response.resources] == [cpb.INVALID_REQUEST] * 2


def test_resources_are_answered_one_by_one() -> None:
    image = cluster()
    request = alter(TOPIC, "nope", set_("retention.ms", "1"))
    request.resources.add(resource_type=mpb.TOPIC, resource_name="orders").configs.add(
        name="retention.ms", op=cpb.SET, value="5"
    )
    outcome = incremental_alter_configs(image, request)
    assert [r.error for r in outcome.response.resources] == [
        cpb.UNKNOWN_TOPIC_OR_PARTITION,
        cpb.NONE,
    ]
    assert replay(image, outcome.records).configs[(TOPIC, "orders")] == {"retention.ms": "5"}


def test_validate_only_answers_as_if_altered_and_writes_nothing() -> None:
    request = alter(TOPIC, "orders", set_("retention.ms", "1"), validate_only=True)
    outcome = incremental_alter_configs(cluster(), request)
    assert outcome.records == ()
    assert outcome.response.resources[0].error == cpb.NONE
    request = alter(TOPIC, "orders", set_("retention.ms", "x"), validate_only=True)
    assert (
        incremental_alter_configs(cluster(), request).response.resources[0].error
        == cpb.INVALID_CONFIG
    )


def test_an_unknown_operation_is_invalid_request() -> None:
    result = refused(cluster(), alter(TOPIC, "orders", ("retention.ms", 7, "1")))
    assert result.error == cpb.INVALID_REQUEST


def test_an_unknown_resource_type_is_invalid_request() -> None:
    request = cpb.IncrementalAlterConfigsRequest()
    request.resources.add(resource_type=mpb.CONFIG_RESOURCE_UNKNOWN, resource_name="orders")
    assert refused(cluster(), request).error == cpb.INVALID_REQUEST


# -- IncrementalAlterConfigs: brokers ----------------------------------------------------------


def test_cluster_default_broker_configs_are_set_under_the_empty_name() -> None:
    image = cluster()
    request = alter(
        BROKER,
        "",
        set_("log.retention.ms", "60000"),
        set_("unclean.leader.election.enable", "TRUE"),
    )
    outcome = incremental_alter_configs(image, request)
    assert replay(image, outcome.records).configs[(BROKER, "")] == {
        "log.retention.ms": "60000",
        "unclean.leader.election.enable": "true",
    }


def test_a_broker_id_resource_gets_its_own_entries() -> None:
    image = cluster(rec.config(BROKER, "2", "message.max.bytes", "2000"))
    request = alter(BROKER, "2", set_("log.roll.ms", "5000"), delete("message.max.bytes"))
    outcome = incremental_alter_configs(image, request)
    assert replay(image, outcome.records).configs[(BROKER, "2")] == {"log.roll.ms": "5000"}


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("abc", "Unable to parse broker name as a base 10 number."),
        (" 1", "Unable to parse broker name as a base 10 number."),
        ("1_0", "Unable to parse broker name as a base 10 number."),
        ("+", "Unable to parse broker name as a base 10 number."),
        ("2147483648", "Unable to parse broker name as a base 10 number."),  # over 32 bits
        ("-1", "Invalid negative broker ID."),
    ],
)
def test_a_broker_resource_name_must_be_empty_or_a_broker_id(name: str, message: str) -> None:
    """Kafka's ControllerConfigurationValidator.validateBrokerName (Integer.valueOf)."""
    result = refused(cluster(), alter(BROKER, name, set_("log.retention.ms", "1")))
    assert (result.error, result.message) == (cpb.INVALID_REQUEST, message)


@pytest.mark.parametrize("name", ["01", "+1", "\u0661", "0001"])
def test_a_broker_id_spelt_as_java_reads_it_names_that_broker_s_entries(name: str) -> None:
    """Java's Integer.parseInt reads "01", "+1" and an Arabic-Indic one as 1, as the broker
    does: the entries are broker 1's, kept under "1" where brokers read them."""
    image = cluster(rec.config(BROKER, "1", "log.roll.ms", "5000"))
    outcome = incremental_alter_configs(image, alter(BROKER, name, set_("log.retention.ms", "7")))
    assert [(r.resource_name, r.error) for r in outcome.response.resources] == [(name, cpb.NONE)]
    assert replay(image, outcome.records).configs[(BROKER, "1")] == {
        "log.roll.ms": "5000",
        "log.retention.ms": "7",
    }
    twice = alter(BROKER, name, set_("log.retention.ms", "8"))
    twice.resources.extend(alter(BROKER, "1", set_("log.roll.ms", "9")).resources)
    outcome = incremental_alter_configs(image, twice)
    assert [r.error for r in outcome.response.resources] == [cpb.INVALID_REQUEST] * 2
    assert outcome.records == ()


def test_unknown_broker_config_name_is_invalid_config() -> None:
    result = refused(cluster(), alter(BROKER, "", set_("log.retention.minutes", "1")))
    assert result.error == cpb.INVALID_CONFIG
    assert "unknown broker config 'log.retention.minutes'" in result.message
    # A topic-level name is not a broker config either.
    assert (
        refused(cluster(), alter(BROKER, "", set_("retention.ms", "1"))).error == cpb.INVALID_CONFIG
    )


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("unclean.leader.election.enable", "yes"),
        ("log.segment.bytes", "12"),
        ("log.cleanup.policy", "keep"),
        ("min.insync.replicas", "-1"),
    ],
)
def test_impossible_broker_config_values_are_invalid_config(key: str, value: str) -> None:
    assert refused(cluster(), alter(BROKER, "1", set_(key, value))).error == cpb.INVALID_CONFIG


def test_every_broker_config_maps_to_a_topic_config() -> None:
    for name, topic_name in BROKER_CONFIGS.items():
        assert topic_name in TOPIC_CONFIGS, name


# -- the helpers create_topics and brokers use -------------------------------------------------


def test_topic_log_config_lays_a_topic_s_entries_over_the_defaults() -> None:
    entries = {
        "retention.ms": "-1",
        "message.timestamp.type": "LogAppendTime",
        "min.insync.replicas": "2",
    }
    config = topic_log_config(entries, LogConfig(segment_bytes=4096))
    assert config == LogConfig(
        segment_bytes=4096, retention_ms=None, message_timestamp_type=TimestampType.LOG_APPEND_TIME
    )


def test_unclean_leader_election_is_a_topic_config_too() -> None:
    # Kafka's per-topic override of the broker default; the elections read it
    # (tests/controller/test_elections.py).
    canonical = validate_topic_configs([("unclean.leader.election.enable", "TRUE")], LogConfig())
    assert canonical == {"unclean.leader.election.enable": "true"}
    described = {n: (v, own) for n, v, own in describe_topic_configs({}, LogConfig())}
    assert described["unclean.leader.election.enable"] == ("false", False)


def test_validate_topic_configs_refuses_a_name_given_twice() -> None:
    with pytest.raises(DecisionError) as e:
        validate_topic_configs([("retention.ms", "1"), ("retention.ms", "2")], LogConfig())
    assert e.value.code == cpb.INVALID_REQUEST


# -- AllocateProducerIds -----------------------------------------------------------------------


def test_allocate_producer_ids_hands_out_consecutive_blocks() -> None:
    image = cluster()
    first = allocate_producer_ids(
        image, cpb.AllocateProducerIdsRequest(broker_id=1, broker_epoch=101)
    )
    assert (first.response.producer_id_start, first.response.producer_id_len) == (0, 1000)
    image = replay(image, first.records)
    assert image.next_producer_id == 1000
    second = allocate_producer_ids(
        image, cpb.AllocateProducerIdsRequest(broker_id=2, broker_epoch=102), block_size=10
    )
    assert (second.response.producer_id_start, second.response.producer_id_len) == (1000, 10)
    assert replay(image, second.records).next_producer_id == 1010


def test_allocate_producer_ids_for_an_unregistered_broker_is_refused() -> None:
    with pytest.raises(DecisionError) as e:
        allocate_producer_ids(
            cluster(), cpb.AllocateProducerIdsRequest(broker_id=9, broker_epoch=1)
        )
    assert e.value.code == cpb.BROKER_ID_NOT_REGISTERED
    assert "broker 9 is not registered" in e.value.message


def test_allocate_producer_ids_with_a_stale_broker_epoch_is_refused() -> None:
    with pytest.raises(DecisionError) as e:
        allocate_producer_ids(
            cluster(), cpb.AllocateProducerIdsRequest(broker_id=1, broker_epoch=100)
        )
    assert e.value.code == cpb.STALE_BROKER_EPOCH
    assert "epoch 101, not 100" in e.value.message


def test_allocate_producer_ids_serves_a_fenced_broker() -> None:
    image = cluster(rec.fence_broker(3, 103))
    outcome = allocate_producer_ids(
        image, cpb.AllocateProducerIdsRequest(broker_id=3, broker_epoch=103)
    )
    assert replay(image, outcome.records).next_producer_id == 1000


def test_allocate_producer_ids_refuses_when_the_ids_run_out() -> None:
    image = cluster(rec.producer_ids(1, 101, 2**63 - 500))
    with pytest.raises(DecisionError) as e:
        allocate_producer_ids(image, cpb.AllocateProducerIdsRequest(broker_id=1, broker_epoch=101))
    assert e.value.code == cpb.UNKNOWN_SERVER_ERROR


# -- DescribeCluster ---------------------------------------------------------------------------


def test_describe_cluster_counts_replicas_leaders_topics_and_partitions() -> None:
    image = cluster(
        rec.fence_broker(3, 103),
        rec.broker_registration_change(2, 102, in_controlled_shutdown=True),
    )
    response = describe_cluster(image, {1: 40, 2: 38}, controller_epoch=7, committed_offset=42)
    assert (response.controller_epoch, response.metadata_offset) == (7, 42)
    assert (response.topics, response.partitions) == (1, 2)
    assert response.image_digest == image.digest()
    described = {
        b.broker_id: (
            b.broker_epoch,
            b.rack,
            b.fenced,
            b.in_controlled_shutdown,
            b.metadata_offset,
            b.partitions,
            b.leaders,
        )
        for b in response.brokers
    }
    assert described == {
        1: (101, "r1", False, False, 40, 2, 1),
        2: (102, "r2", False, True, 38, 2, 1),
        3: (103, "", True, False, -1, 2, 0),
    }
    assert [b.broker_id for b in response.brokers] == [1, 2, 3]
    assert list(response.brokers[0].listeners) == [
        mpb.Listener(name="PLAINTEXT", host="h1", port=9092)
    ]


def test_describe_cluster_uses_a_digest_the_caller_already_has() -> None:
    response = describe_cluster(cluster(), {}, 1, 5, image_digest="cafe")
    assert response.image_digest == "cafe"


def test_describe_cluster_of_an_empty_image() -> None:
    response = describe_cluster(MetadataImage.EMPTY, {}, 0, -1)
    assert (response.topics, response.partitions, len(response.brokers)) == (0, 0, 0)
    assert response.image_digest == MetadataImage.EMPTY.digest()
