"""The fetch purgatory: a parked fetch wakes on enough bytes, on its timeout, on a leadership
change, on shutdown; it is bounded; and a real partition's appends drive it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from support import FakeClock, make_batch

from broker.purgatory import FetchPurgatory, WakeReason
from controller.image import PartitionState
from replication.partition import Partition
from storage.config import LogConfig
from storage.loader import load_log

A = ("orders", 0)
B = ("orders", 1)
LONG_MS = 60_000  # a timeout no test reaches
T = TypeVar("T")


def run(body: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(body(), 10)

    return asyncio.run(bounded())


async def parked(
    purgatory: FetchPurgatory, keys: list[tuple[str, int]], min_bytes: int, timeout_ms: int
) -> asyncio.Task[WakeReason]:
    """A fetch parked in the purgatory."""
    task = asyncio.ensure_future(purgatory.park(keys, min_bytes, timeout_ms))
    await asyncio.sleep(0)
    assert not task.done()
    return task


def test_a_waiter_wakes_once_min_bytes_arrived_on_its_partitions() -> None:
    async def body() -> None:
        purgatory = FetchPurgatory()
        task = await parked(purgatory, [A, B], 100, LONG_MS)
        purgatory.notify(A, 60)
        purgatory.notify(("other", 0), 500)  # another partition: not this fetch's bytes
        await asyncio.sleep(0)
        assert not task.done()
        purgatory.notify(B, 40)
        assert await task is WakeReason.BYTES
        await asyncio.sleep(0)  # a done waiter leaves at the loop's next turn
        assert purgatory.waiting == 0

    run(body)


def test_only_bytes_appended_after_the_wait_began_count() -> None:
    async def body() -> None:
        purgatory = FetchPurgatory()
        purgatory.notify(A, 1000)  # nobody waits: forgotten
        task = await parked(purgatory, [A], 10, LONG_MS)
        await asyncio.sleep(0)
        assert not task.done()
        purgatory.notify(A, 10)
        assert await task is WakeReason.BYTES

    run(body)


def test_each_waiter_counts_towards_its_own_min_bytes() -> None:
    async def body() -> None:
        purgatory = FetchPurgatory()
        small = await parked(purgatory, [A], 10, LONG_MS)
        large = await parked(purgatory, [A], 1000, LONG_MS)
        purgatory.notify(A, 50)
        assert await small is WakeReason.BYTES
        assert not large.done()
        purgatory.notify(A, 950)
        assert await large is WakeReason.BYTES

    run(body)


def test_a_waiter_times_out() -> None:
    async def body() -> None:
        purgatory = FetchPurgatory()
        assert await purgatory.park([A], 100, 5) is WakeReason.TIMEOUT
        assert purgatory.waiting == 0

    run(body)


def test_nothing_to_wait_for_answers_at_once() -> None:
    async def body() -> None:
        purgatory = FetchPurgatory()
        assert await purgatory.park([A], 0, LONG_MS) is WakeReason.BYTES
        assert await purgatory.park([A], 100, 0) is WakeReason.TIMEOUT
        assert purgatory.waiting == 0

    run(body)


def test_no_keys_waits_for_the_timeout() -> None:
    async def body() -> None:
        purgatory = FetchPurgatory()
        assert await purgatory.park([], 1, 5) is WakeReason.TIMEOUT

    run(body)


def test_a_leadership_change_wakes_the_waiters_of_that_partition() -> None:
    async def body() -> None:
        purgatory = FetchPurgatory()
        on_a = await parked(purgatory, [A, B], 100, LONG_MS)
        on_b = await parked(purgatory, [B], 100, LONG_MS)
        purgatory.wake(A)
        assert await on_a is WakeReason.LEADERSHIP
        assert not on_b.done()
        on_b.cancel()

    run(body)


def test_a_poke_feeds_a_parked_fetch_for_partitions_it_does_not_wait_on_by_key() -> None:
    """A follower session's watched partitions reach its parked fetch through ``poke``:
    bytes count as ``notify``'s do, -1 wakes as ``wake`` does, and the poke is withdrawn
    once the fetch is no longer parked."""

    async def body() -> None:
        purgatory = FetchPurgatory()
        feeds: list[Callable[[tuple[str, int], int], None] | None] = []
        task = purgatory.park([A], 100, LONG_MS, poke=feeds.append)
        await asyncio.sleep(0)
        (feed,) = feeds
        assert feed is not None
        feed(B, 0)  # a change without bytes: nothing to count
        feed(B, 60)
        await asyncio.sleep(0)
        assert not task.done()
        feed(B, 40)
        assert await task is WakeReason.BYTES
        await asyncio.sleep(0)
        assert feeds[-1] is None
        task = purgatory.park([A], 100, LONG_MS, poke=feeds.append)
        await asyncio.sleep(0)
        feed = feeds[-1]
        assert feed is not None
        feed(B, -1)
        assert await task is WakeReason.LEADERSHIP
        await asyncio.sleep(0)
        assert feeds[-1] is None
        assert purgatory.waiting == 0

    run(body)


def test_cancel_all_wakes_everyone_and_answers_later_waits_at_once() -> None:
    async def body() -> None:
        purgatory = FetchPurgatory()
        tasks = [await parked(purgatory, [A], 100, LONG_MS) for _ in range(3)]
        purgatory.cancel_all()
        assert await asyncio.gather(*tasks) == [WakeReason.CANCELLED] * 3
        assert await purgatory.park([A], 100, LONG_MS) is WakeReason.CANCELLED
        assert purgatory.waiting == 0

    run(body)


def test_beyond_max_waiters_a_fetch_is_answered_at_once_and_counted() -> None:
    async def body() -> None:
        purgatory = FetchPurgatory(max_waiters=2)
        first = await parked(purgatory, [A], 100, LONG_MS)
        second = await parked(purgatory, [A], 100, LONG_MS)
        assert await purgatory.park([A], 100, LONG_MS) is WakeReason.OVERFLOW
        assert (purgatory.waiting, purgatory.overflows) == (2, 1)
        purgatory.notify(A, 100)
        assert await asyncio.gather(first, second) == [WakeReason.BYTES] * 2
        third = await parked(purgatory, [A], 100, LONG_MS)  # room again
        third.cancel()

    run(body)


def test_a_cancelled_fetch_leaves_nothing_behind() -> None:
    async def body() -> None:
        purgatory = FetchPurgatory()
        task = await parked(purgatory, [A, B], 100, LONG_MS)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0)
        assert purgatory.waiting == 0
        assert not purgatory._by_key  # every key's entry went with its last waiter

    run(body)


def test_a_partition_append_wakes_a_parked_fetch(tmp_path: Path) -> None:
    log = load_log(tmp_path / "orders-0", LogConfig(), clock=FakeClock())
    partition = Partition("orders", bytes(16), 0, log, local_broker_id=1)
    partition.make_leader(PartitionState(bytes(16), 0, (1,), (1,), 1, 0, 0), now_ms=0)

    async def body() -> None:
        purgatory = FetchPurgatory()
        partition.on_append.append(purgatory.notify)
        task = await parked(purgatory, [A], 1, LONG_MS)
        partition.append_as_leader(make_batch([b"hello"]), 1)
        assert await task is WakeReason.BYTES

    try:
        run(body)
    finally:
        log.abandon()


def test_park_registers_at_once_so_an_append_before_the_await_wakes_it() -> None:
    """The fetch handler parks before it returns its coroutine: an append between the two
    (another request handled first) must count. Parked only when a coroutine runs, it does
    not."""

    async def body() -> None:
        purgatory = FetchPurgatory()

        async def park_when_run() -> WakeReason:  # what the fetch handler did before
            return await purgatory.park([A], 1, 300)

        parked_now = purgatory.park([A], 1, LONG_MS)
        late = asyncio.ensure_future(park_when_run())
        purgatory.notify(A, 10)  # before either is awaited
        assert await parked_now is WakeReason.BYTES
        assert await late is WakeReason.TIMEOUT  # registered after the append: missed it
        assert purgatory.waiting == 0

    run(body)


def test_a_cancelled_or_timed_out_park_unregisters_itself() -> None:
    async def body() -> None:
        purgatory = FetchPurgatory()
        pokes: list[object] = []
        cancelled = purgatory.park([A], 1, LONG_MS, poke=pokes.append, owner=2)
        timed_out = purgatory.park([B], 1, 10, owner=2)
        assert purgatory.waiting == 2
        cancelled.cancel()
        assert await timed_out is WakeReason.TIMEOUT
        await asyncio.sleep(0)
        assert purgatory.waiting == 0
        assert pokes[-1] is None  # the poke hears that the wait is over
        assert not purgatory._by_key and not purgatory._by_owner

    run(body)


def test_wake_owner_wakes_only_that_broker_s_parked_fetches() -> None:
    async def body() -> None:
        purgatory = FetchPurgatory()
        two = [purgatory.park([A], 1, LONG_MS, owner=2), purgatory.park([B], 1, LONG_MS, owner=2)]
        three = purgatory.park([A], 1, LONG_MS, owner=3)
        consumer = purgatory.park([A], 1, LONG_MS)
        purgatory.wake_owner(2)
        purgatory.wake_owner(9)  # parks nothing
        assert [await f for f in two] == [WakeReason.LEADERSHIP] * 2
        await asyncio.sleep(0)
        assert not three.done() and not consumer.done()
        purgatory.cancel_all()
        assert await three is WakeReason.CANCELLED

    run(body)
