"""The fetching side of a fetch session (broker/fetch_session_client.py): what it names, what
it forgets, how answers and failures move its session; and, driven together with the
leader's cache (broker/fetch_session.py) through random histories, that the leader always
fetches exactly what the client wants, from where the client wants it."""

from __future__ import annotations

import itertools
import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.fetch_session import (
    INITIAL_EPOCH,
    NO_SESSION,
    FetchPosition,
    FetchSessionCache,
    News,
    PartitionKey,
    SessionLimits,
    SessionRequest,
)
from broker.fetch_session_client import FetchSessionClient, SessionFetch
from broker.protocol import ErrorCode

A, B, C = ("t", 0), ("t", 1), ("u", 0)


def at(offset: int) -> FetchPosition:
    return FetchPosition(offset, 0, 0, 0, 1 << 20)


def test_the_first_request_is_full_and_opens_a_session() -> None:
    client = FetchSessionClient()
    first = client.build({A: at(0), B: at(0)})
    assert (first.session_id, first.epoch, first.full) == (NO_SESSION, INITIAL_EPOCH, True)
    assert first.partitions == {A: at(0), B: at(0)} and first.forgotten == []
    assert client.handle_response(ErrorCode.NONE, 42)
    assert (client.session_id, client.epoch) == (42, 1)


def test_an_incremental_request_names_what_changed_and_forgets_what_is_gone() -> None:
    client = FetchSessionClient()
    client.build({A: at(0), B: at(0)})
    client.handle_response(ErrorCode.NONE, 42)
    quiet = client.build({A: at(0), B: at(0)})
    assert (quiet.session_id, quiet.epoch, quiet.partitions, quiet.forgotten) == (42, 1, {}, [])
    client.handle_response(ErrorCode.NONE, 42)
    moved = client.build({A: at(5), C: at(0)})
    assert (moved.epoch, moved.partitions, moved.forgotten) == (2, {A: at(5), C: at(0)}, [B])
    client.handle_response(ErrorCode.NONE, 42)
    epoch_changed = client.build({A: FetchPosition(5, 0, 1, 0, 1 << 20), C: at(0)})
    assert list(epoch_changed.partitions) == [A] and epoch_changed.epoch == 3


def test_a_session_error_or_a_lost_answer_makes_the_next_request_full() -> None:
    client = FetchSessionClient()
    client.build({A: at(0)})
    client.handle_response(ErrorCode.NONE, 42)
    client.build({A: at(1)})
    assert not client.handle_response(ErrorCode.INVALID_FETCH_SESSION_EPOCH, NO_SESSION)
    again = client.build({A: at(1)})
    assert (again.session_id, again.epoch, again.partitions) == (42, 0, {A: at(1)})  # closes 42
    client.handle_response(ErrorCode.NONE, 43)
    client.build({A: at(1)})
    assert not client.handle_response(ErrorCode.FETCH_SESSION_ID_NOT_FOUND, NO_SESSION)
    assert client.build({A: at(1)})[:2] == (NO_SESSION, INITIAL_EPOCH)  # 43 is gone: not named
    client.handle_response(ErrorCode.NONE, 44)
    client.build({A: at(1)})
    client.reset()  # the connection dropped before the answer
    assert client.build({A: at(1)})[:2] == (44, INITIAL_EPOCH)


def test_an_answer_with_no_session_means_none_is_open() -> None:
    client = FetchSessionClient()
    client.build({A: at(0)})
    assert client.handle_response(ErrorCode.NONE, NO_SESSION)  # declined
    assert client.build({A: at(0)}).full
    client.handle_response(ErrorCode.NONE, 42)
    client.build({})
    assert client.handle_response(ErrorCode.NONE, NO_SESSION)  # emptied: closed by the leader
    assert client.build({A: at(0)})[:2] == (NO_SESSION, INITIAL_EPOCH)


# -- the client and the leader's cache together --------------------------------------------------

KEYS = [("t", i) for i in range(4)] + [("u", 0)]
Step = tuple[str, dict[PartitionKey, FetchPosition]]
wanted_sets = st.dictionaries(
    st.sampled_from(KEYS),
    st.builds(at, st.integers(0, 3)),
    max_size=len(KEYS),
)
fates = st.sampled_from(["answered", "answered", "answered", "lost", "evicted"])
steps = st.lists(
    st.tuples(fates, wanted_sets),
    min_size=1,
    max_size=30,
)


def exchange(cache: FetchSessionCache, sent: SessionFetch, now_ms: int) -> tuple[Any, Any]:
    """The leader takes the request the client built and answers it with no news."""
    request = SessionRequest(
        sent.session_id, sent.epoch, 2, dict(sent.partitions), tuple(sent.forgotten)
    )
    context = cache.begin(request, now_ms)
    return context, context.finish([News(0, 0, 0, 0)] * len(context.partitions), now_ms)


@settings(max_examples=200, deadline=None)
@given(steps, st.integers(0, 2**32))
def test_the_leader_fetches_exactly_what_the_client_wants(history: list[Step], seed: int) -> None:
    rng = random.Random(seed)
    cache = FetchSessionCache(SessionLimits(), lambda: rng.randint(1, 2**31 - 1))
    client = FetchSessionClient()
    for now_ms, (fate, wanted) in enumerate(history):
        sent = client.build(wanted)
        context, answer = exchange(cache, sent, now_ms)
        if answer.error_code == ErrorCode.NONE:
            assert dict(context.partitions) == wanted, (sent, context)
        else:  # only a session the client did not know was gone
            assert answer.error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
        if fate == "lost":
            client.reset()
        else:
            client.handle_response(answer.error_code, answer.session_id)
        if fate == "evicted" and client.session_id != NO_SESSION:
            cache.begin(SessionRequest(client.session_id, -1, 2, {}), now_ms)  # closed
    assert cache.size <= 1 + sum(1 for fate, _ in history if fate == "lost")


def test_a_session_s_life_with_the_leader() -> None:
    ids = itertools.count(1)
    cache = FetchSessionCache(SessionLimits(), lambda: next(ids))
    client = FetchSessionClient()
    for wanted in ({A: at(0)}, {A: at(1)}, {A: at(1), B: at(0)}, {B: at(0)}):
        sent = client.build(wanted)
        request = SessionRequest(sent.session_id, sent.epoch, 2, sent.partitions, sent.forgotten)
        context = cache.begin(request, 0)
        assert dict(context.partitions) == wanted
        answer = context.finish([News(0, 0, 0, 0)] * len(context.partitions), 0)
        assert client.handle_response(answer.error_code, answer.session_id)
    assert (client.session_id, client.epoch, cache.size) == (1, 4, 1)


@settings(max_examples=200, deadline=None)
@given(steps, st.integers(0, 2**32))
def test_a_request_built_from_what_changed_is_the_one_built_from_everything(
    history: list[Step], seed: int
) -> None:
    """``build_changes`` (what broker/replica_fetcher.py sends: the positions of the
    partitions that may have changed, and those no longer wanted) makes the same request as
    ``build`` of the whole wanted map, through the same history of answers and failures;
    and the leader fetches exactly what is wanted."""
    rng = random.Random(seed)
    cache = FetchSessionCache(SessionLimits(), lambda: rng.randint(1, 2**31 - 1))
    whole, by_changes = FetchSessionClient(), FetchSessionClient()
    before: dict[PartitionKey, FetchPosition] = {}
    for now_ms, (fate, wanted) in enumerate(history):
        expected = whole.build(wanted)
        if by_changes.full_next:
            sent = by_changes.build(wanted)
        else:
            # Some unchanged partitions are said to have changed too, as a refresh does.
            changed = {k: p for k, p in wanted.items() if before.get(k) != p or rng.random() < 0.3}
            gone = [k for k in before if k not in wanted] + [k for k in KEYS if rng.random() < 0.1]
            sent = by_changes.build_changes(changed, [k for k in gone if k not in wanted])
        assert sent._replace(forgotten=sorted(sent.forgotten)) == expected._replace(
            forgotten=sorted(expected.forgotten)
        ), (sent, expected)
        before = dict(wanted)
        context, answer = exchange(cache, sent, now_ms)
        if answer.error_code == ErrorCode.NONE:
            assert dict(context.partitions) == wanted, (sent, context)
        for client in (whole, by_changes):
            if fate == "lost":
                client.reset()
            else:
                client.handle_response(answer.error_code, answer.session_id)
        if fate == "evicted" and by_changes.session_id != NO_SESSION:
            cache.begin(SessionRequest(by_changes.session_id, -1, 2, {}), now_ms)  # closed
