"""``runnel produce TOPIC``: records from standard input to a topic, with confluent-kafka.

    runnel produce TOPIC [--key-separator SEP] [--header K=V ...] [--partition P]
                         [--compression none|gzip|snappy|lz4|zstd] [--acks all|1|0]
                         [--idempotent] [--timeout-s S] [--bootstrap HOST:PORT | --data-dir DIR]

Each input line is one record's value (without its newline); with ``--key-separator`` the
text before the first separator is the key (a line without it has no key). Every record is
acknowledged by the cluster or reported: the command prints how many were delivered and
exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from runnel.commands import (
    EXIT_OK,
    EXIT_PROBLEM,
    CommandError,
    Subparsers,
    non_negative_int,
    positive_int,
    set_handler,
)
from runnel.kafka_target import add_broker_options, resolve_brokers

__all__ = ["register"]

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
ACKS = ("all", "1", "0")
MAX_QUEUED_RECORDS = 100_000
METADATA_TIMEOUT_S = 10.0  # records buffered in the client before produce() blocks


def register(groups: Subparsers) -> None:
    produce = groups.add_parser(
        "produce",
        help="produce records from standard input (one per line)",
        description="Produce each line of standard input as one record to TOPIC.",
    )
    produce.add_argument("topic", metavar="TOPIC")
    produce.add_argument("--key-separator", metavar="SEP", help="split key SEP value")
    produce.add_argument("--header", action="append", default=[], metavar="K=V")
    produce.add_argument("--partition", type=non_negative_int, help="default: by key")
    produce.add_argument("--compression", choices=CODECS, default="none")
    produce.add_argument("--acks", choices=ACKS, default="all")
    produce.add_argument("--idempotent", action="store_true", help="enable.idempotence")
    produce.add_argument("--timeout-s", type=positive_int, default=30, help="delivery limit")
    add_broker_options(produce)
    set_handler(produce, _produce)


def _headers(items: list[str]) -> list[tuple[str, str | bytes | None]]:
    out: list[tuple[str, str | bytes | None]] = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CommandError(f"--header {item!r} is not K=V")
        out.append((key, value.encode()))
    return out


def _require_topic(producer: Any, topic: str) -> None:
    """Fail at once, by name, for a topic that does not exist: librdkafka would otherwise
    hold the records until they time out (auto-creation is off by default)."""
    from confluent_kafka import KafkaError, KafkaException

    try:
        found = producer.list_topics(topic, timeout=METADATA_TIMEOUT_S).topics.get(topic)
    except KafkaException as e:
        raise CommandError(f"cannot reach the cluster: {e}") from None
    error = found.error if found is not None else None
    if found is None or (error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
        raise CommandError(f"topic {topic!r} does not exist")
    # Any other error (LEADER_NOT_AVAILABLE: being created) is for the producer to retry.


def _produce(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException, Producer

    headers = _headers(args.header)
    producer = Producer(
        {
            "bootstrap.servers": resolve_brokers(args),
            "acks": args.acks,
            "compression.type": args.compression,
            "enable.idempotence": args.idempotent,
            "message.timeout.ms": args.timeout_s * 1000,
            "queue.buffering.max.messages": MAX_QUEUED_RECORDS,
        }
    )
    _require_topic(producer, args.topic)
    failures: list[str] = []
    delivered = 0

    def report(error: Any, message: Any) -> None:
        nonlocal delivered
        if error is not None:
            failures.append(str(error))
        else:
            delivered += 1

    extra = {} if args.partition is None else {"partition": args.partition}
    for line in sys.stdin.buffer:
        value = line.rstrip(b"\n")
        key = None
        if args.key_separator is not None:
            before, found, after = value.partition(args.key_separator.encode())
            if found:  # a line without the separator has no key (as kcat -K)
                key, value = before, after
        while True:
            try:
                producer.produce(
                    args.topic, value, key, headers=headers or None, on_delivery=report, **extra
                )
                break
            except BufferError:  # the client's queue is full: let deliveries drain
                producer.poll(0.1)
            except KafkaException as e:
                raise CommandError(f"produce to {args.topic}: {e}") from None
        producer.poll(0)
    left = producer.flush(args.timeout_s)
    print(f"produced {delivered} records to {args.topic}", file=sys.stderr)
    if failures or left:
        shown = failures[0] if failures else f"{left} records not acknowledged in time"
        print(f"failed: {len(failures) + left} records (first: {shown})", file=sys.stderr)
        return EXIT_PROBLEM
    return EXIT_OK
