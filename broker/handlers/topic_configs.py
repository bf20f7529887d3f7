"""A topic's and a broker's effective configs, as DescribeConfigs and CreateTopics (v5+)
answer them.

How this works. Every topic config runnel knows (controller/configs.py) is listed by name with
the value in force and where it comes from (Kafka's ConfigSource), in the order the topic's
replicas here resolve it (``broker.replica_manager.topic_settings``): set on the topic, else
this broker's dynamic broker config, else the cluster-wide one, else the node's ``[log]``
section (STATIC_BROKER where it differs from the built-in default), else the built-in default.
``unclean.leader.election.enable`` skips this broker's own value, as the controller's
elections do (``controller.elections``). A broker's configs (Kafka's broker names for the
topic configs they are the defaults of, ``BROKER_CONFIGS``) are the same layers without the
topic's; the resource "" (the cluster-wide defaults) lists only the entries set on it, as
Kafka's currentDynamicDefaultConfigs.

One function, ``_layers``, lists every layer that sets a config, nearest first: the entry's
value and source are its first, and its synonyms (Kafka's ConfigSynonym list, when asked) are
all of them, so the two cannot disagree. Each layer is named as Kafka's ConfigHelper names
it: the topic's own entry by the topic config's name, the others by the broker config's (or,
for a topic config no broker config sets, by its own name, as Kafka names a group config's
default that has no broker synonym). Kafka lists every layer that holds a value; here the
``[log]`` section counts as one only where it differs from the built-in default (a value set
equal to the default cannot be told apart from one not set).

The caller passes the topic's own entries: DescribeConfigs those in the image, CreateTopics
those of the request (Kafka's ``computeEffectiveTopicConfigs(creationConfigs)``), so a
``validate_only`` request, whose topic is never created, is described all the same. Pure:
reads the image and settings given, nothing else.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker.context import BrokerContext
from controller.configs import (
    BROKER_CONFIGS,
    config_doc,
    config_type,
    describe_topic_configs,
)
from controller.elections import UNCLEAN_CONFIG
from controller.image import MetadataImage
from controller.records import ConfigResourceType
from storage.config import LogConfig

__all__ = [
    "DEFAULT",
    "DYNAMIC_BROKER",
    "DYNAMIC_DEFAULT_BROKER",
    "STATIC_BROKER",
    "TOPIC_CONFIG",
    "Detail",
    "broker_configs",
    "cluster_default_configs",
    "effective_topic_configs",
]

# Kafka's ConfigSource codes
TOPIC_CONFIG, DYNAMIC_BROKER, DYNAMIC_DEFAULT_BROKER, STATIC_BROKER, DEFAULT = 1, 2, 3, 4, 5
_TOPIC, _BROKER = ConfigResourceType.TOPIC, ConfigResourceType.BROKER
_BROKER_NAME = {topic_name: name for name, topic_name in BROKER_CONFIGS.items()}


@dataclass(frozen=True, slots=True)
class Detail:
    """What DescribeConfigs asks for beyond values: its include_synonyms (v1+) and
    include_documentation (v3+)."""

    synonyms: bool = False
    documentation: bool = False


_NO_DETAIL = Detail()


@dataclass(frozen=True, slots=True)
class _BrokerLayers:
    """The layers below a topic's own entries, by broker config name: this broker's dynamic
    entries, the cluster-wide ones, and the node's static values by topic config name."""

    own: Mapping[str, str]
    cluster: Mapping[str, str]
    statics: Mapping[str, str]

    @classmethod
    def of(cls, context: BrokerContext, image: MetadataImage) -> _BrokerLayers:
        broker = int(_BROKER)
        return cls(
            image.configs.get((broker, str(context.settings.broker_id)), {}),
            image.configs.get((broker, ""), {}),
            _statics(context.settings.log_defaults),
        )


def _layers(
    layers: _BrokerLayers, topic_name: str, *, this_broker: bool
) -> list[tuple[str, str, int]]:
    """Every layer below the topic's own entry that sets ``topic_name``, nearest first, as
    (name, value, source); ``this_broker``: whether this broker's dynamic value counts."""
    name = _BROKER_NAME.get(topic_name)
    out = []
    if name is not None:
        if this_broker and name in layers.own:
            out.append((name, layers.own[name], DYNAMIC_BROKER))
        if name in layers.cluster:
            out.append((name, layers.cluster[name], DYNAMIC_DEFAULT_BROKER))
    static, built_in = layers.statics[topic_name], _BUILT_IN[topic_name]
    if static != built_in:
        out.append((name or topic_name, static, STATIC_BROKER))
    out.append((name or topic_name, built_in, DEFAULT))
    return out


def _entry(
    name: str, kind: ConfigResourceType, found: list[tuple[str, str, int]], detail: Detail
) -> dict[str, Any]:
    """A DescribeConfigs entry (CreateTopics takes the fields it has of it) whose value and
    source are the nearest layer's of ``found``."""
    _, value, source = found[0]
    return {
        "name": name,
        "value": value,
        "read_only": False,  # every config runnel knows can be altered (Kafka's are dynamic)
        "is_default": source in (STATIC_BROKER, DEFAULT),
        "config_source": source,
        "is_sensitive": False,
        "synonyms": [
            {"name": n, "value": v, "source": s} for n, v, s in (found if detail.synonyms else ())
        ],
        "config_type": config_type(name, kind),
        "documentation": config_doc(name, kind) if detail.documentation else None,
    }


def effective_topic_configs(
    context: BrokerContext,
    image: MetadataImage,
    entries: Mapping[str, str],
    detail: Detail = _NO_DETAIL,
) -> list[dict[str, Any]]:
    """Every topic config, by name, for a topic whose own entries are ``entries``."""
    layers = _BrokerLayers.of(context, image)
    out = []
    for n, v, own in describe_topic_configs(entries, context.settings.log_defaults):
        found = [(n, v, TOPIC_CONFIG)] if own else []
        found += _layers(layers, n, this_broker=n != UNCLEAN_CONFIG)
        out.append(_entry(n, _TOPIC, found, detail))
    return out


def broker_configs(
    context: BrokerContext, image: MetadataImage, detail: Detail = _NO_DETAIL
) -> list[dict[str, Any]]:
    """This broker's configs, by name: each from the nearest layer that sets it."""
    layers = _BrokerLayers.of(context, image)
    return [
        _entry(name, _BROKER, _layers(layers, BROKER_CONFIGS[name], this_broker=True), detail)
        for name in sorted(BROKER_CONFIGS)
    ]


def cluster_default_configs(
    image: MetadataImage, detail: Detail = _NO_DETAIL
) -> list[dict[str, Any]]:
    """The resource "": only the cluster-wide entries set, each its only synonym (Kafka's
    ConfigHelper keeps only the DYNAMIC_DEFAULT_BROKER_CONFIG ones for it)."""
    cluster = image.configs.get((int(_BROKER), ""), {})
    return [
        _entry(n, _BROKER, [(n, cluster[n], DYNAMIC_DEFAULT_BROKER)], detail)
        for n in sorted(cluster)
        if n in BROKER_CONFIGS
    ]


@functools.lru_cache(maxsize=4)  # a node has one [log] section: computed once, not per request
def _statics(log_defaults: LogConfig) -> Mapping[str, str]:
    """Each topic config's value under the node's ``[log]`` section alone (not to be changed:
    cached)."""
    return {n: v for n, v, _ in describe_topic_configs({}, log_defaults)}


_BUILT_IN = _statics(LogConfig())
