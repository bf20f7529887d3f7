"""DescribeConfigs fills what Kafka's ConfigHelper fills beyond values: each config's type
(v3+, Kafka's DescribeConfigsResponse.ConfigType of its definition), a sentence on what it
does (v3+, with include_documentation) and its synonyms (v1+, with include_synonyms): every
layer that sets it, nearest first, each with its source, the first being the value and source
shown. Through the real dispatcher and codec, in process (test_dispatcher.py's harness)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from test_describe_configs import broker, configure
from test_dispatcher import ME, Harness

from broker.protocol import ApiKey
from controller import records as rec
from controller.configs import BROKER_CONFIGS, TOPIC_CONFIGS
from storage.config import LogConfig

__all__ = ["broker"]  # the fixture

TOPIC, BROKER = rec.ConfigResourceType.TOPIC, rec.ConfigResourceType.BROKER
# Kafka's ConfigSource codes
TOPIC_CONFIG, DYNAMIC_BROKER, DYNAMIC_DEFAULT_BROKER, STATIC_BROKER, DEFAULT = 1, 2, 3, 4, 5
UNCLEAN = "unclean.leader.election.enable"
# Kafka's DescribeConfigsResponse.ConfigType ids
BOOLEAN, STRING, INT, LONG, DOUBLE, LIST = 1, 2, 3, 5, 6, 7
# The types of Kafka's topic config definitions (storage/.../log/LogConfig.java, CONFIG).
KAFKA_TOPIC_TYPES = {
    "cleanup.policy": LIST,
    "compression.gzip.level": INT,
    "compression.lz4.level": INT,
    "compression.type": STRING,
    "compression.zstd.level": INT,
    "delete.retention.ms": LONG,
    "file.delete.delay.ms": LONG,
    "flush.messages": LONG,
    "flush.ms": LONG,
    "follower.replication.throttled.replicas": LIST,
    "index.interval.bytes": INT,
    "leader.replication.throttled.replicas": LIST,
    "local.retention.bytes": LONG,
    "local.retention.ms": LONG,
    "max.compaction.lag.ms": LONG,
    "max.message.bytes": INT,
    "message.timestamp.after.max.ms": LONG,
    "message.timestamp.before.max.ms": LONG,
    "message.timestamp.type": STRING,
    "min.cleanable.dirty.ratio": DOUBLE,
    "min.compaction.lag.ms": LONG,
    "min.insync.replicas": INT,
    "preallocate": BOOLEAN,
    "remote.log.copy.disable": BOOLEAN,
    "remote.log.delete.on.disable": BOOLEAN,
    "remote.storage.enable": BOOLEAN,
    "retention.bytes": LONG,
    "retention.ms": LONG,
    "segment.bytes": INT,
    "segment.index.bytes": INT,
    "segment.jitter.ms": LONG,
    "segment.ms": LONG,
    "unclean.leader.election.enable": BOOLEAN,
}
# The types of Kafka's broker config definitions (LogConfig.SERVER_CONFIG_DEF, ServerConfigs'
# message.max.bytes, ReplicationConfigs' unclean.leader.election.enable).
KAFKA_BROKER_TYPES = {
    "log.cleanup.policy": LIST,
    "log.flush.interval.messages": LONG,
    "log.flush.interval.ms": LONG,
    "log.message.timestamp.after.max.ms": LONG,
    "log.message.timestamp.before.max.ms": LONG,
    "log.retention.bytes": LONG,
    "log.retention.ms": LONG,
    "log.roll.ms": LONG,
    "log.segment.bytes": INT,
    "message.max.bytes": INT,
    "min.insync.replicas": INT,
    "unclean.leader.election.enable": BOOLEAN,
}


def with_log_section(harness: Harness, **changes: Any) -> None:
    """As if the node's [log] section set ``changes`` (the static broker layer)."""
    context = harness.dispatcher.context
    log_defaults = dataclasses.replace(LogConfig(), **changes)
    context.settings = dataclasses.replace(context.settings, log_defaults=log_defaults)


def describe(
    harness: Harness,
    kind: rec.ConfigResourceType,
    name: str,
    *,
    version: int = 4,
    synonyms: bool = False,
    documentation: bool = False,
) -> dict[str, Any]:
    resource = {"resource_type": int(kind), "resource_name": name, "configuration_keys": None}
    body = {
        "resources": [resource],
        "include_synonyms": synonyms,
        "include_documentation": documentation,
    }
    (result,) = harness.ask(ApiKey.DESCRIBE_CONFIGS, version, body).results
    assert result.error_code == 0, result.error_message
    return {c.name: c for c in result.configs}


def synonyms_of(config: Any) -> list[tuple[str, str, int]]:
    return [(s.name, s.value, s.source) for s in config.synonyms]


def test_every_config_has_the_type_of_kafka_s_definition(broker: Harness) -> None:
    assert KAFKA_TOPIC_TYPES.keys() == TOPIC_CONFIGS.keys()  # every config runnel knows
    topic = describe(broker, TOPIC, "orders")
    assert {n: c.config_type for n, c in topic.items()} == KAFKA_TOPIC_TYPES
    assert KAFKA_BROKER_TYPES.keys() == BROKER_CONFIGS.keys()
    mine = describe(broker, BROKER, str(ME))
    assert {n: c.config_type for n, c in mine.items()} == KAFKA_BROKER_TYPES


def test_documentation_only_when_asked_and_saying_what_runnel_does(broker: Harness) -> None:
    assert all(c.documentation is None for c in describe(broker, TOPIC, "orders").values())
    documented = describe(broker, TOPIC, "orders", documentation=True)
    assert all(c.documentation for c in documented.values())
    assert "MESSAGE_TOO_LARGE" in documented["max.message.bytes"].documentation
    assert documented["compression.type"].documentation == (
        "Not implemented: runnel stores batches as the producer compressed them. "
        "Only producer is accepted."
    )
    mine = describe(broker, BROKER, str(ME), documentation=True)
    assert mine["log.retention.ms"].documentation.startswith(
        "The default of topic config retention.ms for the topics that do not set it."
    )


def test_synonyms_list_every_layer_nearest_first_and_the_first_is_what_is_shown(
    broker: Harness,
) -> None:
    with_log_section(broker, retention_ms=3_600_000, segment_index_bytes=4096)
    configure(
        broker,
        (TOPIC, "orders", "retention.ms", "1000"),
        (BROKER, str(ME), "log.retention.ms", "2000"),
        (BROKER, "", "log.retention.ms", "3000"),
        (BROKER, "", "log.roll.ms", "4000"),
    )
    plain = describe(broker, TOPIC, "orders")
    assert all(c.synonyms == [] for c in plain.values())  # not asked for
    configs = describe(broker, TOPIC, "orders", synonyms=True)
    assert synonyms_of(configs["retention.ms"]) == [
        ("retention.ms", "1000", TOPIC_CONFIG),
        ("log.retention.ms", "2000", DYNAMIC_BROKER),
        ("log.retention.ms", "3000", DYNAMIC_DEFAULT_BROKER),
        ("log.retention.ms", "3600000", STATIC_BROKER),
        ("log.retention.ms", "604800000", DEFAULT),
    ]
    assert synonyms_of(configs["segment.ms"]) == [
        ("log.roll.ms", "4000", DYNAMIC_DEFAULT_BROKER),
        ("log.roll.ms", "604800000", DEFAULT),
    ]
    # No broker config sets segment.index.bytes here: its layers go by its own name.
    assert synonyms_of(configs["segment.index.bytes"]) == [
        ("segment.index.bytes", "4096", STATIC_BROKER),
        ("segment.index.bytes", "10485760", DEFAULT),
    ]
    for name, config in configs.items():
        nearest = config.synonyms[0]
        assert (nearest.value, nearest.source) == (config.value, config.config_source), name
        assert (plain[name].value, plain[name].config_source) == (nearest.value, nearest.source)


def test_unclean_election_s_synonyms_skip_this_broker_s_value_as_the_elections_do(
    broker: Harness,
) -> None:
    configure(broker, (BROKER, str(ME), "unclean.leader.election.enable", "true"))
    (config,) = [describe(broker, TOPIC, "orders", synonyms=True)[UNCLEAN]]
    assert synonyms_of(config) == [(UNCLEAN, "false", DEFAULT)]
    mine = describe(broker, BROKER, str(ME), synonyms=True)[UNCLEAN]  # the broker's own: shown
    assert synonyms_of(mine) == [(UNCLEAN, "true", DYNAMIC_BROKER), (UNCLEAN, "false", DEFAULT)]


def test_a_broker_s_synonyms_and_the_cluster_default_resource_s(broker: Harness) -> None:
    with_log_section(broker, segment_bytes=2 * 1024 * 1024)
    configure(
        broker,
        (BROKER, str(ME), "log.segment.bytes", "8388608"),
        (BROKER, "", "log.segment.bytes", "4194304"),
    )
    mine = describe(broker, BROKER, str(ME), synonyms=True)
    assert synonyms_of(mine["log.segment.bytes"]) == [
        ("log.segment.bytes", "8388608", DYNAMIC_BROKER),
        ("log.segment.bytes", "4194304", DYNAMIC_DEFAULT_BROKER),
        ("log.segment.bytes", "2097152", STATIC_BROKER),
        ("log.segment.bytes", "1073741824", DEFAULT),
    ]
    assert (mine["log.segment.bytes"].value, mine["log.segment.bytes"].config_source) == (
        "8388608",
        DYNAMIC_BROKER,
    )
    # "": Kafka's ConfigHelper keeps only the DYNAMIC_DEFAULT_BROKER_CONFIG synonyms.
    cluster_wide = describe(broker, BROKER, "", synonyms=True)
    assert {n: synonyms_of(c) for n, c in cluster_wide.items()} == {
        "log.segment.bytes": [("log.segment.bytes", "4194304", DYNAMIC_DEFAULT_BROKER)]
    }


@pytest.mark.parametrize("version", [1, 2])
def test_versions_before_3_carry_synonyms_but_no_type_or_documentation(
    broker: Harness, version: int
) -> None:
    configure(broker, (TOPIC, "orders", "retention.ms", "1000"))
    configs = describe(broker, TOPIC, "orders", version=version, synonyms=True)
    retention = configs["retention.ms"]
    assert synonyms_of(retention)[0] == ("retention.ms", "1000", TOPIC_CONFIG)
    assert retention.config_type == 0 and not retention.documentation  # not in the frame
