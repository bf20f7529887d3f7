"""A real Kafka client's figures for bench.produce_consume: confluent-kafka (librdkafka), run
as its own process, at its default batching.

How this works. Same roles and output as ``bench/kafka_load.py`` (prints ``ready``, then one
JSON line), through the client a Python application would use:

  produce  ``Producer.produce(topic, value, partition=p)`` of one 100-byte value per record,
           round robin over the partitions, in a tight loop (``poll(0)`` every
           ``POLL_EVERY`` records; on a full queue, ``poll`` until there is room), then
           ``flush``. acks=1, no idempotence, no compression; batching is librdkafka's
           default (linger.ms 5, batch.num.messages 10000, batch.size 1 MB). Delivery
           reports only for failures, which void the run.
  consume  ``Consumer.assign`` at offset 0 of every partition (no group: nothing to join),
           ``consume(num_messages=CONSUME_BATCH)`` in a loop, every message checked for an
           error. librdkafka's default fetch sizes and prefetching, except
           fetch.queue.backoff.ms (10 ms, not 1 s: see ``FETCH_QUEUE_BACKOFF_MS``).

Its Python-side cost per record (one ``produce()`` call, one ``Message`` object) is exactly
what the raw generator avoids; the benchmark measures both against the trivial sink.

Usage: ``python -m bench.produce_consume_client produce|consume --bootstrap HOST:PORT
--topic T [--records N] [--max-s S]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from bench.kafka_load import VALUE_BYTES, cpu_s

__all__ = ["main"]

POLL_EVERY = 10_000
CONSUME_BATCH = 10_000
FULL_QUEUE_POLL_S = 0.001
FLUSH_TIMEOUT_S = 30.0
METADATA_TIMEOUT_S = 10.0
CONSUME_POLL_S = 1.0
# librdkafka's default (1000 ms) stops fetching for a whole second whenever the application
# falls behind its prefetch queue, which a Python loop always does at these rates.
FETCH_QUEUE_BACKOFF_MS = 10


class ClientError(Exception):
    """librdkafka reported an error: the run is void."""


def _fail_on_error(error: KafkaError) -> None:
    raise ClientError(f"librdkafka: {error}")


def _delivery_failed(error: KafkaError | None, message: Message) -> None:
    if error is not None:
        raise ClientError(f"delivery failed: {error}")


def partitions_of(client: Producer | Consumer, topic: str) -> int:
    metadata = client.list_topics(topic, timeout=METADATA_TIMEOUT_S)
    found = metadata.topics.get(topic)
    if found is None or found.error is not None or not found.partitions:
        raise ClientError(f"topic {topic}: {found.error if found else 'not found'}")
    return len(found.partitions)


def run_produce(args: argparse.Namespace) -> dict[str, Any]:
    producer = Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "acks": 1,
            "enable.idempotence": False,
            "compression.type": "none",
            "delivery.report.only.error": True,
            "on_delivery": _delivery_failed,
            "error_cb": _fail_on_error,
        }
    )
    partitions = partitions_of(producer, args.topic)
    value = os.urandom(VALUE_BYTES)
    produce, poll, topic = producer.produce, producer.poll, args.topic
    print("ready", flush=True)
    cpu0, start = cpu_s(), time.perf_counter()
    deadline = start + args.max_s
    sent = 0
    while sent < args.records and time.perf_counter() < deadline:
        for i in range(sent, min(sent + POLL_EVERY, args.records)):
            try:
                produce(topic, value, partition=i % partitions)
            except BufferError:  # the local queue is full: let librdkafka send
                while True:
                    poll(FULL_QUEUE_POLL_S)
                    try:
                        produce(topic, value, partition=i % partitions)
                        break
                    except BufferError:
                        continue
        sent = min(sent + POLL_EVERY, args.records)
        poll(0)
    produced_s = time.perf_counter() - start
    left = producer.flush(FLUSH_TIMEOUT_S)
    if left:
        raise ClientError(f"{left} records not delivered within {FLUSH_TIMEOUT_S} s")
    seconds = time.perf_counter() - start
    return {
        "records": sent,
        "wire_bytes": None,
        "seconds": seconds,
        "produce_calls_s": produced_s,
        "cpu_s": cpu_s() - cpu0,
        "partitions": partitions,
    }


def run_consume(args: argparse.Namespace) -> dict[str, Any]:
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": "runnel-bench",  # required by the client; assign() joins no group
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
            "error_cb": _fail_on_error,
        }
    )
    partitions = partitions_of(consumer, args.topic)
    consumer.assign([TopicPartition(args.topic, p, 0) for p in range(partitions)])
    print("ready", flush=True)
    records = 0
    cpu0, start = cpu_s(), time.perf_counter()
    deadline = start + args.max_s
    while records < args.records and time.perf_counter() < deadline:
        for message in consumer.consume(CONSUME_BATCH, CONSUME_POLL_S):
            if message.error() is not None:
                raise ClientError(f"consume: {message.error()}")
            records += 1
    seconds = time.perf_counter() - start
    cpu = cpu_s() - cpu0
    consumer.close()
    return {
        "records": records,
        "wire_bytes": None,
        "seconds": seconds,
        "cpu_s": cpu,
        "partitions": partitions,
    }


ROLES = {"produce": run_produce, "consume": run_consume}


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.produce_consume_client", description=__doc__
    )
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("--bootstrap", required=True, metavar="HOST:PORT")
    parser.add_argument("--topic", required=True)
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--max-s", type=float, default=30.0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    print(json.dumps(ROLES[args.role](args)), flush=True)


if __name__ == "__main__":
    try:
        main()
    except (ClientError, KafkaException) as e:
        print(f"produce_consume_client: {e}", file=sys.stderr)
        sys.exit(1)
