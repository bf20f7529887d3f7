"""``runnel delete-records TOPIC --before OFFSET``: drop a topic's oldest records, with
confluent-kafka's DeleteRecords (what ``kafka-delete-records.sh`` does).

    runnel delete-records TOPIC --before OFFSET|end [--partition P ...] [--timeout-s S]
                          [--json] [--bootstrap HOST:PORT | --data-dir DIR]

Every record below ``OFFSET`` (``end``: below the high watermark, so every committed record)
of each partition named (default: all of them) is deleted: the partition's log start moves
there, consumers start from it, and its leader answers once every live replica has taken it.
One line per partition: its new log start, or why not (an offset past the high watermark, a
compacted topic, a replica that did not answer within ``--timeout-s``). Exit 0 if every
partition's records were deleted, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from runnel.commands import (
    EXIT_OK,
    EXIT_PROBLEM,
    Subparsers,
    non_negative_int,
    positive_int,
    set_handler,
)
from runnel.kafka_target import (
    METADATA_TIMEOUT_S,
    add_broker_options,
    kafka_error_text,
    resolve_brokers,
    topic_partitions,
    unreachable,
)

__all__ = ["register"]


def register(groups: Subparsers) -> None:
    parser = groups.add_parser(
        "delete-records",
        help="delete a topic's records below an offset",
        description="Delete every record of TOPIC below OFFSET in each partition named "
        "(default: all). Exit 0 when every partition's were deleted, 1 otherwise.",
    )
    parser.add_argument("topic", metavar="TOPIC")
    parser.add_argument(
        "--before",
        type=_offset,
        required=True,
        metavar="OFFSET|end",
        help="the new first offset; end: the high watermark (every committed record)",
    )
    parser.add_argument(
        "--partition", type=non_negative_int, action="append", help="repeatable; default: all"
    )
    parser.add_argument(
        "--timeout-s", type=positive_int, default=30, help="how long replicas may take"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per partition")
    add_broker_options(parser)
    set_handler(parser, _delete_records)


def _offset(text: str) -> int:
    if text == "end":  # DeleteRecords' -1: up to the high watermark
        from confluent_kafka import OFFSET_END

        return int(OFFSET_END)
    return non_negative_int(text)


def _delete_records(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient

    brokers = resolve_brokers(args)
    admin = AdminClient({"bootstrap.servers": brokers})
    partitions = topic_partitions(admin, args.topic, args.partition, brokers)
    asked = [TopicPartition(args.topic, p, args.before) for p in partitions]
    try:
        futures = admin.delete_records(
            asked,
            request_timeout=args.timeout_s + METADATA_TIMEOUT_S,
            operation_timeout=args.timeout_s,
        )
    except KafkaException as e:
        raise unreachable(brokers, e) from None
    failed = 0
    for tp, future in sorted(futures.items(), key=lambda item: item[0].partition):
        outcome: dict[str, Any] = {"topic": args.topic, "partition": tp.partition}
        try:
            outcome["log_start_offset"] = future.result(
                args.timeout_s + 2 * METADATA_TIMEOUT_S
            ).low_watermark
        except KafkaException as e:
            outcome["error"] = kafka_error_text(e)
            failed += 1
        except TimeoutError:  # the client's own request timeout should have come first
            outcome["error"] = f"no answer within {args.timeout_s} s"
            failed += 1
        print(json.dumps(outcome) if args.json else _line(outcome), flush=True)
    return EXIT_PROBLEM if failed else EXIT_OK


def _line(outcome: dict[str, Any]) -> str:
    name = f"{outcome['topic']}-{outcome['partition']}"
    if "error" in outcome:
        return f"{name}: not deleted: {outcome['error']}"
    return f"{name}: records below {outcome['log_start_offset']} deleted"
