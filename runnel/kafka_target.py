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

__all__ = ["add_broker_options", "kafka_error_text", "resolve_brokers"]


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
