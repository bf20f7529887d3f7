"""DescribeConfigs of a topic answers the value in force and where it comes from, in the order
the broker's replicas and the controller's elections resolve it (broker/handlers/configs.py):
the topic's own entry, this broker's dynamic broker config, the cluster-wide one, the node's
``[log]`` section or the built-in default; ``unclean.leader.election.enable`` skips this
broker's own value, as the elections do. Also which names and keys it answers for, as Kafka's
ConfigHelper. Through the real dispatcher and codec, in process (the harness of
test_dispatcher.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_dispatcher import ME, Harness

import broker.handlers.configs as configs_handler
from broker.handlers.topic_configs import effective_topic_configs
from broker.protocol import ApiKey
from controller import records as rec
from controller.image import MetadataDelta

TOPIC, BROKER = rec.ConfigResourceType.TOPIC, rec.ConfigResourceType.BROKER
# Kafka's ConfigSource codes
TOPIC_CONFIG, DYNAMIC_BROKER, DYNAMIC_DEFAULT_BROKER, DEFAULT = 1, 2, 3, 5
UNKNOWN_TOPIC_OR_PARTITION, INVALID_TOPIC_EXCEPTION, INVALID_REQUEST = 3, 17, 42


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Harness]:
    harness = Harness(tmp_path / "data", auto_create=False)
    yield harness
    harness.logs.shutdown()


def configure(harness: Harness, *entries: tuple[rec.ConfigResourceType, str, str, str]) -> None:
    delta = MetadataDelta(harness.image)
    for offset, (kind, resource, name, value) in enumerate(entries, harness.image.offset + 1):
        delta.replay(rec.config(kind, resource, name, value), offset)
    harness.image = delta.apply()


def described(harness: Harness, topic: str = "orders") -> dict[str, tuple[str, int]]:
    resource = {"resource_type": int(TOPIC), "resource_name": topic, "configuration_keys": None}
    answer = harness.ask(ApiKey.DESCRIBE_CONFIGS, 4, {"resources": [resource]})
    (result,) = answer.results
    assert result.error_code == 0, result.error_message
    return {c.name: (c.value, c.config_source) for c in result.configs}


def test_a_topic_s_configs_come_from_the_nearest_layer_that_sets_them(broker: Harness) -> None:
    before = described(broker)
    assert before["min.insync.replicas"] == ("1", DEFAULT)
    assert before["unclean.leader.election.enable"] == ("false", DEFAULT)
    configure(
        broker,
        (BROKER, "", "min.insync.replicas", "2"),
        (BROKER, "", "log.retention.ms", "1000"),
        (BROKER, str(ME), "log.retention.ms", "60000"),  # this broker's: nearer
        (BROKER, str(ME + 1), "log.segment.bytes", "4096"),  # another broker's: not here
        (TOPIC, "orders", "segment.ms", "5000"),
        (BROKER, "", "log.roll.ms", "7000"),  # segment.ms's default: the topic's wins
    )
    after = described(broker)
    assert after["min.insync.replicas"] == ("2", DYNAMIC_DEFAULT_BROKER)
    assert after["retention.ms"] == ("60000", DYNAMIC_BROKER)
    assert after["segment.ms"] == ("5000", TOPIC_CONFIG)
    assert after["segment.bytes"] == before["segment.bytes"]


def test_unclean_election_is_shown_as_the_elections_read_it(broker: Harness) -> None:
    configure(broker, (BROKER, str(ME), "unclean.leader.election.enable", "true"))
    assert described(broker)["unclean.leader.election.enable"] == ("false", DEFAULT)
    configure(broker, (BROKER, "", "unclean.leader.election.enable", "true"))
    assert described(broker)["unclean.leader.election.enable"] == ("true", DYNAMIC_DEFAULT_BROKER)
    configure(broker, (TOPIC, "orders", "unclean.leader.election.enable", "false"))
    assert described(broker)["unclean.leader.election.enable"] == ("false", TOPIC_CONFIG)


def describe(harness: Harness, name: str, keys: list[str] | None) -> tuple[int, list[str]]:
    resource = {"resource_type": int(TOPIC), "resource_name": name, "configuration_keys": keys}
    (result,) = harness.ask(ApiKey.DESCRIBE_CONFIGS, 4, {"resources": [resource]}).results
    return result.error_code, [c.name for c in result.configs]


def test_an_empty_list_of_keys_asks_for_every_config_as_none_does(broker: Harness) -> None:
    everything = describe(broker, "orders", None)
    assert everything[0] == 0 and "retention.ms" in everything[1]
    assert describe(broker, "orders", []) == everything  # kafka-python's configs={}
    assert describe(broker, "orders", ["retention.ms"]) == (0, ["retention.ms"])


@pytest.mark.parametrize("name", ["a b", "", "..", "x" * 250])
def test_an_invalid_topic_name_is_invalid_topic_exception_before_it_is_looked_up(
    broker: Harness, name: str
) -> None:
    assert describe(broker, name, None) == (INVALID_TOPIC_EXCEPTION, [])


def test_a_valid_name_of_no_topic_is_unknown_topic_or_partition(broker: Harness) -> None:
    for name in ("missing", "__cluster_metadata"):  # Kafka does not reserve the second
        assert describe(broker, name, None) == (UNKNOWN_TOPIC_OR_PARTITION, [])


def test_kafka_configs_runnel_does_not_implement_are_described_as_what_it_does(
    broker: Harness,
) -> None:
    before = described(broker)
    assert before["compression.type"] == ("producer", DEFAULT)
    assert before["preallocate"] == ("false", DEFAULT)
    assert before["flush.messages"] == (str(2**63 - 1), DEFAULT)  # Kafka's "never"
    configure(broker, (TOPIC, "orders", "compression.type", "producer"))
    assert described(broker)["compression.type"] == ("producer", TOPIC_CONFIG)


def test_a_resource_named_again_is_described_at_its_first_place_only(
    broker: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka's ConfigHelper.describeConfigs describes every copy: 20,000 copies of one topic
    made a 112 MB answer (with synonyms and documentation) from a 200 KB request. A later
    place of the same resource (type and name; "0"-padded broker ids are one broker) is
    INVALID_REQUEST with no configs, whatever keys it asks for."""
    calls = []

    def counted(*args: Any) -> Any:
        calls.append(args)
        return effective_topic_configs(*args)

    monkeypatch.setattr(configs_handler, "effective_topic_configs", counted)

    def resource(kind: rec.ConfigResourceType, name: str, keys: list[str] | None) -> Any:
        return {"resource_type": int(kind), "resource_name": name, "configuration_keys": keys}

    orders = resource(TOPIC, "orders", None)
    some = resource(TOPIC, "orders", ["segment.ms", "retention.ms"])
    me, padded = resource(BROKER, str(ME), None), resource(BROKER, f"00{ME}", None)
    asked = [orders, resource(TOPIC, "missing", None), orders, some, me, padded]
    asked += [resource(TOPIC, "missing", None)] + [orders] * 1000
    answer = broker.ask(ApiKey.DESCRIBE_CONFIGS, 4, {"resources": asked})
    got = [(r.resource_name, r.error_code, len(r.configs)) for r in answer.results]
    every = got[0][2]
    assert every > 2 and got[4][2] > 2  # this broker described too
    duplicate = INVALID_REQUEST
    assert (
        got
        == [
            ("orders", 0, every),
            ("missing", UNKNOWN_TOPIC_OR_PARTITION, 0),
            ("orders", duplicate, 0),
            ("orders", duplicate, 0),
            (str(ME), 0, got[4][2]),
            (f"00{ME}", duplicate, 0),
            ("missing", duplicate, 0),
        ]
        + [("orders", duplicate, 0)] * 1000
    )
    assert "Duplicate resource" in answer.results[2].error_message
    assert len(calls) == 1
