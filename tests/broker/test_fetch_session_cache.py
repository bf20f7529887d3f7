"""The leader's fetch session cache (broker/fetch_session.py) as pure logic: epochs and
session errors, what an incremental request adds, updates and forgets, which answers an
incremental response carries, and the bounds (slots, partitions, expiry, eviction)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from typing import Any

import pytest
from support import assert_imports_none_of

from broker.fetch_session import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    MAX_EPOCH,
    NO_SESSION,
    FetchContext,
    FetchPosition,
    FetchSessionCache,
    FullFetch,
    IncrementalFetch,
    News,
    PartitionKey,
    SessionError,
    Sessionless,
    SessionLimits,
    SessionRequest,
    next_epoch,
)
from broker.protocol import ErrorCode
from storage.errors import InvariantViolation

FOLLOWER, CONSUMER = 2, -1
A, B, C = ("t", 0), ("t", 1), ("u", 0)
QUIET = News(0, 10, 10, 0)  # caught up at 10, nothing new


def at(offset: int) -> FetchPosition:
    return FetchPosition(offset, 0, 0, 0, 1 << 20)


def make_cache(**limits: int) -> FetchSessionCache:
    ids: Iterator[int] = itertools.count(101)
    return FetchSessionCache(SessionLimits(**limits), lambda: next(ids))


def request(
    session_id: int,
    epoch: int,
    named: dict[PartitionKey, FetchPosition] | None = None,
    forgotten: tuple[PartitionKey, ...] = (),
    replica_id: int = FOLLOWER,
) -> SessionRequest:
    return SessionRequest(session_id, epoch, replica_id, dict(named or {}), forgotten)


def answered(context: FetchContext, news: list[News] | None = None, now_ms: int = 0) -> Any:
    """``finish`` with ``news`` (QUIET for every partition by default)."""
    return context.finish(news if news is not None else [QUIET] * len(context.partitions), now_ms)


def open_session(
    cache: FetchSessionCache,
    named: dict[PartitionKey, FetchPosition],
    replica_id: int = FOLLOWER,
    now_ms: int = 0,
) -> int:
    context = cache.begin(request(NO_SESSION, INITIAL_EPOCH, named, replica_id=replica_id), now_ms)
    assert isinstance(context, FullFetch)
    session_id = answered(context, now_ms=now_ms).session_id
    assert session_id != NO_SESSION
    return int(session_id)


def keys(context: FetchContext) -> list[PartitionKey]:
    return [key for key, _ in context.partitions]


# -- kinds of fetch and epochs -------------------------------------------------------------------


def test_a_sessionless_fetch_is_answered_in_full_and_caches_nothing() -> None:
    cache = make_cache()
    context = cache.begin(request(NO_SESSION, FINAL_EPOCH, {A: at(0), B: at(5)}), 0)
    assert isinstance(context, Sessionless) and keys(context) == [A, B]
    assert answered(context) == (ErrorCode.NONE, NO_SESSION, (True, True))
    assert cache.size == 0


def test_a_full_fetch_opens_a_session_whose_next_epoch_is_one() -> None:
    cache = make_cache()
    context = cache.begin(request(NO_SESSION, INITIAL_EPOCH, {A: at(0), B: at(5)}), 0)
    assert isinstance(context, FullFetch) and cache.size == 0  # opened when answered
    assert answered(context) == (ErrorCode.NONE, 101, (True, True))
    assert (cache.size, cache.partitions, cache.epoch_of(101)) == (1, 2, 1)


def test_an_incremental_fetch_fetches_every_partition_named_or_not() -> None:
    cache = make_cache()
    session = open_session(cache, {A: at(0), B: at(5)})
    context = cache.begin(request(session, 1, {B: at(7), C: at(1)}), 10)
    assert isinstance(context, IncrementalFetch)
    assert context.partitions == [(A, at(0)), (B, at(7)), (C, at(1))]  # updated, added
    assert cache.epoch_of(session) == 2
    assert cache.partitions == 3


def test_a_wrong_epoch_is_refused_and_changes_nothing() -> None:
    cache = make_cache()
    session = open_session(cache, {A: at(0)})
    for wrong in (2, 5, -7):
        refused = cache.begin(request(session, wrong, {B: at(1)}), 0)
        assert isinstance(refused, SessionError) and refused.partitions == []
        assert answered(refused) == (ErrorCode.INVALID_FETCH_SESSION_EPOCH, NO_SESSION, ())
    assert cache.epoch_of(session) == 1
    assert keys(cache.begin(request(session, 1), 0)) == [A]  # B was never added


def test_an_unknown_session_or_another_replica_s_session_is_not_found() -> None:
    cache = make_cache()
    session = open_session(cache, {A: at(0)})
    for bad in (
        request(session + 1, 1),
        request(NO_SESSION, 3),  # id 0 is no session: Kafka's rule, not an epoch error
        request(session, 1, replica_id=3),
        request(session, 1, replica_id=CONSUMER),
    ):
        context = cache.begin(bad, 0)
        assert answered(context) == (ErrorCode.FETCH_SESSION_ID_NOT_FOUND, NO_SESSION, ())
    assert cache.epoch_of(session) == 1


def test_epochs_run_up_and_wrap_to_one() -> None:
    assert [next_epoch(e) for e in (INITIAL_EPOCH, 1, MAX_EPOCH - 1, MAX_EPOCH)] == [
        1,
        2,
        MAX_EPOCH,
        1,
    ]
    assert next_epoch(FINAL_EPOCH) == FINAL_EPOCH
    cache = make_cache()
    session = open_session(cache, {A: at(0)})
    for epoch in range(1, 6):
        assert isinstance(cache.begin(request(session, epoch), 0), IncrementalFetch)
    assert cache.epoch_of(session) == 6


def test_a_full_fetch_naming_its_session_closes_it() -> None:
    cache = make_cache()
    first = open_session(cache, {A: at(0)})
    reopening = cache.begin(request(first, INITIAL_EPOCH, {B: at(0)}), 0)
    assert cache.epoch_of(first) is None and cache.size == 0
    second = answered(reopening).session_id
    assert second not in (NO_SESSION, first) and cache.size == 1
    closing = cache.begin(request(second, FINAL_EPOCH, {B: at(0)}), 0)
    assert isinstance(closing, Sessionless) and cache.size == 0
    assert answered(closing).session_id == NO_SESSION


def test_a_full_fetch_cannot_close_another_replica_s_session() -> None:
    cache = make_cache()
    session = open_session(cache, {A: at(0)}, replica_id=FOLLOWER)
    cache.begin(request(session, FINAL_EPOCH, {A: at(0)}, replica_id=CONSUMER), 0)
    assert cache.epoch_of(session) == 1


# -- add, update, forget -------------------------------------------------------------------------


def test_forgotten_partitions_leave_the_session() -> None:
    cache = make_cache()
    session = open_session(cache, {A: at(0), B: at(0), C: at(0)})
    context = cache.begin(request(session, 1, forgotten=(B, ("ghost", 9))), 0)
    assert keys(context) == [A, C] and cache.partitions == 2
    # Named and forgotten in one request: added, then forgotten (Kafka's order).
    context = cache.begin(request(session, 2, {B: at(3)}, forgotten=(B,)), 0)
    assert keys(context) == [A, C]


def test_a_session_left_empty_closes_and_is_served_sessionless() -> None:
    cache = make_cache()
    session = open_session(cache, {A: at(0)})
    context = cache.begin(request(session, 1, {B: at(4)}, forgotten=(A, B)), 0)
    assert isinstance(context, Sessionless) and context.partitions == [(B, at(4))]
    assert answered(context).session_id == NO_SESSION
    assert cache.size == 0 and cache.partitions == 0


def test_a_full_fetch_of_no_partition_opens_no_session() -> None:
    cache = make_cache()
    context = cache.begin(request(NO_SESSION, INITIAL_EPOCH, {}), 0)
    assert answered(context).session_id == NO_SESSION and cache.size == 0


# -- what an incremental answer carries ---------------------------------------------------------


def test_an_incremental_answer_carries_only_partitions_with_news() -> None:
    cache = make_cache()
    session = open_session(cache, {A: at(10), B: at(10), C: at(10)})
    context = cache.begin(request(session, 1), 0)
    assert answered(context).include == (False, False, False)
    cases = [
        (News(100, 10, 10, 0), True),  # records
        (News(0, 11, 11, 0), True),  # the high watermark moved
        (News(0, 11, 11, 0), False),  # ... and was heard
        (News(0, 11, 11, 3), True),  # the log start moved
        (News(0, 11, 12, 3), True),  # the last stable offset moved
        (News(0, 11, 12, 3, diverging=True), True),
        (News(0, 11, 12, 3), True),  # a diverging answer's HW is not heard (below)
        (News(0, 11, 12, 3), False),
    ]
    epoch = 2
    for news, expected in cases:
        context = cache.begin(request(session, epoch), 0)
        (key_a,) = [i for i, k in enumerate(keys(context)) if k == A]
        said = [QUIET if k != A else news for k in keys(context)]
        include = answered(context, said).include
        assert include[key_a] is expected, news
        epoch += 1


def test_an_error_is_always_answered_and_its_partition_again_once_it_clears() -> None:
    cache = make_cache()
    session = open_session(cache, {A: at(10)})
    failing = News(0, -1, -1, -1, ErrorCode.NOT_LEADER_OR_FOLLOWER)
    for epoch in (1, 2):
        assert answered(cache.begin(request(session, epoch), 0), [failing]).include == (True,)
    # The error clears with the very offsets heard before it: still news.
    assert answered(cache.begin(request(session, 3), 0), [QUIET]).include == (True,)
    assert answered(cache.begin(request(session, 4), 0), [QUIET]).include == (False,)


def test_after_a_diverging_epoch_the_high_watermark_is_said_again() -> None:
    """A follower truncating on a diverging epoch does not take that answer's HW, so the
    session must not count it as heard: an idle partition would otherwise never tell the
    follower its HW (found by the replication simulation with fetch sessions)."""
    cache = make_cache()
    session = open_session(cache, {A: at(12)})
    diverging = News(0, 10, 10, 0, diverging=True)
    assert answered(cache.begin(request(session, 1), 0), [diverging]).include == (True,)
    # The follower truncated to 10 and names its new position; nothing else changed.
    truncated = cache.begin(request(session, 2, {A: at(10)}), 0)
    assert answered(truncated, [QUIET]).include == (True,)  # HW 10, said again
    assert answered(cache.begin(request(session, 3), 0), [QUIET]).include == (False,)


def test_a_partition_followed_anew_hears_its_offsets_again() -> None:
    """The follower drops an answer for a partition it follows anew meanwhile (another
    leader epoch), HW included; the session must not count that HW as heard, or an idle
    partition would leave the follower's HW stale until the HW moves again."""
    cache = make_cache()
    session = open_session(cache, {A: at(10)})  # heard HW 10 at leader epoch 0
    moved = News(0, 12, 12, 0)
    assert answered(cache.begin(request(session, 1), 0), [moved]).include == (True,)
    # The follower dropped that answer (followed anew at epoch 1) and names the partition.
    again = FetchPosition(10, 0, 1, 0, 1 << 20)
    named = cache.begin(request(session, 2, {A: again}), 0)
    assert answered(named, [moved]).include == (True,)  # HW 12 said again
    assert answered(cache.begin(request(session, 3), 0), [moved]).include == (False,)


def test_answered_partitions_move_to_the_end_of_the_session() -> None:
    cache = make_cache()
    session = open_session(cache, {A: at(10), B: at(10), C: at(10)})
    context = cache.begin(request(session, 1), 0)
    answered(context, [News(50, 10, 10, 0), QUIET, QUIET])
    assert keys(cache.begin(request(session, 2), 0)) == [B, C, A]


def test_an_answer_overtaken_by_the_session_s_next_request_is_refused() -> None:
    cache = make_cache()
    session = open_session(cache, {A: at(10)})
    parked = cache.begin(request(session, 1), 0)
    later = cache.begin(request(session, 2), 0)
    assert answered(parked, [News(0, 11, 11, 0)]) == (
        ErrorCode.INVALID_FETCH_SESSION_EPOCH,
        session,
        (),
    )
    assert answered(later, [News(0, 11, 11, 0)]).include == (True,)  # still news to it


def test_a_full_answer_s_offsets_are_what_the_session_has_heard() -> None:
    cache = make_cache()
    context = cache.begin(request(NO_SESSION, INITIAL_EPOCH, {A: at(10), B: at(10)}), 0)
    session = answered(context, [News(0, 12, 12, 0), QUIET]).session_id
    again = cache.begin(request(session, 1), 0)
    assert answered(again, [News(0, 12, 12, 0), News(0, 13, 13, 0)]).include == (False, True)


# -- bounds --------------------------------------------------------------------------------------


def test_an_unused_session_expires() -> None:
    cache = make_cache(expiry_ms=1000)
    session = open_session(cache, {A: at(0)}, now_ms=0)
    assert isinstance(cache.begin(request(session, 1), 1000), IncrementalFetch)  # used at 1000
    assert isinstance(cache.begin(request(session, 2), 2000), IncrementalFetch)
    context = cache.begin(request(session, 3), 3001)
    assert answered(context).error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    assert (cache.size, cache.partitions, cache.expirations) == (0, 0, 1)


def test_when_the_slots_are_full_a_consumer_opens_no_session() -> None:
    cache = make_cache(max_sessions=2)
    first = open_session(cache, {A: at(0)}, replica_id=CONSUMER)
    open_session(cache, {A: at(0)}, replica_id=CONSUMER)
    context = cache.begin(request(NO_SESSION, INITIAL_EPOCH, {A: at(0)}, replica_id=CONSUMER), 0)
    assert answered(context) == (ErrorCode.NONE, NO_SESSION, (True,))  # served, in full
    assert cache.size == 2 and cache.epoch_of(first) == 1 and cache.evictions == 0


def test_a_follower_evicts_the_least_recently_used_consumer_sessions() -> None:
    cache = make_cache(max_sessions=3)
    old = open_session(cache, {A: at(0)}, replica_id=CONSUMER, now_ms=0)
    recent = open_session(cache, {A: at(0)}, replica_id=CONSUMER, now_ms=1)
    cache.begin(request(old, 1, replica_id=CONSUMER), 2)  # old is now the recent one
    follower = open_session(cache, {A: at(0)}, replica_id=FOLLOWER, now_ms=3)
    assert cache.size == 3 and cache.evictions == 0
    open_session(cache, {B: at(0)}, replica_id=3, now_ms=4)
    assert cache.epoch_of(recent) is None and cache.epoch_of(old) == 2
    assert cache.epoch_of(follower) == 1 and cache.evictions == 1


def test_a_follower_never_evicts_a_follower() -> None:
    cache = make_cache(max_sessions=2)
    open_session(cache, {A: at(0)}, replica_id=2)
    open_session(cache, {A: at(0)}, replica_id=3)
    context = cache.begin(request(NO_SESSION, INITIAL_EPOCH, {A: at(0)}, replica_id=4), 0)
    assert answered(context).session_id == NO_SESSION and cache.size == 2


def test_the_partition_bound_declines_big_sessions_and_closes_growing_ones() -> None:
    cache = make_cache(max_partitions=3)
    too_big = {("t", i): at(0) for i in range(4)}
    context = cache.begin(request(NO_SESSION, INITIAL_EPOCH, too_big), 0)
    assert answered(context).session_id == NO_SESSION and cache.partitions == 0
    session = open_session(cache, {A: at(0), B: at(0)})
    consumer = open_session(cache, {C: at(0)}, replica_id=CONSUMER)
    assert cache.partitions == 3
    # The follower's session may not grow past the bound: it closes, the client starts over.
    context = cache.begin(request(session, 1, {("v", 0): at(0)}), 0)
    assert answered(context).error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    assert cache.epoch_of(session) is None and cache.partitions == 1
    # A follower's new session evicts the consumer's to fit.
    open_session(cache, {A: at(0), B: at(0), ("v", 0): at(0)})
    assert cache.epoch_of(consumer) is None and cache.partitions == 3


def test_no_slots_means_no_sessions() -> None:
    cache = make_cache(max_sessions=0)
    context = cache.begin(request(NO_SESSION, INITIAL_EPOCH, {A: at(0)}), 0)
    assert answered(context).session_id == NO_SESSION


def test_session_ids_are_positive_unique_and_a_broken_generator_is_a_bug() -> None:
    draws = iter([0, -5, 2**31, 7, 7, 7, 8])
    cache = FetchSessionCache(SessionLimits(), lambda: next(draws))
    assert open_session(cache, {A: at(0)}) == 7
    assert open_session(cache, {A: at(0)}) == 8
    stuck = FetchSessionCache(SessionLimits(), lambda: 9)
    open_session(stuck, {A: at(0)})
    with pytest.raises(InvariantViolation):
        answered(stuck.begin(request(NO_SESSION, INITIAL_EPOCH, {A: at(0)}), 0))


def test_limits_are_checked() -> None:
    for bad in ({"max_sessions": -1}, {"max_partitions": -1}, {"expiry_ms": 0}):
        with pytest.raises(ValueError):
            SessionLimits(**bad)


def test_the_session_modules_are_pure() -> None:
    banned = {"asyncio", "grpc", "socket", "threading", "time", "random", "os"}
    assert_imports_none_of(["broker/fetch_session.py", "broker/fetch_session_client.py"], banned)


# -- watches (a follower's session) -------------------------------------------------------------


def test_random_watch_histories_read_exactly_the_unwatched_partitions() -> None:
    """Over random histories of a follower session (named, forgotten and answered
    partitions, quiet checks that start watches, watches disturbed, the recheck), each
    fetch reads exactly the partitions its session does not watch and that are not quiet
    now, and every partition of the session is either watched or in the walk, never both
    (the walk visits the unwatched ones only)."""
    keys_all = [("t", i) for i in range(12)]
    for seed in range(60):
        rng = random.Random(seed)
        cache = make_cache()
        session_id = open_session(cache, {k: at(10) for k in keys_all[:6]})
        epoch, now = 1, 0
        for _ in range(80):
            now += rng.choice((1, 10, 400))
            present = set(cache._sessions[session_id].partitions)
            named = {k: at(rng.randint(10, 12)) for k in rng.sample(keys_all, rng.randint(0, 3))}
            gone = tuple(k for k in present - set(named) if rng.random() < 0.05)
            context = cache.begin(request(session_id, epoch, named, gone), now)
            assert isinstance(context, IncrementalFetch), (seed, context)
            session = context.session
            watched_before = set(session.quiet)
            quiet_now = {k for k in session.partitions if rng.random() < 0.6}
            context.skip_quiet(lambda key, heard, watch, quiet=quiet_now: key in quiet)
            read = set(keys(context))
            expected = set(session.partitions) - watched_before - quiet_now
            assert read == expected, (seed, read, expected)
            assert set(session.quiet) | set(session.unwatched) == set(session.partitions)
            assert not set(session.quiet) & set(session.unwatched)
            for watch in list(session.quiet.values()):
                if rng.random() < 0.2:  # the partition changed
                    watch.disturbed(rng.choice((0, 100)), rng.random() < 0.1)
            assert set(session.quiet) | set(session.unwatched) == set(session.partitions)
            news = [News(rng.choice((0, 0, 50)), 10, 10, 0) for _ in context.partitions]
            assert answered(context, news, now).error_code == ErrorCode.NONE
            epoch = next_epoch(epoch)
