"""``runnel consume``'s stopping rules, over a stand-in for confluent-kafka's Consumer (the
broker is outside what these rules decide; tests/test_cli_produce_consume.py runs the
command against a real cluster): without --follow, a partition not read to its end within
--timeout-s is an error, not a partial listing passed off as the whole; with --follow and no
--timeout-s the command waits until Ctrl-C. Also what it makes of a cluster it cannot reach,
of Ctrl-C without --follow, of a partition named twice, of a client whose close hangs
(runnel/kafka_close.py), and how --json writes bytes."""

from __future__ import annotations

import base64
import json
import threading
from typing import Any, ClassVar

import confluent_kafka
import pytest
from confluent_kafka import KafkaError, KafkaException

from runnel.cli import main

BOOTSTRAP = "127.0.0.1:1"
GATE_MAX_S = 30.0  # a hung close's stand-in gives up after this, whatever happens


class _Message:
    def __init__(
        self,
        value: bytes | None,
        key: bytes | None = None,
        headers: list[tuple[str, bytes | None]] | None = None,
    ) -> None:
        self._value, self._key, self._headers = value, key, headers

    def error(self) -> None:
        return None

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return self._key

    def headers(self) -> list[tuple[str, bytes | None]] | None:
        return self._headers

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 7

    def timestamp(self) -> tuple[int, int]:
        return 1, 1_700_000_000_000


class _Topic:
    def __init__(self) -> None:
        self.error = None
        self.partitions = {0: None}


class _Metadata:
    def __init__(self, topic: str) -> None:
        self.topics = {topic: _Topic()}


class StandInConsumer:
    """One partition that hands out ``records`` and then nothing: its end is never reached
    (no EOF), as when its leader does not answer. ``interrupt_after`` empty polls raise
    KeyboardInterrupt (Ctrl-C)."""

    records: ClassVar[list[bytes | _Message]] = []
    interrupt_after: ClassVar[int | None] = None
    close_gate: ClassVar[threading.Event | None] = None  # a close that hangs until set
    closes_done: ClassVar[list[bool]] = []
    unreachable: ClassVar[set[str]] = set()  # the calls that fail as with no broker
    assigned: ClassVar[list[list[int]]] = []

    def __init__(self, config: dict[str, Any]) -> None:
        self.queue = list(self.records)
        self.empty_polls = 0

    def _reach(self, call: str) -> None:
        if call in self.unreachable:
            error = KafkaError(KafkaError._TRANSPORT, "Failed to get metadata: transport failure")
            raise KafkaException(error)

    def list_topics(self, topic: str, timeout: float) -> _Metadata:
        self._reach("list_topics")
        return _Metadata(topic)

    def offsets_for_times(self, partitions: list[Any], timeout: float) -> list[Any]:
        self._reach("offsets_for_times")
        return partitions

    def assign(self, partitions: list[Any]) -> None:
        self.assigned.append([tp.partition for tp in partitions])

    def poll(self, timeout: float) -> _Message | None:
        if self.queue:
            record = self.queue.pop(0)
            return record if isinstance(record, _Message) else _Message(record)
        self.empty_polls += 1
        if self.interrupt_after is not None and self.empty_polls > self.interrupt_after:
            raise KeyboardInterrupt
        return None

    def close(self) -> None:
        if self.close_gate is not None:
            self.close_gate.wait(GATE_MAX_S)
        self.closes_done.append(True)


@pytest.fixture
def consumer(monkeypatch: pytest.MonkeyPatch) -> type[StandInConsumer]:
    monkeypatch.setattr(confluent_kafka, "Consumer", StandInConsumer)
    monkeypatch.setattr(StandInConsumer, "records", [b"a", b"b"])
    monkeypatch.setattr(StandInConsumer, "interrupt_after", None)
    monkeypatch.setattr(StandInConsumer, "close_gate", None)
    monkeypatch.setattr(StandInConsumer, "closes_done", [])
    monkeypatch.setattr(StandInConsumer, "unreachable", set())
    monkeypatch.setattr(StandInConsumer, "assigned", [])
    monkeypatch.setattr("runnel.consume_command.POLL_S", 0.0)
    return StandInConsumer


def test_a_partition_not_read_to_its_end_in_time_is_an_error(
    consumer: type[StandInConsumer], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["consume", "events", "--bootstrap", BOOTSTRAP, "--timeout-s", "1"])
    out, err = capsys.readouterr()
    assert code == 1
    assert out.splitlines() == ["a", "b"]
    assert "partition(s) 0 not read to their end; 2 records printed" in err


def test_follow_without_a_timeout_waits_until_ctrl_c(
    consumer: type[StandInConsumer],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(consumer, "interrupt_after", 5_000)  # then Ctrl-C
    code = main(["consume", "events", "--bootstrap", BOOTSTRAP, "--follow"])
    out, err = capsys.readouterr()
    assert code == 0
    assert out.splitlines() == ["a", "b"]
    assert "consumed 2 records from events" in err


def test_follow_with_a_timeout_stops_quietly_after_it(
    consumer: type[StandInConsumer], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["consume", "events", "--bootstrap", BOOTSTRAP, "--follow", "--timeout-s", "1"])
    out, err = capsys.readouterr()
    assert code == 0
    assert out.splitlines() == ["a", "b"]
    assert "consumed 2 records from events" in err


@pytest.mark.parametrize(
    ("call", "args"), [("list_topics", []), ("offsets_for_times", ["--from", "@1700000000000"])]
)
def test_a_cluster_it_cannot_reach_is_one_line_not_a_traceback(
    consumer: type[StandInConsumer],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    call: str,
    args: list[str],
) -> None:
    monkeypatch.setattr(consumer, "unreachable", {call})
    code = main(["consume", "events", "--bootstrap", BOOTSTRAP, *args])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        f"runnel: error: cannot reach the cluster at {BOOTSTRAP}: "
        "Failed to get metadata: transport failure"
    ]


def test_ctrl_c_without_follow_exits_130_after_what_it_printed(
    consumer: type[StandInConsumer],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(consumer, "interrupt_after", 3)
    try:
        code = main(["consume", "events", "--bootstrap", BOOTSTRAP])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped main()")
    out, err = capsys.readouterr()
    assert code == 130
    assert out.splitlines() == ["a", "b"]
    assert "consumed 2 records from events" in err and "Traceback" not in err


def test_a_partition_named_twice_is_read_once(
    consumer: type[StandInConsumer], capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["consume", "events", "--bootstrap", BOOTSTRAP, "--partition", "0", "--partition", "0",
         "--max-messages", "2"]
    )  # fmt: skip
    assert code == 0 and consumer.assigned == [[0]]
    assert capsys.readouterr().out.splitlines() == ["a", "b"]


def test_json_is_exact_for_bytes_nulls_and_repeated_headers(
    consumer: type[StandInConsumer],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    binary = b"\xff\xfe\x00ok"
    headers = [("h", b"1"), ("h", b"2"), ("null", None), ("empty", b""), ("bin", binary)]
    records = [_Message(binary, b"k\xc3\xa9", headers), _Message(None, None, None)]
    monkeypatch.setattr(consumer, "records", records)
    code = main(["consume", "events", "--bootstrap", BOOTSTRAP, "--json", "--max-messages", "2"])
    assert code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    encoded = {"base64": base64.b64encode(binary).decode()}
    assert lines[0] == {
        "partition": 0,
        "offset": 7,
        "timestamp": 1_700_000_000_000,
        "key": "k\u00e9",
        "value": encoded,
        "headers": [["h", "1"], ["h", "2"], ["null", None], ["empty", ""], ["bin", encoded]],
    }
    assert (lines[1]["key"], lines[1]["value"], lines[1]["headers"]) == (None, None, [])


def test_a_client_whose_close_hangs_is_left_behind_with_a_warning(
    consumer: type[StandInConsumer],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gate = threading.Event()
    monkeypatch.setattr(consumer, "close_gate", gate)
    monkeypatch.setattr("runnel.consume_command.CLOSE_TIMEOUT_S", 0.2)
    try:
        code = main(["consume", "events", "--bootstrap", BOOTSTRAP, "--max-messages", "2"])
        assert consumer.closes_done == [], "the command waited for the close to end"
    finally:
        gate.set()
    out, err = capsys.readouterr()
    assert code == 0 and out.splitlines() == ["a", "b"]
    assert "warning: the Kafka client did not close within 0.2 s" in err
    assert "consumed 2 records from events" in err
