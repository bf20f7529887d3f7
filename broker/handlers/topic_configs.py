"""A topic's effective configs, as DescribeConfigs and CreateTopics (v5+) answer them.

How this works. Every topic config runnel knows (controller/configs.py) is listed by name with
the value in force and where it comes from (Kafka's ConfigSource), in the order the topic's
replicas here resolve it (``broker.replica_manager.topic_settings``): set on the topic, else
this broker's dynamic broker config, else the cluster-wide one, else the node's ``[log]``
section or the built-in default. ``unclean.leader.election.enable`` skips this broker's own
value, as the controller's elections do (``controller.elections``).

The caller passes the topic's own entries: DescribeConfigs those in the image, CreateTopics
those of the request (Kafka's ``computeEffectiveTopicConfigs(creationConfigs)``), so a
``validate_only`` request, whose topic is never created, is described all the same. Pure:
reads the image and settings given, nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from broker.context import BrokerContext
from controller.configs import broker_entries_as_topic, describe_topic_configs
from controller.elections import UNCLEAN_CONFIG
from controller.image import MetadataImage
from storage.config import LogConfig

__all__ = [
    "DEFAULT",
    "DYNAMIC_BROKER",
    "DYNAMIC_DEFAULT_BROKER",
    "STATIC_BROKER",
    "TOPIC_CONFIG",
    "config_entry",
    "default_source",
    "effective_topic_configs",
]

# Kafka's ConfigSource codes
TOPIC_CONFIG, DYNAMIC_BROKER, DYNAMIC_DEFAULT_BROKER, STATIC_BROKER, DEFAULT = 1, 2, 3, 4, 5


def config_entry(name: str, value: str | None, source: int) -> dict[str, Any]:
    """A DescribeConfigs entry (CreateTopics takes the fields it has of it)."""
    return {
        "name": name,
        "value": value,
        "read_only": False,
        "is_default": source in (STATIC_BROKER, DEFAULT),
        "config_source": source,
        "is_sensitive": False,
        "synonyms": [],
    }


def effective_topic_configs(
    context: BrokerContext, image: MetadataImage, entries: Mapping[str, str]
) -> list[dict[str, Any]]:
    """Every topic config, by name, for a topic whose own entries are ``entries``."""
    described = describe_topic_configs(entries, context.settings.log_defaults)
    layers = (  # the dynamic broker configs, as topic configs: the nearest first
        (DYNAMIC_BROKER, broker_entries_as_topic(image, str(context.settings.broker_id))),
        (DYNAMIC_DEFAULT_BROKER, broker_entries_as_topic(image, "")),
    )
    out = []
    for n, v, own in described:
        source = TOPIC_CONFIG if own else default_source(n, v)
        if not own:
            for layer, values in layers:
                if n in values and not (layer == DYNAMIC_BROKER and n == UNCLEAN_CONFIG):
                    v, source = values[n], layer
                    break
        out.append(config_entry(n, v, source))
    return out


def default_source(name: str, value: str) -> int:
    """DEFAULT_CONFIG where the value is runnel's own default, STATIC_BROKER_CONFIG where the
    node's ``[log]`` section changed it (as Kafka tells its defaults from server.properties)."""
    return DEFAULT if _BUILT_IN.get(name) == value else STATIC_BROKER


_BUILT_IN = {n: v for n, v, _ in describe_topic_configs({}, LogConfig())}
