"""Which brokers a Kafka-client command (``runnel produce``, ``consume``, ``delete-records``)
dials, and how it words a client error.

``--bootstrap HOST:PORT[,HOST:PORT]`` names brokers' client listeners; without it, the local
cluster of ``--data-dir`` (``runnel cluster up``) gives its brokers' CLIENT addresses.
"""

from __future__ import annotations

import argparse
from typing import Any

from runnel.admin import add_data_dir_option, parse_bootstrap
from runnel.commands import CommandError
from runnel.local_cluster import ClusterSpec

__all__ = [
    "METADATA_TIMEOUT_S",
    "add_broker_options",
    "kafka_error_text",
    "resolve_brokers",
    "topic_partitions",
    "unreachable",
]

METADATA_TIMEOUT_S = 10.0


def add_broker_options(parser: argparse.ArgumentParser) -> None:
    target = parser.add_mutually_exclusive_group()
    target.add_argument(
        "--bootstrap",
        metavar="HOST:PORT[,HOST:PORT]",
        help="brokers' client listeners; default: the local cluster's, from --data-dir",
    )
    add_data_dir_option(target)


def resolve_brokers(args: argparse.Namespace) -> str:
    """``host:port,...`` of the brokers to bootstrap from."""
    if args.bootstrap is not None:
        return ",".join(parse_bootstrap(args.bootstrap))
    cluster = ClusterSpec.load(args.data_dir)
    if cluster is None:
        raise CommandError(
            f"no local cluster in {args.data_dir.absolute()} (no cluster.json): start one with "
            "`runnel cluster up`, or name brokers with --bootstrap HOST:PORT"
        )
    return cluster.kafka_bootstrap


def kafka_error_text(e: Exception) -> str:
    """A KafkaException's message without the ``KafkaError{code=...}`` wrapping."""
    error: Any = e.args[0] if e.args else None
    return str(error.str()) if hasattr(error, "str") else str(e)


def unreachable(brokers: str, e: Exception) -> CommandError:
    return CommandError(f"cannot reach the cluster at {brokers}: {kafka_error_text(e)}")


def topic_partitions(client: Any, topic: str, wanted: list[int] | None, brokers: str) -> list[int]:
    """The partitions of ``topic`` a command works on, sorted: ``wanted`` (None: all), each
    checked to exist; ``client`` is a confluent-kafka client (its ``list_topics``)."""
    from confluent_kafka import KafkaException

    try:
        found = client.list_topics(topic, timeout=METADATA_TIMEOUT_S).topics.get(topic)
    except KafkaException as e:
        raise unreachable(brokers, e) from None
    if found is None or found.error is not None:
        raise CommandError(f"topic {topic!r}: {found.error if found else 'not found'}")
    partitions = sorted(found.partitions if wanted is None else set(wanted))
    unknown = sorted(set(partitions) - set(found.partitions))
    if unknown:
        raise CommandError(f"topic {topic!r} has no partition {unknown[0]}")
    return partitions
