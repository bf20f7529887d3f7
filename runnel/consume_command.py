"""``runnel consume TOPIC``: print a topic's records, with confluent-kafka (no consumer group).

    runnel consume TOPIC [--partition P ...] [--from earliest|latest|OFFSET|@TIMESTAMP_MS]
                         [--max-messages N] [--follow] [--json] [--timeout-s S]
                         [--bootstrap HOST:PORT | --data-dir DIR]

The partitions (all by default) are assigned directly, starting where ``--from`` says; no
offsets are committed. Each record is printed as its value (UTF-8, invalid bytes replaced)
or, with ``--json``, as one JSON object with partition, offset, timestamp, key, value and
headers. Without ``--follow`` the command stops once every partition has been read to its
end (as it was when the command reached it); if that takes more than ``--timeout-s`` (30 by
default) without a record, it fails (exit 1) naming the partitions not read to their end,
rather than pass partial output off as the whole. With ``--follow`` it keeps waiting for
records until Ctrl-C, or until ``--timeout-s`` passes without one when that is given (exit 0
either way). ``--max-messages`` stops it sooner.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from runnel.commands import EXIT_OK, CommandError, Subparsers, positive_int, set_handler
from runnel.kafka_target import add_broker_options, resolve_brokers

__all__ = ["register"]

POLL_S = 0.5
METADATA_TIMEOUT_S = 10.0
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
    consume.add_argument("--partition", type=int, action="append", metavar="P")
    consume.add_argument("--from", dest="start", default="earliest", metavar="WHERE")
    consume.add_argument("--max-messages", type=positive_int, metavar="N")
    consume.add_argument(
        "--follow",
        action="store_true",
        help="keep waiting for records (until Ctrl-C, or --timeout-s without one if given)",
    )
    consume.add_argument("--json", action="store_true", help="one JSON object per record")
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
    value = message.value()
    text = value.decode("utf-8", "replace") if value is not None else ""
    if not as_json:
        return text
    key = message.key()
    return json.dumps(
        {
            "partition": message.partition(),
            "offset": message.offset(),
            "timestamp": message.timestamp()[1],
            "key": key.decode("utf-8", "replace") if key is not None else None,
            "value": text if value is not None else None,
            "headers": {
                k: (v or b"").decode("utf-8", "replace") for k, v in message.headers() or []
            },
        }
    )


def _assignment(consumer: Any, args: argparse.Namespace) -> list[Any]:
    from confluent_kafka import TopicPartition

    topic = consumer.list_topics(args.topic, timeout=METADATA_TIMEOUT_S).topics.get(args.topic)
    if topic is None or topic.error is not None:
        raise CommandError(f"topic {args.topic!r}: {topic.error if topic else 'not found'}")
    partitions = sorted(topic.partitions) if args.partition is None else args.partition
    unknown = sorted(set(partitions) - set(topic.partitions))
    if unknown:
        raise CommandError(f"topic {args.topic!r} has no partition {unknown[0]}")
    start, by_time = _start_offset(args.start)
    wanted = [TopicPartition(args.topic, p, start) for p in partitions]
    if not by_time:
        return wanted
    return list(consumer.offsets_for_times(wanted, timeout=METADATA_TIMEOUT_S))


def _consume(args: argparse.Namespace) -> int:
    from confluent_kafka import Consumer, KafkaError

    consumer = Consumer(
        {
            "bootstrap.servers": resolve_brokers(args),
            "group.id": GROUP_ID,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    timeout_s = args.timeout_s
    if timeout_s is None and not args.follow:
        timeout_s = TO_THE_END_TIMEOUT_S
    printed = 0
    try:
        assignment = _assignment(consumer, args)
        consumer.assign(assignment)
        open_partitions = {tp.partition for tp in assignment}
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
            if error is not None:
                raise CommandError(f"consume {args.topic}: {error}")
            print(_format(message, args.json), flush=False)
            printed += 1
            if timeout_s is not None:
                deadline = time.monotonic() + timeout_s
            if args.max_messages is not None and printed >= args.max_messages:
                break
    except KeyboardInterrupt:
        if not args.follow:
            raise
    finally:
        sys.stdout.flush()
        consumer.close()
    print(f"consumed {printed} records from {args.topic}", file=sys.stderr)
    return EXIT_OK
