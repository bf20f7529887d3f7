"""A BROKER config resource's name is read by one rule on the broker and on the controller:
Kafka's, Java's Integer.parseInt (ConfigHelper.resourceNameToBrokerId for DescribeConfigs,
ConfigAdminManager.validateResourceNameIsCurrentNodeId for the alter requests,
ControllerConfigurationValidator.validateBrokerName on the controller). So "01" and "+1" name
broker 1, for describing and altering alike; what is altered is kept under "1", the name the
broker reads (Kafka keeps it under "01", where its brokers never read it). In process, the
controller's real decisions behind the broker (test_dispatcher_answers.py's harness, broker 1).
"""

from __future__ import annotations

from typing import Any

import pytest
from test_dispatcher import ME, Harness
from test_dispatcher_answers import (
    BROKER_RESOURCE,
    DYNAMIC_BROKER,
    SET,
    alter_incrementally,
    alter_legacy,
    broker,
    config_resource,
)

from broker.protocol import ApiKey, ErrorCode
from controller.records import ConfigResourceType

__all__ = ["broker"]  # the fixture

SPELLINGS = ["01", "+1", "0001"]


def describe(harness: Harness, name: str) -> tuple[str, int, dict[str, tuple[str, int]]]:
    resource = {"resource_type": BROKER_RESOURCE, "resource_name": name, "configuration_keys": None}
    body = {"resources": [resource], "include_synonyms": False, "include_documentation": False}
    (result,) = harness.ask(ApiKey.DESCRIBE_CONFIGS, 4, body).results
    configs = {c.name: (c.value, c.config_source) for c in result.configs}
    return result.resource_name, result.error_code, configs


def entries(harness: Harness) -> dict[str, str]:
    return dict(harness.image.configs.get((ConfigResourceType.BROKER, str(ME)), {}))


@pytest.mark.parametrize("name", SPELLINGS)
def test_describing_a_spelling_of_this_broker_s_id_describes_this_broker(
    broker: Harness, name: str
) -> None:
    assert alter_incrementally(
        broker, config_resource(BROKER_RESOURCE, str(ME), ("log.retention.ms", SET, "1000"))
    ) == [(str(ME), ErrorCode.NONE, None)]
    _, _, plain = describe(broker, str(ME))
    assert plain["log.retention.ms"] == ("1000", DYNAMIC_BROKER)
    assert describe(broker, name) == (name, ErrorCode.NONE, plain)


@pytest.mark.parametrize("name", SPELLINGS)
def test_altering_a_spelling_of_this_broker_s_id_alters_this_broker(
    broker: Harness, name: str
) -> None:
    change = config_resource(BROKER_RESOURCE, name, ("log.retention.ms", SET, "1000"))
    assert alter_incrementally(broker, change) == [(name, ErrorCode.NONE, None)]
    assert entries(broker) == {"log.retention.ms": "1000"}
    (_, forwarded), *_ = broker.controller.calls
    assert [r.resource_name for r in forwarded.resources] == [str(ME)]
    # AlterConfigs replaces the whole set: what it leaves out of broker 1's is deleted.
    replacing = config_resource(BROKER_RESOURCE, name, ("log.roll.ms", SET, "5000"))
    assert alter_legacy(broker, replacing) == [(name, ErrorCode.NONE, None)]
    assert entries(broker) == {"log.roll.ms": "5000"}
    assert describe(broker, str(ME))[2]["log.roll.ms"] == ("5000", DYNAMIC_BROKER)


def test_names_that_are_not_this_broker_s_id_are_refused_without_forwarding(
    broker: Harness,
) -> None:
    def refused(name: str) -> Any:
        return alter_incrementally(
            broker, config_resource(BROKER_RESOURCE, name, ("log.retention.ms", SET, "1"))
        )

    assert refused("-1") == [
        ("-1", ErrorCode.INVALID_REQUEST, f"Unexpected broker id, expected {ME}, but received -1")
    ]
    assert refused(" 1") == [
        (" 1", ErrorCode.INVALID_REQUEST, "Node id must be an integer, but it is:  1")
    ]
    assert describe(broker, "1_0")[1] == ErrorCode.INVALID_REQUEST
    assert broker.controller.calls == []
