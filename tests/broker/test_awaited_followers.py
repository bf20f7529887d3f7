"""A new leader's awaited followers (broker/awaited_followers.py): a follower is awaited for a
partition until its fetch holds it, the wait expires, or the leader stops leading it; a
fetch costs what it drops (oldest first), and a follower awaited for nothing is forgotten."""

from __future__ import annotations

from broker.awaited_followers import AWAIT_MS, AwaitedFollowers

P, Q = ("t", 0), ("t", 1)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


def test_a_follower_is_awaited_until_its_fetch_holds_the_partition() -> None:
    awaited = AwaitedFollowers(Clock())
    awaited.expect(P, [2, 3])
    awaited.expect(Q, [2])
    assert awaited.short_poll(2, lambda key: False)
    assert awaited.short_poll(2, lambda key: key == P)  # Q still awaited
    assert len(awaited) == 2  # (2, Q) and (3, P)
    assert not awaited.short_poll(2, lambda key: key == Q)
    assert awaited.short_poll(3, lambda key: key == Q)
    assert not awaited.short_poll(4, lambda key: False)  # never awaited
    assert len(awaited) == 1


def test_the_wait_expires_and_forget_ends_it() -> None:
    clock = Clock()
    awaited = AwaitedFollowers(clock)
    awaited.expect(P, [2])
    clock.now += AWAIT_MS - 1
    assert awaited.short_poll(2, lambda key: False)
    clock.now += 1
    assert not awaited.short_poll(2, lambda key: False)
    awaited.expect(P, [2, 3])
    awaited.expect(Q, [3])
    awaited.forget(P)  # no longer led here
    assert not awaited.short_poll(2, lambda key: False)
    assert awaited.short_poll(3, lambda key: key == P)  # Q is still awaited
    assert len(awaited) == 1


def test_a_renewed_wait_moves_last_and_a_fetch_stops_at_the_first_still_awaited() -> None:
    clock = Clock()
    awaited = AwaitedFollowers(clock)
    awaited.expect(P, [2])
    clock.now += 1_000
    awaited.expect(Q, [2])
    awaited.expect(P, [2])  # renewed: now the newest, expiring later
    looked: list[tuple[str, int]] = []

    def holds(key: tuple[str, int]) -> bool:
        looked.append(key)
        return False

    assert awaited.short_poll(2, holds)
    assert looked == [Q], "the fetch looked past the first partition still awaited"
    clock.now += AWAIT_MS  # both expire: Q, then P renewed at the same time
    assert not awaited.short_poll(2, holds)
