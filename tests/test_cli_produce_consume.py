"""``runnel produce`` and ``runnel consume`` (confluent-kafka underneath) against a real local
cluster of 1 controller and 2 brokers, run as a person would: lines on standard input, records
on standard output.

One cluster serves the module; each test uses topics of its own. The cluster is stopped at
the end and whatever is left is kill -9'd, found by its pid files. Every wait is bounded.
"""

from __future__ import annotations

import base64
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient
from test_local_cluster import REPO, Cluster, free_base_port, wait_for
from test_local_cluster import runnel as local_runnel

from runnel.local_cluster import process_alive

pytestmark = pytest.mark.slow
WAIT_S = 30
FOLLOW_TIMEOUT_S = 5  # consume --follow: stops this long after its last record


@dataclass(frozen=True, slots=True)
class Local:
    cluster: Cluster
    bootstrap: str

    def create_topic(self, name: str, partitions: int) -> None:
        """With ``runnel topics create``; returns once every broker lists the topic."""
        self.cluster.ok(
            "topics", "create", name, "--partitions", str(partitions),
            "--replication-factor", "1",
        )  # fmt: skip
        for address in self.bootstrap.split(","):
            wait_for(f"{address} to list {name}", partial(_listed, address, name), WAIT_S)

    def partition_dir(self, topic: str, partition: int) -> Path:
        (found,) = self.cluster.data_dir.glob(f"node-*/data/{topic}-{partition}")
        return found


def _listed(address: str, topic: str) -> bool | None:
    """Whether one broker lists ``topic`` and both brokers (asked by confluent-kafka)."""
    try:
        metadata = AdminClient({"bootstrap.servers": address}).list_topics(timeout=5)
    except KafkaException:
        return None
    return (topic in metadata.topics and len(metadata.brokers) == 2) or None


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    cluster = Cluster(tmp_path_factory.mktemp("cli") / "cluster", free_base_port(3))
    try:
        yield Local(cluster, cluster.up_two_brokers())
    finally:
        cluster.run("cluster", "down")
        for pid in cluster.pids():  # whatever is left: kill -9, found by pid file
            if process_alive(pid, str(cluster.data_dir)) or process_alive(pid, "cluster\0up"):
                os.kill(pid, signal.SIGKILL)


def runnel(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return local_runnel(*args, stdin=stdin, timeout_s=WAIT_S + 30)


def ok(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    done = runnel(*args, stdin=stdin)
    assert done.returncode == 0, f"runnel {' '.join(args)}: {done.stdout}{done.stderr}"
    return done


def consume_json(local: Local, topic: str, *args: str) -> list[dict[str, Any]]:
    done = ok("consume", topic, "--bootstrap", local.bootstrap, "--json", *args)
    return [json.loads(line) for line in done.stdout.splitlines()]


def stored_codecs(local: Local, topic: str, partitions: int) -> list[tuple[str, int]]:
    """(codec, producer id) of every batch, read with ``runnel log dump``."""
    out = []
    for p in range(partitions):
        dump = ok("log", "dump", str(local.partition_dir(topic, p)), "--json")
        out += [(b["codec"], b["producer_id"]) for b in map(json.loads, dump.stdout.splitlines())]
    return out


def test_produced_lines_are_consumed_exactly_keyed_unkeyed_with_headers(local: Local) -> None:
    topic = "cli-roundtrip"
    local.create_topic(topic, 3)
    before_ms = int(time.time() * 1000)
    keyed = [(f"key-{i % 4}", f"value {i}: with a colon; " * 4) for i in range(30)]
    done = ok(
        "produce", topic, "--bootstrap", local.bootstrap, "--key-separator", ":",
        "--header", "source=cli", "--header", "empty=", "--header", "eq=a=b",
        "--compression", "gzip",
        stdin="".join(f"{k}:{v}\n" for k, v in keyed),
    )  # fmt: skip
    assert f"produced 30 records to {topic}" in done.stderr
    unkeyed = [f"unkeyed {i} " * 6 for i in range(10)]
    # --data-dir (the local cluster's cluster.json) instead of --bootstrap
    produced = ok(
        "produce", topic, "--data-dir", str(local.cluster.data_dir), "--compression", "zstd",
        "--idempotent", stdin="".join(f"{v}\n" for v in unkeyed),
    )  # fmt: skip
    assert produced.stdout == "" and f"produced 10 records to {topic}" in produced.stderr
    after_ms = int(time.time() * 1000)

    records = consume_json(local, topic, "--from", "earliest")
    headers = [["source", "cli"], ["empty", ""], ["eq", "a=b"]]
    sent: list[tuple[str | None, str, list[list[str]]]] = [(k, v, headers) for k, v in keyed]
    sent += [(None, v, []) for v in unkeyed]
    got = [(r["key"], r["value"], r["headers"]) for r in records]
    assert sorted(got, key=repr) == sorted(sent, key=repr)
    assert all(before_ms <= r["timestamp"] <= after_ms for r in records), records
    for p in range(3):
        mine = [r for r in records if r["partition"] == p]
        assert [r["offset"] for r in mine] == list(range(len(mine)))
        order = [sent.index((r["key"], r["value"], r["headers"])) for r in mine]
        assert order == sorted(order), f"partition {p}: not in stdin order"

    plain = ok("consume", topic, "--bootstrap", local.bootstrap)
    assert sorted(plain.stdout.splitlines()) == sorted(v for _, v, _ in sent)
    assert f"consumed 40 records from {topic}" in plain.stderr
    batches = set(stored_codecs(local, topic, 3))
    assert {codec for codec, _ in batches} == {"gzip", "zstd"}
    assert all(pid == -1 for codec, pid in batches if codec == "gzip")
    assert all(pid >= 0 for codec, pid in batches if codec == "zstd")  # --idempotent


def _produce(local: Local, topic: str, values: list[str], partition: int) -> None:
    ok(
        "produce", topic, "--bootstrap", local.bootstrap, "--partition", str(partition),
        stdin="".join(f"{v}\n" for v in values),
    )  # fmt: skip


def test_consume_from_latest_an_offset_a_timestamp_and_at_most_n(local: Local) -> None:
    topic = "cli-positions"
    local.create_topic(topic, 2)
    first = [f"a{i}" for i in range(10)]
    _produce(local, topic, first, 0)
    since_ms = int(time.time() * 1000) + 1
    time.sleep(0.01)
    later = {0: [f"b{i}" for i in range(5)], 1: [f"c{i}" for i in range(3)]}
    for partition, lines in later.items():
        _produce(local, topic, lines, partition)
    everything = {0: first + later[0], 1: later[1]}

    def values(*args: str) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for r in consume_json(local, topic, *args):
            out.setdefault(r["partition"], []).append(r["value"])
        return out

    assert values("--from", "earliest") == everything
    latest = ok("consume", topic, "--bootstrap", local.bootstrap, "--from", "latest")
    assert latest.stdout == "" and f"consumed 0 records from {topic}" in latest.stderr
    assert values("--partition", "0", "--from", "3") == {0: everything[0][3:]}
    assert values("--from", f"@{since_ms}") == later
    assert values("--partition", "0", "--max-messages", "4") == {0: first[:4]}
    assert values("--partition", "1", "--partition", "0", "--from", "2") == {
        0: everything[0][2:],
        1: everything[1][2:],
    }
    assert values("--partition", "0", "--partition", "0") == {0: everything[0]}  # once
    past = runnel("consume", topic, "--bootstrap", local.bootstrap, "--partition", "1",
                  "--from", "999")  # fmt: skip
    assert (past.returncode, past.stdout) == (1, ""), past.stderr
    assert "offset 999 is out of range [0, 3) for partition 1" in past.stderr, past.stderr


def test_bad_input_exits_non_zero_with_a_clear_message(local: Local) -> None:
    local.create_topic("cli-bad", 1)
    b = ["--bootstrap", local.bootstrap]
    for args, code, message in [
        (["consume", "cli-nope", *b], 1, "topic 'cli-nope': "),
        (["consume", "cli-bad", *b, "--from", "yesterday"], 1, "--from 'yesterday': give"),
        (["consume", "cli-bad", *b, "--from", "@soon"], 1, "--from '@soon': give"),
        (["consume", "cli-bad", *b, "--partition", "7"], 1, "has no partition 7"),
        (["produce", "cli-bad", *b, "--header", "no-equals"], 2, "'no-equals' is not K=V"),
        (["produce", "cli-bad", *b, "--compression", "brotli"], 2, "invalid choice: 'brotli'"),
        (["consume", "cli-bad", "--bootstrap", "nowhere"], 2, "'nowhere' is not HOST:PORT"),
        (["consume", "cli-bad", "--data-dir", str(REPO / "no-such")], 1, "no local cluster in"),
        (
            ["consume", "cli-bad", "--bootstrap", "127.0.0.1:1"],
            1,
            "runnel: error: cannot reach the cluster at 127.0.0.1:1: ",
        ),
    ]:
        done = runnel(*args, stdin="x\n")
        assert (done.returncode, done.stdout) == (code, ""), (args, done.stderr)
        assert message in done.stderr and "Traceback" not in done.stderr, (args, done.stderr)
    assert "Unknown topic" in runnel("consume", "cli-nope", *b).stderr


def test_producing_to_a_topic_that_does_not_exist_says_so(local: Local) -> None:
    done = runnel(
        "produce", "cli-absent", "--bootstrap", local.bootstrap, "--timeout-s", "3", stdin="x\n"
    )
    assert done.returncode == 1, done.stderr
    assert "cli-absent" in done.stderr and re.search(
        r"unknown topic|not exist|not found", done.stderr, re.IGNORECASE
    ), done.stderr


def test_consume_follow_prints_records_produced_meanwhile_and_stops_after_timeout_s(
    local: Local, tmp_path: Path
) -> None:
    topic = "cli-follow"
    local.create_topic(topic, 1)
    _produce(local, topic, ["a0", "a1"], 0)
    producer = Producer({"bootstrap.servers": local.bootstrap})
    producer.list_topics(topic, timeout=10)  # connected before the consumer starts waiting
    stderr = tmp_path / "follow.stderr"
    with stderr.open("w") as errors:
        consumer = subprocess.Popen(
            [sys.executable, "-m", "runnel", "consume", topic, "--bootstrap", local.bootstrap,
             "--follow", "--timeout-s", str(FOLLOW_TIMEOUT_S)],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE, stderr=errors, text=True,
        )  # fmt: skip
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert consumer.stdout is not None
        for line in consumer.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)  # end of output

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        printed = [lines.get(timeout=WAIT_S), lines.get(timeout=WAIT_S)]
        assert printed == ["a0", "a1"]
        # Meanwhile a consume without --follow reads to the end and stops: it waits for an
        # empty fetch, longer than the one the --follow consumer had in flight, so that one
        # is past the end of the partition too and only --follow keeps it going.
        plain = ok("consume", topic, "--bootstrap", local.bootstrap)
        assert plain.stdout.splitlines() == ["a0", "a1"]
        producer.produce(topic, b"b0", partition=0)
        assert producer.flush(WAIT_S) == 0
        while (line := lines.get(timeout=WAIT_S)) is not None:
            printed.append(line)
        assert consumer.wait(WAIT_S) == 0  # it stopped by itself, FOLLOW_TIMEOUT_S after b0
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait(WAIT_S)
        reader.join(WAIT_S)
    assert printed == ["a0", "a1", "b0"]
    assert f"consumed 3 records from {topic}" in stderr.read_text()


def test_produce_acks_zero_one_and_all_deliver_and_only_acks_zero_misses_a_refusal(
    local: Local,
) -> None:
    topic = "cli-acks"
    local.cluster.ok(
        "topics", "create", topic, "--partitions", "1", "--replication-factor", "2",
        "--config", "max.message.bytes=200",
    )  # fmt: skip
    for address in local.bootstrap.split(","):
        wait_for(f"{address} to list {topic}", partial(_listed, address, topic), WAIT_S)
    sent = []
    for acks in ("0", "1", "all"):
        lines = [f"acks {acks}: {i}" for i in range(5)]
        done = ok(
            "produce", topic, "--bootstrap", local.bootstrap, "--partition", "0",
            "--acks", acks, stdin="".join(f"{v}\n" for v in lines),
        )  # fmt: skip
        assert f"produced 5 records to {topic}" in done.stderr
        sent += lines
    big = "x" * 500 + "\n"  # over the topic's max.message.bytes: the leader refuses it
    refused = runnel(
        "produce", topic, "--bootstrap", local.bootstrap, "--acks", "all", stdin=big
    )  # fmt: skip
    assert refused.returncode == 1 and "failed: 1 records" in refused.stderr, refused.stderr
    unheard = runnel("produce", topic, "--bootstrap", local.bootstrap, "--acks", "0", stdin=big)
    # acks=0: no answer, so the producer counts the record delivered (as Kafka's clients do)
    assert unheard.returncode == 0 and f"produced 1 records to {topic}" in unheard.stderr
    assert [r["value"] for r in consume_json(local, topic)] == sent


def test_consume_json_keeps_bytes_nulls_and_repeated_headers_exactly(local: Local) -> None:
    topic = "cli-exact"
    local.create_topic(topic, 1)
    binary = b"\xff\xfe\x00raw"
    headers = [("h", b"1"), ("h", b"2"), ("null", None), ("empty", b""), ("bin", binary)]
    producer = Producer({"bootstrap.servers": local.bootstrap})
    producer.produce(topic, binary, b"k\xc3\xa9", partition=0, headers=headers)
    producer.produce(topic, None, None, partition=0)
    producer.produce(topic, b"", b"", partition=0)
    assert producer.flush(WAIT_S) == 0
    encoded = {"base64": base64.b64encode(binary).decode()}
    got = [(r["key"], r["value"], r["headers"]) for r in consume_json(local, topic)]
    assert got == [
        ("k\u00e9", encoded,
         [["h", "1"], ["h", "2"], ["null", None], ["empty", ""], ["bin", encoded]]),
        (None, None, []),
        ("", "", []),
    ]  # fmt: skip


def test_a_record_the_client_refuses_stops_produce_after_the_earlier_ones_are_delivered(
    local: Local,
) -> None:
    topic = "cli-refused"
    local.create_topic(topic, 1)
    too_big = "x" * 1_100_000  # over the client's message.max.bytes (1,000,000)
    lines = ["a", "b", "c", too_big, "e"]
    done = runnel("produce", topic, "--bootstrap", local.bootstrap,
                  stdin="".join(f"{v}\n" for v in lines))  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"produce to {topic}: 3 delivered; failed at input line 4: " in done.stderr
    assert [r["value"] for r in consume_json(local, topic)] == ["a", "b", "c"]


def test_ctrl_c_while_produce_waits_for_input_reports_every_record_sent_and_exits_130(
    local: Local, tmp_path: Path
) -> None:
    topic = "cli-interrupted"
    local.create_topic(topic, 1)
    sent = [f"r{i}" for i in range(100)]
    stderr = tmp_path / "produce.stderr"
    with stderr.open("w") as errors:
        child = subprocess.Popen(
            [sys.executable, "-m", "runnel", "produce", topic, "--bootstrap", local.bootstrap],
            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errors, text=True,
        )  # fmt: skip
    assert child.stdin is not None
    try:
        child.stdin.write("".join(f"{v}\n" for v in sent))
        child.stdin.flush()  # and left open: the command then waits for more input

        def stored() -> list[str] | None:
            values = [r["value"] for r in consume_json(local, topic)]
            return values if len(values) == len(sent) else None

        assert wait_for("the records to be stored", stored, WAIT_S) == sent
        child.send_signal(signal.SIGINT)
        assert child.wait(WAIT_S) == 130, stderr.read_text()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(WAIT_S)
        child.stdin.close()
    err = stderr.read_text()
    assert f"produced 100 records to {topic}" in err and "interrupted" in err, err
    assert "Traceback" not in err and not re.search(r"^failed: ", err, re.MULTILINE), err


def test_delete_records_moves_each_partition_s_start_and_says_why_not(local: Local) -> None:
    topic = "cli-delete"
    local.create_topic(topic, 2)
    b = ["--bootstrap", local.bootstrap]
    for partition in (0, 1):
        lines = "".join(f"p{partition}-{i}\n" for i in range(10))
        ok("produce", topic, *b, "--partition", str(partition), stdin=lines)
    done = ok("delete-records", topic, *b, "--before", "3", "--partition", "0")
    assert done.stdout == f"{topic}-0: records below 3 deleted\n", done.stdout
    first = consume_json(local, topic, "--from", "earliest", "--partition", "0")
    assert [(r["offset"], r["value"]) for r in first] == [(i, f"p0-{i}") for i in range(3, 10)]
    past = runnel("delete-records", topic, *b, "--before", "11", "--partition", "1")
    assert past.returncode == 1, past.stderr
    assert past.stdout.startswith(f"{topic}-1: not deleted: ") and "ffset" in past.stdout
    # --data-dir, every partition, --json: "end" is each partition's high watermark
    done = ok("delete-records", topic, "--data-dir", str(local.cluster.data_dir), "--before",
              "end", "--json")  # fmt: skip
    outcomes = [json.loads(line) for line in done.stdout.splitlines()]
    assert outcomes == [
        {"topic": topic, "partition": 0, "log_start_offset": 10},
        {"topic": topic, "partition": 1, "log_start_offset": 10},
    ]
    assert consume_json(local, topic, "--from", "earliest") == []
    for args, code, message in [
        (["delete-records", "cli-nope", *b, "--before", "1"], 1, "topic 'cli-nope': "),
        (["delete-records", topic, *b, "--before", "1", "--partition", "7"], 1, "no partition 7"),
        (["delete-records", topic, *b, "--before", "soon"], 2, "--before: not an integer"),
        (["delete-records", topic, *b], 2, "the following arguments are required: --before"),
    ]:
        refused = runnel(*args)
        assert (refused.returncode, refused.stdout) == (code, ""), (args, refused.stderr)
        assert message in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
