"""A fresh local cluster of 1 controller (or a quorum of them: ``with_controllers``) and 3
broker processes for replication fault tests, with short timeouts, and the helpers those
tests need: signal a node (SIGKILL, SIGSTOP, SIGCONT, SIGTERM) and start it again, find the
active controller, read a partition's leader and ISR as Kafka clients see them, produce and
consume with confluent-kafka, and read every replica's stored batches from disk to compare
them.

How the cluster runs with short timeouts without a code change: ``runnel cluster up`` keeps a
node's ``node.toml`` once written ("edits survive a resume"), so the fixture writes the
cluster spec and the generated configs first (``ClusterSpec.save`` and
``write_node_configs``), appends the ``[controller]`` and ``[broker]`` sections of
``OVERRIDES`` to each node's file, and then runs ``runnel cluster up --once``, which resumes
that cluster and waits until it is healthy (a test may change settings with
``with_settings``). A broker is started again here the way the
supervisor starts it (``python -m runnel node --config node.toml`` in its own session, output
appended to ``node.log``, pid in ``node.pid``), so one broker can come back while another
stays down (``up --once`` would start every missing node).

The test modules beside it ``import fault_cluster as rc`` (its name is unique in ``tests/``:
``tests/raft/cluster.py`` is a top-level ``cluster`` module, which a ``cluster.py`` here
would shadow or be shadowed by).

Replicas are compared once they have caught up: ``wait_replicas_caught_up`` waits until
every replica's log on disk ends at its partition's high watermark (what the leader answers
ListOffsets with), so every replica's high watermark is that one too, and
``replica_disagreements`` then compares the batches below it: offsets, leader epoch, CRC.

Every wait is bounded; the teardown kill -9s every process of the cluster (found by pid file
and by the processes started here) and prints each node's warnings and last log lines, which
pytest shows with a failing test, next to the test's own timeline (``Cluster.note``).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from support import make_batch
from test_local_cluster import free_base_port, runnel

from broker.protocol import ApiKey, decode_response, encode_request
from runnel.kafka_close import close_consumer
from runnel.local_cluster import ClusterSpec, Port, process_alive, read_pid
from runnel.segment_reader import BrokenTail, find_segments, scan_segment

__all__ = [
    "BROKERS",
    "LAG_MS",
    "NULL_LOGGER",
    "OVERRIDES",
    "RETRIABLE",
    "SESSION_MS",
    "ClientLines",
    "RecentLines",
    "Cluster",
    "Continuous",
    "ONCE",
    "LoadReport",
    "LogCheck",
    "produce_one",
    "handle_destroyed_resends",
    "PartitionView",
    "QueuedProduce",
    "StoredBatch",
    "Tail",
    "check_log",
    "check_outcome",
    "finish",
    "error_name",
    "replication_cluster",
    "running",
    "start_cluster",
    "stop_cluster",
    "wait_acks",
    "wait_for",
    "wait_new_leader",
    "with_controllers",
    "with_settings",
]

REPO = Path(__file__).resolve().parents[2]
BROKERS = (101, 102, 103)
SESSION_MS = 3000  # controller.broker_session_timeout_ms
LAG_MS = 3000  # broker.replica_lag_time_max_ms
OVERRIDES = {
    "controller": {
        "broker_session_timeout_ms": SESSION_MS,
        "leader_imbalance_check_interval_s": 5,
    },
    "broker": {
        "heartbeat_interval_ms": 500,
        "replica_lag_time_max_ms": LAG_MS,
        "replica_fetch_backoff_ms": 200,
        "replica_high_watermark_checkpoint_interval_ms": 1000,
    },
}
UP_TIMEOUT_S = 90  # `runnel cluster up --once` (it waits up to 60 s for health)
EXIT_WAIT_S = 10.0  # a SIGKILLed process to go
TERM_WAIT_S = 40.0  # a SIGTERMed broker's controlled shutdown
METADATA_TIMEOUT_S = 3.0  # one Metadata round trip
LOG_TAIL_LINES = 25
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

# Kafka error codes a producer may retry (Kafka's RetriableException subclasses), and
# librdkafka's local errors for a broker or request that went away; anything else in a
# delivery report is an error the producer may not retry.
RETRIABLE = frozenset(
    {
        KafkaError.INVALID_MSG,  # CORRUPT_MESSAGE
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NETWORK_EXCEPTION,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.KAFKA_STORAGE_ERROR,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError._TRANSPORT,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TIMED_OUT_QUEUE,
        KafkaError._ALL_BROKERS_DOWN,
    }
)


def error_name(code: int) -> str:
    return str(KafkaError(code).name())


def _quiet(_: Any) -> None:
    """librdkafka's logs and global errors: the tests judge by delivery reports."""


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float, step_s: float = 0.2) -> T:
    """``probe()`` until it returns something else than None; AssertionError naming what
    was awaited after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = probe()
        if result is not None:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(step_s)


# -- what clients see ------------------------------------------------------------------------


class PartitionView(NamedTuple):
    """One partition in a broker's Metadata answer."""

    partition: int
    leader: int  # -1: none
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    error: str | None


class StoredBatch(NamedTuple):
    """One batch of a replica's log on disk."""

    base_offset: int
    last_offset: int
    leader_epoch: int
    crc: int
    crc_valid: bool

    def __str__(self) -> str:
        valid = "" if self.crc_valid else " CRC-INVALID"
        return (
            f"[{self.base_offset}-{self.last_offset} e{self.leader_epoch} "
            f"crc={self.crc:#010x}{valid}]"
        )


@dataclass(slots=True)
class LoadReport:
    """What a continuous producer saw: per value, where it was acknowledged or its error."""

    sent: list[str] = field(default_factory=list)
    acked: dict[str, tuple[int, int, float]] = field(default_factory=dict)  # partition, offset
    failed: dict[str, tuple[int, int, str, float]] = field(default_factory=dict)  # p, code
    produce_errors: Counter[str] = field(default_factory=Counter)  # produce() raised
    idempotent: bool = False
    # librdkafka's lines on each failed message set, with the action it took (a resend that
    # counts no retry shows here and nowhere else), and on each Metadata answer listing no
    # broker, in order: ``Continuous`` (``ClientLines``).
    client_errors: list[str] = field(default_factory=list)

    # A running producer's delivery reports add to ``acked`` and ``failed`` from its thread:
    # read them through list() snapshots (one C call, no thread switch inside), as
    # ``Continuous.acked_since`` does.
    def error_counts(self) -> Counter[str]:
        return Counter(error_name(code) for _, code, _, _ in list(self.failed.values()))

    def summary(self) -> str:
        per_partition = Counter(p for p, _, _ in list(self.acked.values()))
        return (
            f"sent {len(self.sent)}, acked {len(self.acked)} {dict(sorted(per_partition.items()))}"
            f", failed {len(self.failed)} {dict(self.error_counts())}, unanswered "
            f"{len(self.sent) - len(self.acked) - len(self.failed)}"
            + (f", produce() raised {dict(self.produce_errors)}" if self.produce_errors else "")
        )


class Continuous:
    """A thread producing unique values (``<tag>-<n>``) to a topic's partitions in turn, a
    few at a time, until stopped; the delivery reports fill a ``LoadReport``."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        tag: str,
        config: dict[str, Any],
        *,
        per_round: int = 6,
        pause_s: float = 0.02,
    ) -> None:
        self.topic, self.partitions, self.tag = topic, partitions, tag
        self.per_round, self.pause_s = per_round, pause_s
        self.report = LoadReport(idempotent=bool(config.get("enable.idempotence")))
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "logger": ClientLines(self.report.client_errors),
                "debug": "msg,metadata",
                "error_cb": _quiet,
                **config,
            }
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"produce-{tag}", daemon=True)
        self.unflushed = 0

    def __enter__(self) -> Continuous:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            for _ in range(self.per_round):
                value = f"{self.tag}-{n:07d}"
                partition = n % self.partitions
                n += 1
                self.report.sent.append(value)
                try:
                    self.producer.produce(
                        self.topic, value.encode(), partition=partition, on_delivery=self._report
                    )
                except (BufferError, KafkaException) as e:
                    self.report.sent.pop()
                    self.report.produce_errors[type(e).__name__] += 1
                    break
            self.producer.poll(0)
            time.sleep(self.pause_s)

    def _report(self, error: KafkaError | None, message: Any) -> None:
        value, now = message.value().decode(), time.monotonic()
        if error is None:
            self.report.acked[value] = (message.partition(), message.offset(), now)
        else:
            self.report.failed[value] = (message.partition(), error.code(), error.str(), now)

    def acked_since(self, since: float, partition: int | None = None) -> int:
        return sum(
            1
            for p, _, at in list(self.report.acked.values())
            if at >= since and (partition is None or p == partition)
        )

    def stop(self, flush_timeout_s: float = 30.0) -> LoadReport:
        """Stop producing and wait (bounded) for every outstanding delivery report."""
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(timeout=10)
            assert not self._thread.is_alive(), "the producer thread did not stop, in:\n" + (
                stack_of(self._thread)
            )
            self.unflushed = self.producer.flush(flush_timeout_s)
        return self.report


class Tail:
    """A thread consuming the topic from offset 0 while a test runs: what it saw, as
    (partition, offset, value), must all be in the final log at the same offsets."""

    def __init__(self, cluster: Cluster, topic: str, partitions: int) -> None:
        self._cluster, self._topic = cluster, topic
        self.client_lines = RecentLines()
        self.consumer = cluster.consumer(
            **{"fetch.wait.max.ms": 100, "debug": RecentLines.DEBUG, "logger": self.client_lines}
        )
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        self.seen: list[tuple[int, int, str]] = []
        self.errors: Counter[str] = Counter()
        self.late_stop = ""  # where the thread was 10 s after it was asked to stop, if alive
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"tail-{topic}", daemon=True)

    def __enter__(self) -> Tail:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            for m in self.consumer.consume(200, timeout=0.2):
                if m.error() is not None:
                    self.errors[m.error().name()] += 1
                else:
                    self.seen.append((m.partition(), m.offset(), m.value().decode()))

    def stop(self) -> list[tuple[int, int, str]]:
        """Stop consuming. A ``consume`` call should return within its 0.2 s timeout; one
        that took over 10 s once (a nemesis run, cause not found) is waited for up to a
        minute, and where it was then is kept in ``late_stop`` for the test to say."""
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(timeout=10)
            if self._thread.is_alive():
                self.late_stop = stack_of(self._thread)
                self._thread.join(timeout=50)
            assert not self._thread.is_alive(), "the consumer thread did not stop, in:\n" + (
                stack_of(self._thread)
            )
            self._cluster.close_consumer(self.consumer, "the tailing consumer")
            if not self.seen:  # kept for whoever asks why: the tests require it saw something
                path = self._cluster.spec.data_dir / f"tail-{self._topic}-client-lines.log"
                self._cluster.note(f"the consumer read nothing; {self.client_lines.write(path)}")
        return self.seen

    def problems(self, final: dict[int, list[tuple[int, str]]]) -> list[str]:
        """What it saw that the final log does not hold at the same offset."""
        at = {(p, o): v for p, records in final.items() for o, v in records}
        wrong = [(p, o, v, at.get((p, o))) for p, o, v in self.seen if at.get((p, o)) != v]
        return [
            f"consumer saw {v!r} at partition {p} offset {o}; the final log has {final_v!r}"
            for p, o, v, final_v in wrong[:20]
        ] + ([f"... {len(wrong)} such records in all"] if len(wrong) > 20 else [])


def stack_of(thread: threading.Thread) -> str:
    """Where ``thread`` is now (for a thread that should have stopped)."""
    frame = sys._current_frames().get(thread.ident or -1)
    return "".join(traceback.format_stack(frame)) if frame is not None else "(gone)"


class LogCheck(NamedTuple):
    problems: list[str]  # broken promises
    retried: dict[str, list[tuple[int, int, int]]]  # tolerated copies: (partition, offset, epoch)


def check_log(
    final: dict[int, list[tuple[int, str]]],
    reports: Iterable[LoadReport],
    batches: dict[int, list[StoredBatch]],
) -> LogCheck:
    """How the final log (partition -> [(offset, value)], stored as ``batches``) breaks the
    promises made to the producers:

    * each partition's offsets run 0, 1, 2, ... and every value is one that was sent;
    * every acknowledged value is at the partition and offset its delivery report gave;
    * no value of an idempotent producer is there twice. A producer without idempotence
      resends a record answered NOT_LEADER_OR_FOLLOWER even with ``retries`` 0 (librdkafka
      counts no retry for it: "no chance of duplicate delivery"), yet the first copy may
      have been committed while leadership moved (Kafka answers the same). So copies are
      tolerated (and returned) in different leader epochs, in epoch order. Copies in one
      epoch come from one other resend that counts no retry: librdkafka drops the handle
      of a broker that a Metadata answer leaves out (Kafka's, like runnel's, leave fenced
      brokers out) and resends what was in flight to it ("Broker handle destroyed without
      termination", actions Refresh,MsgNotPersisted), though the broker may have appended
      it. Such copies are tolerated per partition up to the number of messages the
      producer's log (``LoadReport.client_errors``) says it resent so; beyond that, or out
      of epoch order, they are a problem."""
    problems = []
    where: dict[str, list[tuple[int, int]]] = {}
    for partition, records in sorted(final.items()):
        offsets = [o for o, _ in records]
        if offsets != list(range(len(offsets))):
            gaps = [(a, b) for a, b in zip([-1, *offsets], offsets, strict=False) if b != a + 1]
            problems.append(f"partition {partition}: offsets are not 0..n-1; breaks at {gaps[:10]}")
        for offset, value in records:
            where.setdefault(value, []).append((partition, offset))
    sender: dict[str, LoadReport] = {}
    lost, moved = [], []
    for report in reports:
        sender.update(dict.fromkeys(report.sent, report))
        for value, (partition, offset, _) in report.acked.items():
            places = where.get(value, [])
            if not places:
                lost.append((value, partition, offset))
            elif (partition, offset) not in places:
                moved.append((value, (partition, offset), places))
    strangers = [v for v in where if v not in sender]
    retried, twice = {}, {}
    resent = {id(r): handle_destroyed_resends(r.client_errors) for r in sender.values()}
    for value, places in sorted(where.items(), key=lambda item: min(item[1])):
        if len(places) < 2 or value not in sender:
            continue
        copies = [(p, o, _epoch_at(batches.get(p, []), o)) for p, o in places]
        epochs = [e for _, _, e in copies]
        partitions = {p for p, _, _ in copies}
        if sender[value].idempotent or len(partitions) != 1 or epochs != sorted(epochs):
            twice[value] = copies
            continue
        (partition,) = partitions
        same_epoch = len(epochs) - len(set(epochs))
        budget = resent[id(sender[value])]
        if same_epoch > budget[partition]:
            twice[value] = copies
        else:
            budget[partition] -= same_epoch
            retried[value] = copies
    if lost:
        problems.append(f"{len(lost)} acknowledged records are not in the log: {lost[:20]}")
    if moved:
        problems.append(f"{len(moved)} acknowledged records are elsewhere: {moved[:20]}")
    if strangers:
        problems.append(f"{len(strangers)} records nobody sent: {strangers[:20]}")
    if twice:
        several = list(twice.items())[:20]
        problems.append(
            f"{len(twice)} records are in the log more than once (partition, offset, leader "
            f"epoch): {several}"
        )
    return LogCheck(problems, retried)


_HANDLE_DESTROYED = re.compile(
    r"\[(\d+)\]: MessageSet with (\d+) message\(s\).*encountered error: "
    r"Local: Broker handle destroyed"
)


def handle_destroyed_resends(client_errors: Iterable[str]) -> Counter[int]:
    """Per partition, how many messages librdkafka resent because it dropped the handle of
    the broker they were in flight to (``check_log``)."""
    resent: Counter[int] = Counter()
    for line in client_errors:
        found = _HANDLE_DESTROYED.search(line)
        if found:
            resent[int(found.group(1))] += int(found.group(2))
    return resent


def _epoch_at(batches: list[StoredBatch], offset: int) -> int:
    """The leader epoch of the batch holding ``offset`` (-2: none does)."""
    i = bisect.bisect_right([b.base_offset for b in batches], offset) - 1
    return batches[i].leader_epoch if i >= 0 and batches[i].last_offset >= offset else -2


class QueuedProduce:
    """One acks=-1 Produce request (v9, one record) written to a broker's socket at once and
    answered whenever the broker gets to it: the way to leave a request waiting at a paused
    broker (the kernel accepts the connection and buffers the bytes)."""

    CORRELATION_ID = 7

    def __init__(self, address: str, topic: str, partition: int, value: str) -> None:
        host, port = address.rsplit(":", 1)
        self.value = value
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        batch = make_batch([value.encode()], timestamp_ms=int(time.time() * 1000))
        body = {
            "transactional_id": None,
            "acks": -1,
            "timeout_ms": 10_000,
            "topic_data": [
                {"name": topic, "partition_data": [{"index": partition, "records": batch}]}
            ],
        }
        parts = encode_request(ApiKey.PRODUCE, 9, self.CORRELATION_ID, "replication-tests", body)
        self.sock.sendall(b"".join(bytes(p) for p in parts))

    def answer(self, timeout_s: float) -> tuple[int, int]:
        """(error code, base offset) of the broker's answer; raises TimeoutError."""
        self.sock.settimeout(timeout_s)
        try:
            (size,) = struct.unpack(">i", self._read(4))
            correlation_id, body = decode_response(ApiKey.PRODUCE, 9, self._read(size))
        finally:
            self.sock.close()
        assert correlation_id == self.CORRELATION_ID, correlation_id
        (answer,) = body.responses[0].partition_responses
        return int(answer.error_code), int(answer.base_offset)

    def _read(self, count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = self.sock.recv(count - len(data))
            if not chunk:
                raise ConnectionError(f"the broker closed the connection after {len(data)} bytes")
            data += chunk
        return data


class ClientLines:
    """A librdkafka logger keeping only its lines on failed message sets ("MessageSet with
    N message(s) ... encountered error: E (actions A)") and on Metadata answers that list no
    broker ("0 brokers, N topics": librdkafka 2.13+ may then stop reconnecting for good,
    docs/compatibility.md), stamped, at most ``MAX`` of them."""

    MAX = 20_000
    _NO_BROKER = re.compile(r": 0 brokers, \d+ topics")

    def __init__(self, into: list[str]) -> None:
        self.into = into

    def log(self, level: int, fmt: str, *args: Any) -> None:
        line = fmt % args if args else fmt
        kept = "encountered error" in line or self._NO_BROKER.search(line) is not None
        if kept and len(self.into) < self.MAX:
            self.into.append(f"{time.strftime('%H:%M:%S')} {line}")


class RecentLines:
    """A librdkafka logger keeping its last ``MAX`` lines, stamped: a consumer's, written out
    (``write``) when a test finds it read nothing or too little (a nemesis run once had two
    consumers read nothing at all, with no client lines to tell why)."""

    MAX = 20_000
    DEBUG = "consumer,fetch,metadata,topic"  # the contexts worth keeping for a consumer

    def __init__(self) -> None:
        self.lines: deque[str] = deque(maxlen=self.MAX)

    def log(self, level: int, fmt: str, *args: Any) -> None:
        self.lines.append(f"{time.strftime('%H:%M:%S')} {fmt % args if args else fmt}")

    def write(self, path: Path) -> str:
        """The lines into ``path``; what to say of it."""
        path.write_text("".join(f"{line}\n" for line in self.lines))
        return f"{len(self.lines)} librdkafka lines of the consumer in {path}"


class _NullLogger:
    def log(self, *args: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *a, **k: None


NULL_LOGGER = _NullLogger()


# -- the cluster -----------------------------------------------------------------------------


@dataclass
class Cluster:
    """A running cluster (``spec``: ids, ports, files) with the settings it runs with, the
    broker processes started here, the brokers paused now, and the test's timeline."""

    spec: ClusterSpec
    settings: dict[str, dict[str, int]]
    started: float = field(default_factory=time.monotonic)
    children: list[subprocess.Popen[bytes]] = field(default_factory=list)
    timeline: list[str] = field(default_factory=list)
    paused: set[int] = field(default_factory=set)

    @property
    def bootstrap(self) -> str:
        return ",".join(self.address(b) for b in BROKERS)

    def host(self, node: int) -> str:
        """The address the node listens on (its own in ``netns_cluster.py``)."""
        return "127.0.0.1"

    def command_prefix(self, node: int) -> list[str]:
        """What the node's command runs under (``ip netns exec`` in ``netns_cluster.py``)."""
        return []

    def address(self, broker: int) -> str:
        return f"{self.host(broker)}:{self.spec.node(broker).ports[Port.CLIENT]}"

    @property
    def session_s(self) -> float:
        return self.settings["controller"]["broker_session_timeout_ms"] / 1000

    @property
    def lag_s(self) -> float:
        return self.settings["broker"]["replica_lag_time_max_ms"] / 1000

    def note(self, text: str) -> None:
        """Add a line to the test's timeline (seconds since the cluster came up)."""
        line = f"{time.monotonic() - self.started:7.2f}s {text}"
        self.timeline.append(line)
        print(line, flush=True)

    def story(self) -> str:
        return "timeline:\n  " + "\n  ".join(self.timeline)

    # -- processes -------------------------------------------------------------------------
    def pid(self, broker: int) -> int | None:
        """The broker's process id, None when it is not running."""
        return self.spec.running_pid(broker)

    def _signal(self, node: int, signum: signal.Signals) -> int:
        pid = self.pid(node)
        assert pid is not None, f"{_role(node)} {node} is not running\n{self.story()}"
        os.kill(pid, signum)
        self.note(f"{signum.name} {_role(node)} {node} (pid {pid})")
        return pid

    def kill(self, *nodes: int) -> None:
        """kill -9 each node (a broker or a controller), all before waiting, then wait until
        every process is gone."""
        pids = [self._signal(node, signal.SIGKILL) for node in nodes]
        for node, pid in zip(nodes, pids, strict=True):
            self.paused.discard(node)
            self._wait_gone(node, pid, EXIT_WAIT_S)

    def terminate(self, broker: int) -> float:
        """SIGTERM (a controlled shutdown); waits until the process is gone and returns how
        long that took."""
        start = time.monotonic()
        pid = self._signal(broker, signal.SIGTERM)
        self._wait_gone(broker, pid, TERM_WAIT_S)
        return time.monotonic() - start

    def pause(self, broker: int) -> None:
        self._signal(broker, signal.SIGSTOP)
        self.paused.add(broker)

    def resume(self, broker: int) -> None:
        self._signal(broker, signal.SIGCONT)
        self.paused.discard(broker)

    def _wait_gone(self, node: int, pid: int, timeout_s: float) -> None:
        for child in self.children:
            if child.pid == pid:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=timeout_s)
        marker = str(self.spec.config_path(node))
        wait_for(
            f"{_role(node)} {node} (pid {pid}) to exit",
            lambda: True if not process_alive(pid, marker) else None,
            timeout_s,
            0.05,
        )
        self.spec.pid_path(node).unlink(missing_ok=True)

    def exit_code(self, broker_pid: int) -> int | None:
        """The exit status of a process started here (None: not ours, or running)."""
        child = next((c for c in self.children if c.pid == broker_pid), None)
        return None if child is None else child.poll()

    def start(self, node: int) -> int:
        """Start a stopped node (a broker or a controller) again, as the supervisor does;
        returns its pid."""
        assert self.pid(node) is None, f"{_role(node)} {node} runs already"
        config = self.spec.config_path(node)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        with open(self.spec.log_path(node), "ab") as log:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            log.write(f"--- {stamp} tests/replication starts node {node}\n".encode())
            log.flush()
            child = subprocess.Popen(
                [
                    *self.command_prefix(node),
                    *(sys.executable, "-m", "runnel", "node", "--config", str(config)),
                ],
                cwd=self.spec.node_dir(node),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,
            )
        self.children.append(child)
        self.spec.pid_path(node).write_text(f"{child.pid}\n")
        self.note(f"started {_role(node)} {node} (pid {child.pid})")
        return child.pid

    def active_controller(self) -> int | None:
        """The active controller's id as ``runnel cluster status`` finds it; None if no
        controller answers as active."""
        done = runnel("cluster", "status", "--json", "--data-dir", str(self.spec.data_dir))
        if done.returncode not in (0, 1) or not done.stdout:  # 1: unhealthy, or no controller
            return None
        found = json.loads(done.stdout).get("controller_id")
        return None if found is None else int(found)

    def all_pids(self) -> list[int]:
        pids = [read_pid(self.spec.pid_path(n.node_id)) for n in self.spec.nodes()]
        pids += [c.pid for c in self.children]
        return sorted({p for p in pids if p is not None})

    def metrics_text(self, node: int, timeout_s: float = 5.0) -> str:
        """The node's ``/metrics`` page (Prometheus text)."""
        port = self.spec.node(node).ports[Port.METRICS]
        url = f"http://{self.host(node)}:{port}/metrics"
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            text: str = response.read().decode()
        return text

    def raft_state(self, node: int, timeout_s: float = 5.0) -> dict[str, str]:
        """The node's Raft and metadata state from its metrics: role, raft_leader_id,
        raft_epoch, raft_high_watermark, metadata_applied_offset (as printed: "3.0"),
        image_offset and image_digest ("?" for what is missing). Raises OSError when the
        metrics do not answer."""
        text = self.metrics_text(node, timeout_s=timeout_s)
        state = {"role": "?"}
        role = re.search(r'^runnel_raft_role\{[^}]*role="(\w+)"\} 1', text, re.MULTILINE)
        if role:
            state["role"] = role.group(1)
        for name in ("raft_leader_id", "raft_epoch", "raft_high_watermark",
                     "metadata_applied_offset"):  # fmt: skip
            found = re.search(rf"^runnel_{name}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE)
            state[name] = found.group(1) if found else "?"
        image = re.search(r"^runnel_metadata_image\{([^}]*)\}", text, re.MULTILINE)
        labels = dict(re.findall(r'(\w+)="([^"]*)"', image.group(1))) if image else {}
        state["image_offset"] = labels.get("offset", "?")
        state["image_digest"] = labels.get("digest", "?")
        return state

    def same_metadata_image(self, nodes: Iterable[int]) -> bool | None:
        """True once ``nodes`` (controllers) follow one Raft leader and hold the same metadata
        image (offset and digest); None until then, or while one's metrics do not answer."""
        try:
            states = [self.raft_state(n) for n in nodes]
        except OSError:
            return None
        images = {(s["image_offset"], s["image_digest"]) for s in states}
        leaders = {s["raft_leader_id"] for s in states}
        known = all("?" not in image for image in images)
        return True if len(images) == 1 and len(leaders) == 1 and known else None

    def metadata_state(self, node: int) -> str:
        """One line of ``raft_state``, or why there is none: printed at the end of every
        test, so a node that stopped applying the metadata log shows."""
        if node in self.paused:
            return "paused"
        try:
            state = self.raft_state(node, timeout_s=2.0)
        except OSError as e:
            return f"no metrics: {e}"
        return " ".join(f"{k}={v}" for k, v in state.items())

    # -- metadata --------------------------------------------------------------------------
    def admin(self, via: Iterable[int] | None = None) -> AdminClient:
        brokers = list(via) if via is not None else self.live()
        return AdminClient(
            {
                "bootstrap.servers": ",".join(self.address(b) for b in brokers),
                "logger": NULL_LOGGER,
                "error_cb": _quiet,
            }
        )

    def live(self) -> list[int]:
        """Brokers running and not paused."""
        return [b for b in BROKERS if self.pid(b) is not None and b not in self.paused]

    def metadata(self, via: int, topic: str | None = None) -> Any:
        return self.admin([via]).list_topics(topic, timeout=METADATA_TIMEOUT_S)

    def partitions(self, topic: str, via: Iterable[int] | None = None) -> list[PartitionView]:
        """The topic's partitions as one of ``via`` (default: the live brokers) answers;
        AssertionError if none answers."""
        problems = []
        for broker in via if via is not None else self.live():
            try:
                found = self.metadata(broker, topic).topics.get(topic)
            except KafkaException as e:
                problems.append(f"{broker}: {e}")
                continue
            if found is None or found.error is not None:
                problems.append(f"{broker}: {None if found is None else found.error}")
                continue
            return [
                PartitionView(
                    p.id,
                    p.leader,
                    tuple(p.replicas),
                    tuple(sorted(p.isrs)),
                    None if p.error is None else p.error.name(),
                )
                for p in sorted(found.partitions.values(), key=lambda p: p.id)
            ]
        raise AssertionError(f"no broker described {topic}: {problems}")

    def partition(
        self, topic: str, partition: int, via: Iterable[int] | None = None
    ) -> PartitionView:
        return self.partitions(topic, via)[partition]

    def unfenced(self, via: int) -> list[int]:
        """The brokers ``via`` lists (fenced ones are left out)."""
        return sorted(self.metadata(via).brokers)

    def wait_partitions(
        self,
        what: str,
        topic: str,
        ok: Callable[[list[PartitionView]], bool],
        timeout_s: float,
        via: Iterable[int] | None = None,
    ) -> list[PartitionView]:
        """Until every live broker (or each of ``via``) describes the topic so that ``ok``
        holds; the failure names what was seen last."""
        seen: dict[int, Any] = {}

        def probe() -> list[PartitionView] | None:
            views = None
            for broker in via if via is not None else self.live():
                try:
                    views = self.partitions(topic, [broker])
                except AssertionError as e:
                    seen[broker] = str(e)
                    return None
                seen[broker] = views
                if not ok(views):
                    return None
            return views

        try:
            views = wait_for(what, probe, timeout_s, 0.25)
        except AssertionError as e:
            raise AssertionError(f"{e}; last seen by broker: {seen}\n{self.story()}") from None
        self.note(f"{what}: {_brief(views)}")
        return views

    def wait_full_isr(self, topic: str, timeout_s: float = 40) -> list[PartitionView]:
        """Until every broker runs, lists all three unfenced, and describes every partition
        with a leader and all three replicas in sync."""
        wait_for(
            "every broker to list all three unfenced",
            lambda: True if all(self._lists_all(b) for b in BROKERS) else None,
            timeout_s,
            0.25,
        )
        return self.wait_partitions(
            f"{topic}: a leader and a full ISR everywhere",
            topic,
            lambda views: all(v.leader in BROKERS and v.isr == BROKERS for v in views),
            timeout_s,
            via=BROKERS,
        )

    def _lists_all(self, broker: int) -> bool:
        try:
            return self.pid(broker) is not None and tuple(self.unfenced(broker)) == BROKERS
        except KafkaException:
            return False

    def create_topic(
        self,
        topic: str,
        partitions: int,
        min_insync: int = 2,
        timeout_s: float = 30,
        configs: dict[str, str] | None = None,
    ) -> list[PartitionView]:
        new = NewTopic(
            topic,
            num_partitions=partitions,
            replication_factor=3,
            config={"min.insync.replicas": str(min_insync), **(configs or {})},
        )
        admin = self.admin()  # it must outlive the future
        admin.create_topics([new], operation_timeout=20)[topic].result(timeout=timeout_s)
        return self.wait_full_isr(topic, timeout_s)

    # -- offsets and records ---------------------------------------------------------------
    def acks_all_producer(self) -> Producer:
        """A producer to the live brokers with acks=all and the client's retries (it
        reports through its delivery callbacks, quietly otherwise)."""
        return Producer(
            {
                "bootstrap.servers": ",".join(self.address(b) for b in self.live()),
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 30_000,
                "logger": NULL_LOGGER,
                "error_cb": lambda _: None,
            }
        )

    def consumer(self, **config: Any) -> Consumer:
        return Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "replication-tests",
                "enable.auto.commit": False,
                "enable.partition.eof": False,
                "logger": NULL_LOGGER,
                "error_cb": _quiet,
                **config,
            }
        )

    def close_consumer(self, consumer: Consumer, what: str) -> None:
        """``runnel.kafka_close.close_consumer``: a close that librdkafka's deadlock kept from
        returning is said on the timeline, and the test goes on."""
        if not close_consumer(consumer):
            self.note(
                f"{what}: Consumer.close() did not return (librdkafka's deadlock, "
                "confluentinc/librdkafka#5476; see runnel/kafka_close.py): left behind"
            )

    def answered_high_watermarks(self, topic: str, partitions: int) -> dict[int, int] | None:
        """``high_watermarks``, or None when a leader answers a retriable error (leadership
        moving: the periodic rebalancing, say), for a ``wait_for`` to ask again."""
        try:
            return self.high_watermarks(topic, partitions)
        except KafkaException as e:
            if e.args[0].code() not in RETRIABLE:
                raise
            self.note(f"{topic}: high watermarks not answered yet ({e.args[0].name()})")
            return None

    def high_watermarks(self, topic: str, partitions: int) -> dict[int, int]:
        consumer = self.consumer()
        try:
            return {
                p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1]
                for p in range(partitions)
            }
        finally:
            self.close_consumer(consumer, "the high watermarks' consumer")

    def read_all(
        self, topic: str, partitions: int, timeout_s: float = 60
    ) -> dict[int, list[tuple[int, str]]]:
        """Every record of the topic, from the earliest offset to the high watermark of each
        partition as it is now: partition -> [(offset, value)] in the order read."""
        ends = wait_for(
            f"{topic}: the leaders' high watermarks",
            lambda: self.answered_high_watermarks(topic, partitions),
            METADATA_TIMEOUT_S * 5,
        )
        out: dict[int, list[tuple[int, str]]] = {p: [] for p in range(partitions)}
        lines = RecentLines()
        consumer = self.consumer(debug=RecentLines.DEBUG, logger=lines)
        try:
            consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
            deadline = time.monotonic() + timeout_s
            done = {p for p in range(partitions) if ends[p] == 0}
            while len(done) < partitions:
                if time.monotonic() >= deadline:
                    said = lines.write(self.spec.data_dir / f"read-{topic}-client-lines.log")
                    raise AssertionError(
                        f"reading {topic} to {ends} timed out; read up to "
                        f"{ {p: (r[-1][0] if r else None) for p, r in out.items()} }; {said}"
                    )
                for m in consumer.consume(500, timeout=1.0):
                    if m.error() is not None:
                        continue
                    out[m.partition()].append((m.offset(), m.value().decode()))
                    if m.offset() + 1 >= ends[m.partition()]:
                        done.add(m.partition())
        finally:
            self.close_consumer(consumer, "the final read's consumer")
        return out

    # -- what is stored ----------------------------------------------------------------------
    def partition_dir(self, broker: int, topic: str, partition: int) -> Path:
        return self.spec.node_dir(broker) / "data" / f"{topic}-{partition}"

    def stored_batches(self, broker: int, topic: str, partition: int) -> list[StoredBatch]:
        """Every whole batch of the broker's replica, read from its segment files (a torn
        tail of a segment still being written is left out)."""
        directory = self.partition_dir(broker, topic, partition)
        out = []
        for segment in find_segments(directory):
            for item in scan_segment(segment.path):
                if isinstance(item, BrokenTail):
                    break
                h = item.header
                out.append(
                    StoredBatch(
                        h.base_offset,
                        h.last_offset,
                        h.partition_leader_epoch,
                        h.crc,
                        item.crc_valid,
                    )
                )
        return out

    def log_ends(self, topic: str, partition: int) -> dict[int, int]:
        """Each replica's log end offset on disk."""
        return {
            b: (batches[-1].last_offset + 1 if batches else 0)
            for b in BROKERS
            for batches in [self.stored_batches(b, topic, partition)]
        }

    def wait_replicas_caught_up(
        self, topic: str, partitions: int, timeout_s: float = 30
    ) -> dict[int, int]:
        """Until every replica's log on disk ends at its partition's high watermark (run it
        once nothing produces and the ISR is full); returns the high watermarks."""
        seen: list[Any] = [None]

        def probe() -> dict[int, int] | None:
            hws = self.answered_high_watermarks(topic, partitions)
            if hws is None:
                return None
            ends = {p: self.log_ends(topic, p) for p in range(partitions)}
            seen[0] = (hws, ends)
            return hws if all(set(ends[p].values()) == {hws[p]} for p in hws) else None

        try:
            hws = wait_for("every replica to end at the high watermark", probe, timeout_s, 0.5)
        except AssertionError as e:
            raise AssertionError(
                f"{e}: (high watermarks, log ends per partition and replica) {seen[0]}\n"
                f"{self.story()}"
            ) from None
        self.note(f"{topic}: every replica ends at the high watermark {hws}")
        return hws

    def replica_disagreements(self, topic: str, partition: int, below: int) -> list[str]:
        """How the replicas' stored batches below offset ``below`` differ (empty: they
        agree): each must hold batches covering offsets 0 to ``below`` - 1 exactly, with
        valid CRCs, and all three the same batches (offsets, leader epoch, CRC)."""
        problems = []
        kept: dict[int, list[StoredBatch]] = {}
        for broker in BROKERS:
            batches = self.stored_batches(broker, topic, partition)
            kept[broker] = [b for b in batches if b.base_offset < below]
            expected = 0
            for b in kept[broker]:
                if b.base_offset != expected or not b.crc_valid:
                    problems.append(f"replica {broker}: {b} where offset {expected} was next")
                expected = b.last_offset + 1
            if expected != below:
                problems.append(f"replica {broker}: batches below {below} end at {expected}")
        reference = kept[BROKERS[0]]
        for broker in BROKERS[1:]:
            if kept[broker] != reference:
                problems.append(
                    f"replicas {BROKERS[0]} and {broker} differ below {below}: "
                    + _first_difference(reference, kept[broker])
                )
        return problems

    def epochs(self, broker: int, topic: str, partition: int) -> list[int]:
        """The distinct leader epochs of a replica's batches, in log order."""
        out: list[int] = []
        for b in self.stored_batches(broker, topic, partition):
            if not out or out[-1] != b.leader_epoch:
                out.append(b.leader_epoch)
        return out

    # -- logs ------------------------------------------------------------------------------
    def log_size(self, node_id: int) -> int:
        return self.spec.log_path(node_id).stat().st_size

    def log_since(self, node_id: int, position: int) -> list[str]:
        """The node's log lines written after byte ``position``."""
        with open(self.spec.log_path(node_id), "rb") as f:
            f.seek(position)
            return f.read().decode(errors="replace").splitlines()

    def log_excerpt(self, node_id: int, lines: int = LOG_TAIL_LINES) -> str:
        path = self.spec.log_path(node_id)
        try:
            text = path.read_text(errors="replace").splitlines()
        except OSError as e:
            return f"(unreadable: {e})"
        notable = [
            line
            for line in text
            if re.search(r"WARNING|ERROR|CRITICAL|Traceback|tests/replication starts", line)
        ]
        head = f"--- {path}: {len(notable)} warning/error lines (last 40):"
        return "\n".join([head, *notable[-40:], f"--- last {lines} lines:", *text[-lines:]])


def _role(node: int) -> str:
    return "broker" if node in BROKERS else "controller"


def _brief(views: list[PartitionView]) -> str:
    return "; ".join(
        f"p{v.partition} leader {v.leader} isr {list(v.isr)}" + (f" {v.error}" if v.error else "")
        for v in views
    )


def _first_difference(a: list[StoredBatch], b: list[StoredBatch]) -> str:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return f"batch #{i}: {x} vs {y}; next {[str(s) for s in a[i : i + 3]]} vs " + str(
                [str(s) for s in b[i : i + 3]]
            )
    return f"{len(a)} vs {len(b)} batches"


# -- what the fault tests share ----------------------------------------------------------------

ONCE = {  # acks=all, each value sent once
    "acks": "all",
    "enable.idempotence": False,
    "retries": 0,
    "linger.ms": 5,
    "request.timeout.ms": 5000,
    "message.timeout.ms": 10000,
    "topic.metadata.refresh.interval.ms": 1000,
}


def check_outcome(
    c: Cluster,
    topic: str,
    partitions: int,
    reports: list[Any],
    *,
    tail: Any = None,
) -> dict[int, list[tuple[int, str]]]:
    """Once nothing produces and the ISR is full: every replica caught up and equal below
    the high watermark, and the whole log keeps every promise made to the producers (and
    holds what the consumer ``tail`` saw); returns the log."""
    c.wait_full_isr(topic)
    hws = c.wait_replicas_caught_up(topic, partitions)
    disagreements = [
        d for p in range(partitions) for d in c.replica_disagreements(topic, p, hws[p])
    ]
    final = c.read_all(topic, partitions)
    stored = {p: c.stored_batches(BROKERS[0], topic, p) for p in range(partitions)}
    problems, retried = check_log(final, reports, stored)
    if tail is not None:
        problems += tail.problems(final)
    said = "\n".join(f"producer {i}: {r.summary()}" for i, r in enumerate(reports))
    epochs = {b: [c.epochs(b, topic, p) for p in range(partitions)] for b in BROKERS}
    client = _save_client_errors(c, reports) if disagreements or problems else []
    assert not disagreements and not problems, (
        "replicas disagree:\n  " + "\n  ".join(disagreements) + "\nlog problems:\n  "
        + "\n  ".join(problems) + f"\n{said}\nhigh watermarks {hws}; epochs by replica "
        f"{epochs}\nthe client's failed message sets: {'; '.join(client) or 'none'}\n{c.story()}"
    )  # fmt: skip
    c.note(f"{topic}: log and replicas check out; {said}; epochs by replica {epochs}")
    if retried:
        kept = list(retried.items())[:10]
        c.note(f"resent (a leader change, or a broker handle dropped), first copy kept: {kept}")
    return final


def _save_client_errors(c: Cluster, reports: list[Any]) -> list[str]:
    """Write each producer's kept lines (``ClientLines``) beside the cluster's files (they
    can be thousands); say where."""
    saved = []
    for i, report in enumerate(reports):
        if report.client_errors:
            path = c.spec.data_dir / f"producer-{i}-client-lines.log"
            path.write_text("".join(f"{line}\n" for line in report.client_errors))
            saved.append(f"producer {i}: {len(report.client_errors)} in {path}")
    return saved


def produce_one(c: Cluster, topic: str, value: str) -> tuple[int | None, int]:
    """One acks=all record to partition 0, not retried: (error code or None, offset)."""
    producer = Producer(
        {
            **ONCE,
            "bootstrap.servers": c.bootstrap,
            "message.timeout.ms": 8000,
            "logger": NULL_LOGGER,
        }
    )
    outcome: list[tuple[int | None, int]] = []
    producer.produce(
        topic,
        value.encode(),
        partition=0,
        on_delivery=lambda e, m: outcome.append((None if e is None else e.code(), m.offset())),
    )
    left = producer.flush(15)
    assert left == 0 and len(outcome) == 1, f"no delivery report for {value}\n{c.story()}"
    code, offset = outcome[0]
    c.note(f"produced {value}: {'ok at ' + str(offset) if code is None else error_name(code)}")
    return outcome[0]


def wait_acks(
    c: Cluster,
    load: Any,
    since: float,
    partition: int,
    count: int,
    what: str,
    *,
    timeout_s: float = 30,
) -> None:
    def acked() -> bool | None:
        return True if load.acked_since(since, partition) >= count else None

    try:
        wait_for(what, acked, timeout_s)
    except AssertionError as e:
        client = "; ".join(_save_client_errors(c, [load.report])) or "none"
        raise AssertionError(
            f"{e}; {load.report.summary()}\nthe client's kept lines: {client}\n{c.story()}"
        ) from None
    c.note(f"{what}: {load.report.summary()}")


def wait_new_leader(c: Cluster, topic: str, partition: int, old: int, timeout_s: float) -> int:
    views = c.wait_partitions(
        f"{topic}-{partition}: a leader other than {old}",
        topic,
        lambda v: v[partition].leader not in (old, -1) and old not in v[partition].isr,
        timeout_s,
    )
    return int(views[partition].leader)


# -- starting and stopping -------------------------------------------------------------------


def with_settings(**sections: dict[str, int]) -> Callable[[F], F]:
    """A test decorator: the cluster of ``replication_cluster`` runs with these settings
    over ``OVERRIDES`` (section name -> key -> value)."""

    def mark(test: F) -> F:
        test.cluster_settings = sections  # type: ignore[attr-defined]
        return test

    return mark


def with_controllers(count: int) -> Callable[[F], F]:
    """A test decorator: the cluster of ``replication_cluster`` has ``count`` controllers
    (a Raft quorum) instead of one; their ids are 1 to ``count``."""

    def mark(test: F) -> F:
        test.cluster_controllers = count  # type: ignore[attr-defined]
        return test

    return mark


def settings(overrides: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    return {
        section: {**OVERRIDES.get(section, {}), **overrides.get(section, {})}
        for section in {*OVERRIDES, *overrides}
    }


def _settings_toml(chosen: dict[str, dict[str, int]]) -> str:
    lines = ["", "# tests/replication/fault_cluster.py: short timeouts"]
    for section, values in sorted(chosen.items()):
        lines.append(f"[{section}]")
        lines += [f"{key} = {value}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def start_cluster(
    data_dir: Path,
    overrides: dict[str, dict[str, int]] | None = None,
    before_up: Callable[[ClusterSpec], None] | None = None,
    controllers: int = 1,
) -> Cluster:
    """A new cluster of ``controllers`` controllers and 3 brokers in ``data_dir``, healthy,
    with the settings of ``OVERRIDES`` and then of ``overrides``; ``before_up`` runs once the
    nodes' directories and configs exist, before any node starts."""
    nodes = controllers + len(BROKERS)
    spec = ClusterSpec(controllers, len(BROKERS), data_dir.absolute(), free_base_port(nodes))
    spec.save()
    spec.write_node_configs()
    if before_up is not None:
        before_up(spec)
    chosen = settings(overrides or {})
    for node in spec.nodes():
        with open(spec.config_path(node.node_id), "a") as f:
            f.write(_settings_toml(chosen))
    cluster = Cluster(spec, chosen)
    try:
        done = runnel(
            "cluster", "up", "--once", "--data-dir", str(spec.data_dir), timeout_s=UP_TIMEOUT_S
        )
        assert done.returncode == 0, f"cluster up: {done.stdout}{done.stderr}"
        assert f"bootstrap: {spec.kafka_bootstrap}" in done.stdout, done.stdout
    except BaseException:
        stop_cluster(cluster)
        raise
    cluster.started = time.monotonic()
    cluster.note(f"cluster up in {spec.data_dir}, bootstrap {spec.kafka_bootstrap}")
    return cluster


def stop_cluster(cluster: Cluster) -> None:
    """kill -9 every process of the cluster and reap the ones started here."""
    for pid in cluster.all_pids():
        if process_alive(pid, str(cluster.spec.data_dir)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for child in cluster.children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=EXIT_WAIT_S)
    deadline = time.monotonic() + EXIT_WAIT_S
    for pid in cluster.all_pids():
        while process_alive(pid, str(cluster.spec.data_dir)) and time.monotonic() < deadline:
            time.sleep(0.05)


@pytest.fixture
def replication_cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    """A fresh cluster per test (with the settings of its ``with_settings``, if any); on the
    way out every process is killed, and each node's warnings and last lines are printed
    (pytest shows them when the test failed)."""
    overrides = getattr(request.function, "cluster_settings", None)
    controllers = getattr(request.function, "cluster_controllers", 1)
    with running(tmp_path / "cluster", overrides, controllers) as cluster:
        yield cluster


@contextlib.contextmanager
def running(
    data_dir: Path, overrides: dict[str, dict[str, int]] | None = None, controllers: int = 1
) -> Iterator[Cluster]:
    """A healthy cluster (``start_cluster``), finished (``finish``) on the way out."""
    cluster = start_cluster(data_dir, overrides, controllers=controllers)
    try:
        yield cluster
    finally:
        finish(cluster)


def finish(cluster: Cluster) -> None:
    """Kill every process of the cluster, and print each node's Raft and metadata state (read
    before the kill), the test's timeline, and each node's warnings and last lines."""
    states = {n.node_id: cluster.metadata_state(n.node_id) for n in cluster.spec.nodes()}
    stop_cluster(cluster)
    print(cluster.story())
    for node_id, state in states.items():
        print(f"node {node_id} at the end: {state}")
    for node in cluster.spec.nodes():
        print(cluster.log_excerpt(node.node_id))
