"""Running out of file descriptors: a limit, not a failed disk.

The descriptor budget (storage/descriptors.py) refuses new logs before the process runs out,
counting open descriptors only near its ceiling; a log that hits EMFILE anyway (a real one,
under a lowered soft limit) fails the operation without going offline, and the log manager
refuses a log over budget while its directory stays online."""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import FakeClock, make_batch

from storage.config import LogConfig
from storage.descriptors import PER_NEW_LOG, RECOUNT_S, DescriptorBudget, open_descriptors
from storage.errors import OutOfFileDescriptorsError
from storage.loader import load_log
from storage.log_manager import LogManager
from storage.topic_partition import TopicPartition


class Counter:
    def __init__(self, value: int) -> None:
        self.value, self.calls = value, 0

    def __call__(self) -> int:
        self.calls += 1
        return self.value


def test_the_budget_counts_only_near_its_ceiling_and_refuses_at_it() -> None:
    count, now = Counter(100), [0.0]
    budget = DescriptorBudget(1_000, 200, count=count, clock=lambda: now[0])
    budget.take("first")  # the first take counts once
    assert count.calls == 1
    takes = (800 - 100) // PER_NEW_LOG - 2
    for i in range(takes):
        budget.take(f"log {i}")
    assert count.calls == 1, "counted far from the ceiling"
    count.value = 798  # the logs' files really are open now
    with pytest.raises(OutOfFileDescriptorsError, match=r"798 of 1000 .* 200 stay free"):
        for i in range(10):
            budget.take(f"more {i}")
    calls = count.calls
    with pytest.raises(OutOfFileDescriptorsError):
        budget.take("again at once")
    assert count.calls == calls, "a fresh refusal is remembered, not counted again"
    count.value = 500  # logs were deleted
    now[0] += RECOUNT_S
    budget.take("after a while")
    assert count.calls == calls + 1 and budget.refusals == 2


def test_a_limit_raised_on_the_running_process_is_read_at_the_next_count() -> None:
    """Its own limit (not one given) is read again whenever the budget counts, as after
    ``prlimit --nofile`` on a running broker; the reserve follows it."""
    count, now, limit = Counter(300), [0.0], [512]
    budget = DescriptorBudget(count=count, clock=lambda: now[0], soft_limit=lambda: limit[0])
    assert (budget.limit, budget.reserve) == (512, 256)
    with pytest.raises(OutOfFileDescriptorsError, match=r"300 of 512 "):
        budget.take("over the ceiling of 256")
    limit[0] = 20_000
    with pytest.raises(OutOfFileDescriptorsError):
        budget.take("at once: the refusal is remembered for RECOUNT_S")
    now[0] += RECOUNT_S
    budget.take("after the raise")
    assert (budget.limit, budget.reserve) == (20_000, 2_000) and budget.refusals == 2
    given = DescriptorBudget(512, count=count, clock=lambda: now[0], soft_limit=lambda: 10**6)
    with pytest.raises(OutOfFileDescriptorsError):
        given.take("a given limit is kept")
    assert given.limit == 512


def test_nothing_to_count_with_means_no_budget() -> None:
    budget = DescriptorBudget(10, 5, count=lambda: None)
    budget.take("y")
    assert budget.limit is None


def test_the_default_budget_is_the_soft_limit_less_a_tenth() -> None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    budget = DescriptorBudget()
    if soft != resource.RLIM_INFINITY:
        assert budget.limit == soft and budget.reserve == max(256, soft // 10)
    assert open_descriptors() is not None


@contextlib.contextmanager
def soft_limit(value: int) -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (value, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_log_out_of_descriptors_fails_the_roll_and_stays_online(tmp_path: Path) -> None:
    """A real EMFILE: the soft limit lowered to the lowest free descriptor number, so the
    roll's new segment cannot be opened."""
    log = load_log(tmp_path / "t-0", LogConfig(), clock=FakeClock())
    try:
        log.append_as_leader(make_batch([b"a"]), 0)
        lowest_free = os.dup(0)  # the kernel gives the lowest free number: none below it
        os.close(lowest_free)
        with (
            soft_limit(lowest_free),
            pytest.raises(OutOfFileDescriptorsError, match="stays online"),
        ):
            log.roll()
        assert not log.offline
        log.roll()  # descriptors again: it works
        log.append_as_leader(make_batch([b"b"]), 0)
        assert log.log_end_offset == 2
    finally:
        log.abandon()


def test_the_log_manager_refuses_a_log_over_budget_and_stays_online(tmp_path: Path) -> None:
    held = open_descriptors()
    assert held is not None
    budget = DescriptorBudget(held + 2 * PER_NEW_LOG + 10, 10)
    manager = LogManager([tmp_path / "data"], LogConfig(), descriptors=budget)
    manager.startup()
    try:
        made = manager.get_or_create_log(TopicPartition("t", 0))
        with pytest.raises(OutOfFileDescriptorsError, match="ulimit -n"):
            for p in range(1, 20):
                manager.get_or_create_log(TopicPartition("t", p))
        assert not manager.offline_dirs and not made.offline
        assert manager.get_or_create_log(TopicPartition("t", 0)) is made  # held: no budget
        manager.run_maintenance()
        assert not manager.offline_dirs
    finally:
        manager.shutdown()


def test_a_start_out_of_descriptors_names_the_limit_and_takes_no_directory_offline(
    tmp_path: Path,
) -> None:
    """More logs on disk than descriptors: the start fails with the limit to raise, not
    with a directory marked failed (nothing is wrong with the disk)."""
    data = tmp_path / "data"
    made = LogManager([data], LogConfig())
    made.startup()
    for p in range(40):
        made.get_or_create_log(TopicPartition("t", p))
    made.shutdown()
    manager = LogManager([data], LogConfig(), descriptors=DescriptorBudget(limit=None))
    lowest_free = os.dup(0)
    os.close(lowest_free)
    try:
        with (
            soft_limit(lowest_free + 20),
            pytest.raises(OutOfFileDescriptorsError, match=r"loading its logs .*ulimit -n"),
        ):
            manager.startup()
        assert not manager.offline_dirs
    finally:
        for log in manager.logs().values():
            log.abandon()
    again = LogManager([data], LogConfig())
    again.startup()  # with descriptors: every log loads
    try:
        assert len(again.logs()) == 40 and not again.offline_dirs
    finally:
        again.shutdown()
