"""``runnel produce TOPIC``: records from standard input to a topic, with confluent-kafka.

    runnel produce TOPIC [--key-separator SEP] [--header K=V ...] [--partition P]
                         [--compression none|gzip|snappy|lz4|zstd] [--acks all|1|0]
                         [--idempotent] [--timeout-s S] [--bootstrap HOST:PORT | --data-dir DIR]

Each input line is one record's value (without its newline); with ``--key-separator`` the
text before the first separator is the key (a line without it has no key). Every record sent
is acknowledged by the cluster or reported: the command waits (at most ``--timeout-s``) for
the acknowledgements, prints how many records were delivered and exits 1 if any failed. A
record the client refuses outright (one over ``message.max.bytes``) stops the input there:
the records before it are still waited for, and the error names its input line. Ctrl-C stops
reading the input; the records already sent are waited for in the same way (a second Ctrl-C
stops that wait and counts those left as not acknowledged), and the command exits 130.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from dataclasses import dataclass
from functools import partial
from types import FrameType
from typing import Any

from runnel.commands import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PROBLEM,
    CommandError,
    Subparsers,
    UsageError,
    non_negative_int,
    positive_int,
    set_handler,
)
from runnel.kafka_target import (
    METADATA_TIMEOUT_S,
    add_broker_options,
    kafka_error_text,
    resolve_brokers,
    unreachable,
)

__all__ = ["register"]

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
ACKS = ("all", "1", "0")
MAX_QUEUED_RECORDS = 100_000  # records buffered in the client before produce() blocks
FLUSH_STEP_S = 0.1  # the final wait for acknowledgements checks for Ctrl-C this often
Header = tuple[str, bytes]


def register(groups: Subparsers) -> None:
    produce = groups.add_parser(
        "produce",
        help="produce records from standard input (one per line)",
        description="Produce each line of standard input as one record to TOPIC. "
        "Exit 0 when every record was acknowledged, 1 when any failed, 130 on Ctrl-C.",
    )
    produce.add_argument("topic", metavar="TOPIC")
    produce.add_argument(
        "--key-separator", type=_separator, metavar="SEP", help="split key SEP value"
    )
    produce.add_argument(
        "--header", type=_header, action="append", default=[], metavar="K=V",
        help="a header on every record (repeatable; K must not be empty)",
    )  # fmt: skip
    produce.add_argument("--partition", type=non_negative_int, help="default: by key")
    produce.add_argument("--compression", choices=CODECS, default="none")
    produce.add_argument("--acks", choices=ACKS, default="all")
    produce.add_argument(
        "--idempotent", action="store_true", help="enable.idempotence (needs --acks all)"
    )
    produce.add_argument("--timeout-s", type=positive_int, default=30, help="delivery limit")
    add_broker_options(produce)
    set_handler(produce, _produce)


def _separator(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _header(item: str) -> Header:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{item!r} is not K=V")
    return key, value.encode()


def _require_topic(producer: Any, topic: str, brokers: str) -> None:
    """Fail at once, by name, for a topic that does not exist: librdkafka would otherwise
    hold the records until they time out (auto-creation is off by default)."""
    from confluent_kafka import KafkaError, KafkaException

    try:
        found = producer.list_topics(topic, timeout=METADATA_TIMEOUT_S).topics.get(topic)
    except KafkaException as e:
        raise unreachable(brokers, e) from None
    error = found.error if found is not None else None
    if found is None or (error is not None and error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART):
        raise CommandError(f"topic {topic!r} does not exist")
    # Any other error (LEADER_NOT_AVAILABLE: being created) is for the producer to retry.


class _StopReading(Exception):
    """Raised by the SIGINT handler to break a blocked read of standard input."""


class _Interrupts:
    """Ctrl-C (SIGINT) while producing, counted. A read of standard input blocks, so the
    handler breaks it (by raising) while ``reading``; anywhere else it only counts, and the
    loops check the count, so a delivery report is never cut short."""

    def __init__(self) -> None:
        self.count = 0
        self.reading = False

    def handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.reading:
            self.reading = False
            raise _StopReading


@dataclass(slots=True)
class _Tally:
    """Delivery reports, as librdkafka hands them to ``report``."""

    delivered: int = 0
    failed: int = 0
    first_failure: str | None = None  # "input line L: why" (the others are only counted)

    def report(self, line: int, error: Any, message: Any) -> None:
        if error is None:
            self.delivered += 1
            return
        self.failed += 1
        if self.first_failure is None:
            self.first_failure = f"input line {line}: {error.str()}"


@dataclass(frozen=True, slots=True)
class _Stop:
    """Why the input was not read to its end."""

    line: int  # the last input line read (1-based; 0: none)
    error: str | None  # the client refused line ``line``; None: interrupted


def _produce(args: argparse.Namespace) -> int:
    from confluent_kafka import Producer

    if args.idempotent and args.acks != "all":
        raise UsageError(f"--idempotent needs --acks all (not {args.acks})")
    brokers = resolve_brokers(args)
    producer = Producer(
        {
            "bootstrap.servers": brokers,
            "acks": args.acks,
            "compression.type": args.compression,
            "enable.idempotence": args.idempotent,
            "message.timeout.ms": args.timeout_s * 1000,
            "queue.buffering.max.messages": MAX_QUEUED_RECORDS,
        }
    )
    _require_topic(producer, args.topic, brokers)
    tally = _Tally()
    interrupts = _Interrupts()
    previous = signal.signal(signal.SIGINT, interrupts.handle)
    try:
        stop = _send_input(producer, args, tally, interrupts)
        left = _flush(producer, args.timeout_s, interrupts)
    finally:
        signal.signal(signal.SIGINT, previous)
    return _outcome(args.topic, tally, stop, left)


def _send_input(
    producer: Any, args: argparse.Namespace, tally: _Tally, interrupts: _Interrupts
) -> _Stop | None:
    """Produce each line of standard input until its end (returns None), a Ctrl-C or a
    record the client refuses (returns where and why it stopped)."""
    from confluent_kafka import KafkaException

    lines = iter(sys.stdin.buffer)
    separator = None if args.key_separator is None else args.key_separator.encode()
    headers: list[Header] | None = args.header or None
    extra = {} if args.partition is None else {"partition": args.partition}
    number = 0
    while not interrupts.count:
        try:
            interrupts.reading = True
            line = next(lines, None)
            interrupts.reading = False
        except _StopReading:
            break
        if line is None:
            return None
        number += 1
        key, value = _split(line.rstrip(b"\n"), separator)
        report = partial(tally.report, number)
        while not interrupts.count:  # a record not sent when Ctrl-C comes is not sent at all
            try:
                producer.produce(
                    args.topic, value, key, headers=headers, on_delivery=report, **extra
                )
                break
            except BufferError:  # the client's queue is full: let deliveries drain
                producer.poll(0.1)
            except KafkaException as e:
                return _Stop(number, kafka_error_text(e))
        producer.poll(0)
    return _Stop(number, None)


def _split(value: bytes, separator: bytes | None) -> tuple[bytes | None, bytes]:
    """(key, value): a line without the separator has no key (as kcat -K)."""
    if separator is not None:
        before, found, after = value.partition(separator)
        if found:
            return before, after
    return None, value


def _flush(producer: Any, timeout_s: int, interrupts: _Interrupts) -> int:
    """Wait for the records sent to be acknowledged or to fail, at most ``timeout_s`` and
    until a further Ctrl-C; returns how many are left unacknowledged."""
    seen = interrupts.count
    deadline = time.monotonic() + timeout_s
    while True:
        left: int = producer.flush(FLUSH_STEP_S)
        if not left or interrupts.count > seen or time.monotonic() >= deadline:
            return left


def _outcome(topic: str, tally: _Tally, stop: _Stop | None, left: int) -> int:
    """Print what happened to the records; the exit code."""
    unsent = _unsent(tally, left)
    if stop is not None and stop.error is not None:
        raise CommandError(
            f"produce to {topic}: {tally.delivered} delivered; failed at input line "
            f"{stop.line}: {stop.error}" + (f"; {unsent}" if unsent else "")
        )
    print(f"produced {tally.delivered} records to {topic}", file=sys.stderr)
    if unsent:
        print(unsent, file=sys.stderr)
    if stop is not None:
        print(f"interrupted: stopped reading after input line {stop.line}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return EXIT_PROBLEM if unsent else EXIT_OK


def _unsent(tally: _Tally, left: int) -> str:
    """What was not delivered: the failed records and those left unacknowledged."""
    if not tally.failed and not left:
        return ""
    shown = tally.first_failure or f"{left} records not acknowledged in time"
    return f"failed: {tally.failed + left} records (first: {shown})"
