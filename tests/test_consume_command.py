"""``runnel consume``'s stopping rules, over a stand-in for confluent-kafka's Consumer (the
broker is outside what these rules decide; tests/test_cli_produce_consume.py runs the
command against a real cluster): without --follow, a partition not read to its end within
--timeout-s is an error, not a partial listing passed off as the whole; with --follow and no
--timeout-s the command waits until Ctrl-C."""

from __future__ import annotations

from typing import Any, ClassVar

import confluent_kafka
import pytest

from runnel.cli import main

BOOTSTRAP = "127.0.0.1:1"


class _Message:
    def __init__(self, value: bytes) -> None:
        self._value = value

    def error(self) -> None:
        return None

    def value(self) -> bytes:
        return self._value

    def partition(self) -> int:
        return 0


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

    records: ClassVar[list[bytes]] = []
    interrupt_after: ClassVar[int | None] = None

    def __init__(self, config: dict[str, Any]) -> None:
        self.queue = list(self.records)
        self.empty_polls = 0

    def list_topics(self, topic: str, timeout: float) -> _Metadata:
        return _Metadata(topic)

    def assign(self, partitions: list[Any]) -> None:
        pass

    def poll(self, timeout: float) -> _Message | None:
        if self.queue:
            return _Message(self.queue.pop(0))
        self.empty_polls += 1
        if self.interrupt_after is not None and self.empty_polls > self.interrupt_after:
            raise KeyboardInterrupt
        return None

    def close(self) -> None:
        pass


@pytest.fixture
def consumer(monkeypatch: pytest.MonkeyPatch) -> type[StandInConsumer]:
    monkeypatch.setattr(confluent_kafka, "Consumer", StandInConsumer)
    monkeypatch.setattr(StandInConsumer, "records", [b"a", b"b"])
    monkeypatch.setattr(StandInConsumer, "interrupt_after", None)
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
