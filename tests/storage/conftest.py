"""Fixtures for storage tests: a fake clock and logs opened on real files; and
``stored_batches``, a log's batches as stored."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support import FakeClock

from storage.config import LogConfig
from storage.loader import load_log
from storage.log import Log

OpenLog = Callable[..., Log]


def stored_batches(log: Log, start: int = 0, end: int | None = None) -> dict[int, bytes]:
    """Base offset -> the stored bytes of each batch overlapping [start, end), in offset
    order (what a follower fetching them would get)."""
    out: dict[int, bytes] = {}
    for segment, position, header in log.batches(start, end):
        out[header.base_offset] = os.pread(segment.handle.fd, header.size_bytes, position)
    return out


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def open_log(tmp_path: Path, clock: FakeClock) -> Iterator[OpenLog]:
    """Open (or reopen) the log in ``tmp_path/topic-0``; every opened log is closed after."""
    opened: list[Log] = []

    def _open(config: LogConfig | None = None, **kwargs: Any) -> Log:
        log = load_log(tmp_path / "topic-0", config or LogConfig(), clock=clock, **kwargs)
        opened.append(log)
        return log

    yield _open
    for log in opened:
        log.abandon()
