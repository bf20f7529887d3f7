"""``runnel consume TOPIC``: print a topic's records, with confluent-kafka (no consumer group).

    runnel consume TOPIC [--partition P ...] [--from earliest|latest|OFFSET|@TIMESTAMP_MS]
                         [--max-messages N] [--follow] [--json] [--timeout-s S]
                         [--bootstrap HOST:PORT | --data-dir DIR]

The partitions (all by default) are assigned directly, starting where ``--from`` says; no
offsets are committed. An OFFSET outside a partition's records is an error (exit 1) naming
the partition's range, never a silent jump to its end. Each record is printed as its value
(UTF-8, invalid bytes replaced) or, with ``--json``, as one JSON object, exactly (see
:func:`_as_json`). Without ``--follow`` the command stops once every partition has been read
to its end (as it was when the command reached it); if that takes more than ``--timeout-s``
(30 by default) without a record, it fails (exit 1) naming the partitions not read to their
end, rather than pass partial output off as the whole; Ctrl-C stops it with exit 130. With
``--follow`` it keeps waiting for records until Ctrl-C, or until ``--timeout-s`` passes
without one when that is given (exit 0 either way). ``--max-messages`` stops it sooner.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import time
from typing import Any

from runnel.commands import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    CommandError,
    Subparsers,
    non_negative_int,
    positive_int,
    set_handler,
)
from runnel.kafka_close import CLOSE_TIMEOUT_S, close_consumer
from runnel.kafka_target import (
    METADATA_TIMEOUT_S,
    add_broker_options,
    resolve_brokers,
    topic_partitions,
    unreachable,
)

__all__ = ["register"]

POLL_S = 0.5
TO_THE_END_TIMEOUT_S = 30  # without --follow: the longest wait for a record
# confluent-kafka demands a group id even for assign(); nothing is committed under it.
GROUP_ID = "runnel-consume"


def register(groups: Subparsers) -> None:
    consume = groups.add_parser(
        "consume",
        help="print a topic's records",
        description="Print the records of TOPIC (every partition, or --partition).",
    )
    consume.add_argument("topic", metavar="TOPIC")
    consume.add_argument(
        "--partition",
        type=non_negative_int,
        action="append",
        metavar="P",
        help="read partition P only (repeatable; default: every partition)",
    )
    consume.add_argument(
        "--from",
        dest="start",
        default="earliest",
        metavar="WHERE",
        help="where each partition starts: earliest (default), latest (new records only), "
        "OFFSET (a number; outside the partition's records it is an error) or "
        "@TIMESTAMP_MS (the first record at or after that time, ms since the epoch)",
    )
    consume.add_argument(
        "--max-messages", type=positive_int, metavar="N", help="stop after N records"
    )
    consume.add_argument(
        "--follow",
        action="store_true",
        help="keep waiting for records (until Ctrl-C, or --timeout-s without one if given)",
    )
    consume.add_argument(
        "--json",
        action="store_true",
        help="one JSON object per record: partition, offset, timestamp, key, value, headers "
        "([[key, value], ...]); key and values are text when valid UTF-8, "
        '{"base64": ...} when not, null when absent',
    )
    consume.add_argument(
        "--timeout-s",
        type=positive_int,
        help=f"the longest wait for a record (default: {TO_THE_END_TIMEOUT_S}; "
        "with --follow, none)",
    )
    add_broker_options(consume)
    set_handler(consume, _consume)


def _start_offset(where: str) -> tuple[int, bool]:
    """(offset or timestamp, whether it is a timestamp)."""
    from confluent_kafka import OFFSET_BEGINNING, OFFSET_END

    if where == "earliest":
        return OFFSET_BEGINNING, False
    if where == "latest":
        return OFFSET_END, False
    text = where.removeprefix("@")
    if not text.isdigit():
        raise CommandError(f"--from {where!r}: give earliest, latest, OFFSET or @TIMESTAMP_MS")
    return int(text), where.startswith("@")


def _format(message: Any, as_json: bool) -> str:
    if as_json:
        return json.dumps(_as_json(message))
    value = message.value()
    return value.decode("utf-8", "replace") if value is not None else ""


def _as_json(message: Any) -> dict[str, Any]:
    """A record, exactly. Keys, values and header values are text when they are valid
    UTF-8, ``{"base64": ...}`` when they are not, and null when absent (a null value is not
    an empty one); headers are ``[key, value]`` pairs in their order, repeats kept."""
    return {
        "partition": message.partition(),
        "offset": message.offset(),
        "timestamp": message.timestamp()[1],
        "key": _exact(message.key()),
        "value": _exact(message.value()),
        "headers": [[k, _exact(v)] for k, v in message.headers() or []],
    }


def _exact(data: bytes | None) -> str | dict[str, str] | None:
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def _assignment(consumer: Any, args: argparse.Namespace, brokers: str) -> list[Any]:
    from confluent_kafka import KafkaException, TopicPartition

    partitions = topic_partitions(consumer, args.topic, args.partition, brokers)
    start, by_time = _start_offset(args.start)
    wanted = [TopicPartition(args.topic, p, start) for p in partitions]
    if not by_time:
        return wanted
    try:
        return list(consumer.offsets_for_times(wanted, timeout=METADATA_TIMEOUT_S))
    except KafkaException as e:
        raise unreachable(brokers, e) from None


def _out_of_range(consumer: Any, topic: str, partition: int, offset: int | None) -> str:
    """Why a partition cannot be read from ``offset``, with its range when it can be had."""
    from confluent_kafka import KafkaException, TopicPartition

    what = f"offset {offset}" if offset is not None and offset >= 0 else "the offset"
    try:
        low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=METADATA_TIMEOUT_S
        )
    except KafkaException:
        return f"{what} is out of range for partition {partition}"
    return f"{what} is out of range [{low}, {high}) for partition {partition}"


def _consume(args: argparse.Namespace) -> int:
    from confluent_kafka import Consumer, KafkaError

    brokers = resolve_brokers(args)
    consumer = Consumer(
        {
            "bootstrap.servers": brokers,
            "group.id": GROUP_ID,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",  # an offset out of range is reported, not skipped
        }
    )
    timeout_s = args.timeout_s
    if timeout_s is None and not args.follow:
        timeout_s = TO_THE_END_TIMEOUT_S
    out_of_range = {KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE}
    printed = 0
    interrupted = False
    try:
        assignment = _assignment(consumer, args, brokers)
        consumer.assign(assignment)
        open_partitions = {tp.partition for tp in assignment}
        next_offsets = {tp.partition: tp.offset for tp in assignment}
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while args.follow or open_partitions:
            if deadline is not None and time.monotonic() >= deadline:
                if args.follow:
                    break
                left = ", ".join(str(p) for p in sorted(open_partitions))
                raise CommandError(
                    f"consume {args.topic}: no record for {timeout_s} s and partition(s) "
                    f"{left} not read to their end; {printed} records printed"
                )
            message = consumer.poll(POLL_S)
            if message is None:
                continue
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                open_partitions.discard(message.partition())
                continue
            partition: Any = message.partition()
            if error is not None and error.code() in out_of_range:
                why = _out_of_range(consumer, args.topic, partition, next_offsets.get(partition))
                raise CommandError(f"consume {args.topic}: {why}")
            if error is not None:
                raise CommandError(f"consume {args.topic}: {error}")
            print(_format(message, args.json), flush=False)
            printed += 1
            next_offsets[partition] = (message.offset() or 0) + 1
            if timeout_s is not None:
                deadline = time.monotonic() + timeout_s
            if args.max_messages is not None and printed >= args.max_messages:
                break
    except KeyboardInterrupt:
        if not args.follow:
            interrupted = True
    finally:
        sys.stdout.flush()
        if not close_consumer(consumer, CLOSE_TIMEOUT_S):
            print(
                f"warning: the Kafka client did not close within {CLOSE_TIMEOUT_S:g} s "
                "(librdkafka's close can deadlock, confluentinc/librdkafka#5476); exiting",
                file=sys.stderr,
            )
    print(f"consumed {printed} records from {args.topic}", file=sys.stderr)
    if interrupted:
        print("interrupted before every partition was read to its end", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_OK
