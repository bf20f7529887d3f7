"""Replica placement, leader choice and preferred-leader moves (controller.placement).

The balance bounds tested here are the ones the module docstring promises, on an empty
cluster, as max minus min per broker: preferred leaders <= 1 always; replicas <= 1 without
racks; with equal racks 0 for a multiple of the broker count, else <= 2.
"""

from __future__ import annotations

import ast
import inspect
import itertools
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controller import placement
from controller.placement import (
    NO_LEADER,
    BrokerSlot,
    PlacementError,
    choose_leader,
    place_replicas,
    preferred_leader_moves,
)

Placement = list[tuple[int, ...]]
Load = dict[int, tuple[int, int]]


def rackless(*ids: int) -> list[BrokerSlot]:
    return [BrokerSlot(i, None) for i in ids]


def in_racks(racks: int, per_rack: int) -> list[BrokerSlot]:
    """``racks * per_rack`` brokers numbered from 1, rack "r0", "r1", ... in turn."""
    return [BrokerSlot(1 + i, f"r{i % racks}") for i in range(racks * per_rack)]


def replica_counts(brokers: Sequence[BrokerSlot], placed: Placement) -> Counter[int]:
    counts = Counter({b.broker_id: 0 for b in brokers})
    counts.update(b for replicas in placed for b in replicas)
    return counts


def leader_counts(brokers: Sequence[BrokerSlot], placed: Placement) -> Counter[int]:
    counts = Counter({b.broker_id: 0 for b in brokers})
    counts.update(replicas[0] for replicas in placed)
    return counts


def spread(counts: Counter[int]) -> int:
    return max(counts.values()) - min(counts.values())


def racks_used(brokers: Sequence[BrokerSlot], replicas: tuple[int, ...]) -> int:
    rack = {b.broker_id: b.rack for b in brokers}
    return len({rack[b] for b in replicas})


def assert_balanced(brokers: Sequence[BrokerSlot], placed: Placement, replicas: int) -> None:
    assert spread(leader_counts(brokers, placed)) <= 1, placed
    assert spread(replica_counts(brokers, placed)) <= replicas, placed


# -- strategies --------------------------------------------------------------------------------

broker_ids = st.lists(st.integers(0, 1000), min_size=1, max_size=12, unique=True)
rack_names = st.one_of(st.none(), st.sampled_from(["a", "b", "c", "d"]))


@st.composite
def any_cluster(draw: st.DrawFn) -> list[BrokerSlot]:
    """Any brokers: rackless, racked, or mixed (None is a rack of its own)."""
    return [BrokerSlot(i, draw(rack_names)) for i in draw(broker_ids)]


@st.composite
def request(
    draw: st.DrawFn, cluster: st.SearchStrategy[list[BrokerSlot]]
) -> tuple[list[BrokerSlot], int, int, int]:
    brokers = draw(cluster)
    rf = draw(st.integers(1, len(brokers)))
    partitions = draw(st.integers(1, 3 * len(brokers)))
    return brokers, partitions, rf, draw(st.integers(0, 10_000))


@st.composite
def loads(draw: st.DrawFn, brokers: Sequence[BrokerSlot]) -> Load:
    load: Load = {}
    for b in brokers:
        replicas = draw(st.integers(0, 40))
        load[b.broker_id] = (replicas, draw(st.integers(0, replicas)))
    return load


# -- every placement -------------------------------------------------------------------------


@given(request(any_cluster()), st.data())
def test_every_replica_list_is_full_distinct_and_rack_diverse(
    req: tuple[list[BrokerSlot], int, int, int], data: st.DataObject
) -> None:
    brokers, partitions, rf, start = req
    load = data.draw(st.none() | loads(brokers))
    placed = place_replicas(brokers, partitions, rf, load, start)
    ids = {b.broker_id for b in brokers}
    racks = len({b.rack for b in brokers})
    assert len(placed) == partitions
    for replicas in placed:
        assert len(replicas) == rf
        assert len(set(replicas)) == rf
        assert set(replicas) <= ids
        assert racks_used(brokers, replicas) == min(rf, racks)


@given(request(any_cluster()), st.data())
def test_same_inputs_give_the_same_placement_whatever_the_order(
    req: tuple[list[BrokerSlot], int, int, int], data: st.DataObject
) -> None:
    brokers, partitions, rf, start = req
    load = data.draw(st.none() | loads(brokers))
    first = place_replicas(brokers, partitions, rf, load, start)
    assert place_replicas(list(brokers), partitions, rf, load, start) == first
    shuffled = data.draw(st.permutations(brokers))
    reordered_load = dict(reversed(list(load.items()))) if load else load
    assert place_replicas(shuffled, partitions, rf, reordered_load, start) == first


def test_mixed_racks_count_rackless_brokers_as_one_more_rack() -> None:
    brokers = [BrokerSlot(1, "a"), BrokerSlot(2, "a"), BrokerSlot(3, None), BrokerSlot(4, None)]
    for replicas in place_replicas(brokers, 8, 2):
        assert racks_used(brokers, replicas) == 2


def test_unequal_racks_put_diversity_before_balance() -> None:
    brokers = [BrokerSlot(1, "small"), *(BrokerSlot(i, "big") for i in (2, 3, 4))]
    placed = place_replicas(brokers, 6, 2)
    assert all(1 in replicas for replicas in placed)
    assert spread(leader_counts(brokers, placed)) <= 1


# -- balance on an empty cluster ------------------------------------------------------------


@given(request(st.builds(lambda ids: rackless(*ids), broker_ids)))
def test_without_racks_leaders_and_replicas_differ_by_at_most_one(
    req: tuple[list[BrokerSlot], int, int, int],
) -> None:
    brokers, partitions, rf, start = req
    assert_balanced(brokers, place_replicas(brokers, partitions, rf, None, start), replicas=1)


@given(st.integers(1, 4), st.integers(1, 4), st.data())
def test_equal_racks_balance(racks: int, per_rack: int, data: st.DataObject) -> None:
    brokers = in_racks(racks, per_rack)
    n = len(brokers)
    rf = data.draw(st.integers(1, n))
    partitions = data.draw(st.integers(1, 3 * n))
    placed = place_replicas(brokers, partitions, rf, None, data.draw(st.integers(0, 99)))
    assert_balanced(brokers, placed, replicas=0 if partitions % n == 0 else 2)


@pytest.mark.parametrize("racks", [1, 2, 3])
def test_bounds_hold_exhaustively_on_small_clusters(racks: int) -> None:
    for per_rack in range(1, 7 // racks + 1):
        brokers = in_racks(racks, per_rack) if racks > 1 else rackless(*range(1, per_rack + 1))
        n = len(brokers)
        for rf, partitions in itertools.product(range(1, n + 1), range(1, 2 * n + 1)):
            exact = partitions % n == 0
            bound = 0 if exact else (1 if racks == 1 else 2)
            assert_balanced(brokers, place_replicas(brokers, partitions, rf), replicas=bound)


@pytest.mark.parametrize(("brokers", "rounds"), [(rackless(1, 2, 3, 4, 5), 2), (in_racks(3, 2), 3)])
def test_whole_rounds_give_every_broker_the_same_share(
    brokers: list[BrokerSlot], rounds: int
) -> None:
    placed = place_replicas(brokers, rounds * len(brokers), 3, None, 17)
    assert set(leader_counts(brokers, placed).values()) == {rounds}
    assert set(replica_counts(brokers, placed).values()) == {3 * rounds}


def test_followers_of_a_leader_spread_over_all_other_brokers() -> None:
    """Kafka's shifting follower offset: over n - 1 rounds each broker's second replicas are
    all the other brokers, so a failed leader's partitions do not all fail over to one."""
    brokers = rackless(*range(6))
    placed = place_replicas(brokers, 6 * 5, 2, None, 3)
    seconds: dict[int, set[int]] = {}
    for leader, second in placed:
        seconds.setdefault(leader, set()).add(second)
    assert all(len(s) == 5 for s in seconds.values())


def test_start_rotates_the_first_leader() -> None:
    brokers = rackless(10, 20, 30)
    firsts = {place_replicas(brokers, 1, 2, None, start)[0][0] for start in range(3)}
    assert firsts == {10, 20, 30}


def test_racks_alternate_in_the_rotation() -> None:
    brokers = [BrokerSlot(1, "a"), BrokerSlot(2, "a"), BrokerSlot(3, "b"), BrokerSlot(4, "b")]
    leaders = [replicas[0] for replicas in place_replicas(brokers, 4, 1)]
    assert leaders == [1, 3, 2, 4]


# -- balancing against an existing cluster ---------------------------------------------------


def test_new_partitions_go_to_the_least_loaded_brokers() -> None:
    brokers = rackless(1, 2, 3, 4, 5, 6)
    load = {1: (10, 4), 2: (10, 3), 3: (10, 3)}  # 4, 5 and 6 were just added
    placed = place_replicas(brokers, 3, 3, load, 0)
    assert all(set(replicas) == {4, 5, 6} for replicas in placed)
    assert sorted(replicas[0] for replicas in placed) == [4, 5, 6]


def test_a_new_broker_takes_leaderships_until_it_catches_up() -> None:
    brokers = rackless(1, 2, 3, 4)
    load = {1: (20, 10), 2: (20, 10), 3: (20, 10)}
    placed = place_replicas(brokers, 10, 1, load, 5)
    assert placed == [(4,)] * 10


def test_load_of_brokers_not_offered_is_ignored() -> None:
    brokers = rackless(1, 2)
    assert place_replicas(brokers, 4, 2, {9: (100, 50)}, 0) == place_replicas(brokers, 4, 2)


def test_a_level_loaded_cluster_is_placed_like_an_empty_one() -> None:
    brokers = in_racks(2, 2)
    level = {b.broker_id: (7, 3) for b in brokers}
    assert place_replicas(brokers, 9, 2, level, 4) == place_replicas(brokers, 9, 2, None, 4)


@given(request(st.builds(lambda ids: rackless(*ids), broker_ids)), st.data())
def test_brokers_given_nothing_were_never_less_loaded_than_those_chosen(
    req: tuple[list[BrokerSlot], int, int, int], data: st.DataObject
) -> None:
    """Water-filling, seen from outside: a broker that got no new replica ends at most one
    replica below any broker that got a new follower, and one leadership below any broker
    that got a new leadership."""
    brokers, partitions, rf, start = req
    load = data.draw(loads(brokers))
    placed = place_replicas(brokers, partitions, rf, load, start)
    replicas = replica_counts(brokers, placed) + Counter({b: r for b, (r, _) in load.items()})
    leaders = leader_counts(brokers, placed) + Counter({b: lead for b, (_, lead) in load.items()})
    chosen = {b for r in placed for b in r}
    followers = {b for r in placed for b in r[1:]}
    for idle in (b.broker_id for b in brokers if b.broker_id not in chosen):
        assert all(replicas[b] <= replicas[idle] + 1 for b in followers)
        assert all(leaders[r[0]] <= leaders[idle] + 1 for r in placed)


# -- errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("brokers", "partitions", "rf", "message"),
    [
        (rackless(1, 2), 3, 3, "replication factor 3 is larger than the 2 available brokers"),
        ([], 1, 1, "replication factor 1 is larger than the 0 available brokers"),
        (rackless(1, 2), 3, 0, "the replication factor must be at least 1, not 0"),
        (rackless(1, 2), 0, 1, "the partition count must be at least 1, not 0"),
        (rackless(1, 2), -4, 1, "the partition count must be at least 1, not -4"),
        (
            [BrokerSlot(1, "a"), BrokerSlot(2, None), BrokerSlot(1, "b"), *rackless(2, 3)],
            1,
            1,
            "duplicate broker ids: 1, 2",
        ),
    ],
)
def test_impossible_requests_are_refused_clearly(
    brokers: list[BrokerSlot], partitions: int, rf: int, message: str
) -> None:
    with pytest.raises(PlacementError) as caught:
        place_replicas(brokers, partitions, rf)
    assert str(caught.value) == message
    assert isinstance(caught.value, ValueError)


# -- leader choice ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("replicas", "isr", "alive", "unclean", "leader"),
    [
        ([1, 2, 3], [1, 2, 3], {1, 2, 3}, False, 1),  # the preferred replica
        ([1, 2, 3], [3, 2], {1, 2, 3}, False, 2),  # replica order, not ISR order
        ([1, 2, 3], [1, 2, 3], {2, 3}, False, 2),  # dead ISR members are skipped
        ([1, 2, 3], [1], {2, 3}, False, NO_LEADER),  # clean: wait for the ISR
        ([1, 2, 3], [1], {2, 3}, True, 2),  # unclean: first alive replica
        ([1, 2, 3], [1, 3], {3}, True, 3),  # unclean still prefers the ISR
        ([1, 2, 3], [], set(), True, NO_LEADER),  # nobody alive
        ([], [], {1}, True, NO_LEADER),
        ([4, 5], [5, 9], {4, 5, 9}, False, 5),  # an ISR id outside the replicas never leads
    ],
)
def test_choose_leader(
    replicas: list[int], isr: list[int], alive: set[int], unclean: bool, leader: int
) -> None:
    assert choose_leader(replicas, isr, alive, unclean) == leader


def test_no_leader_is_minus_one() -> None:
    assert NO_LEADER == -1


def test_preferred_leader_moves() -> None:
    partitions = [
        ("balanced", [1, 2, 3], [1, 2, 3], 1),
        ("moves", [1, 2, 3], [1, 2, 3], 2),
        ("preferred dead", [2, 1], [1, 2], 1),
        ("preferred out of sync", [3, 1], [1], 1),
        ("leaderless", [1, 2], [1], NO_LEADER),
        ("no replicas", [], [], NO_LEADER),
        (("topic", 7), [4, 1], [1, 4], 1),
    ]
    moves = preferred_leader_moves(partitions, alive={1, 3, 4})
    assert moves == [("moves", 1), ("leaderless", 1), (("topic", 7), 4)]


# -- purity ----------------------------------------------------------------------------------


def imported_modules(source: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_placement_imports_no_io_clock_or_randomness() -> None:
    imported = imported_modules(inspect.getsource(placement))
    assert not imported & {"asyncio", "grpc", "io", "os", "random", "socket", "time"}
