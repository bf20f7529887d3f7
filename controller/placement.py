"""Replica placement and leader choice for the active controller (Kafka's AdminUtils and
StripedReplicaPlacer, KIP-36 rack awareness), balanced against the brokers' existing load.

How this works. Everything here is a pure function: no I/O, no clock, no randomness. The
caller passes ``start`` (a random or hashed int) so that topics do not all begin at the same
broker; the same inputs always give the same placement.

The brokers are first arranged rack by rack in turn (racks sorted by name, brokers by id, a
broker without a rack counting as a rack of its own named None, sorted last):
racks a={1,4}, b={2,5}, c={3} give 1, 2, 3, 4, 5. Rotating through this list alternates
racks, which is how Kafka spreads a partition's replicas over racks. The first replica of a
partition is its preferred leader. Then two regimes:

* Whole rounds on a level cluster. While every broker holds the same number of replicas and
  of preferred leaderships (an empty cluster, say), each round of ``len(brokers)``
  partitions uses Kafka's striped layout: partition p is led by broker ``(start + p) mod n``
  of the list, and its followers sit at offsets ``1 + (shift + k) mod (n - 1)`` after it,
  skipping brokers whose rack already holds a replica until ``min(rf, racks)`` racks are
  used. ``shift`` grows by one every round, so a broker's followers change from round to
  round and a failed broker's leaderships scatter instead of piling on one neighbour.
  Without racks, or with racks of equal size, a round gives every broker exactly one
  leadership and ``rf`` replicas, and the cluster stays level.
* Greedy for everything else: the partitions left over after the rounds, and every
  partition when the cluster is not level (adding partitions or topics to a loaded cluster).
  The new preferred leaderships are first planned by water-filling: each goes to the broker
  with the fewest leaderships (ties: fewest replicas, then list order from ``start``). Each
  partition then takes as leader the broker that leads least among those with a planned
  leadership left, and as followers the brokers with the least *committed* load: replicas
  held plus planned leaderships still to come (each of those will add a replica). Counting
  the promised leaderships keeps a broker from gathering followers now and leaderships
  later. Followers must come from unused racks until ``min(rf, racks)`` racks hold one;
  ties go to the striped offset after the leader, as above.

The balance promised on an empty cluster (``load`` None or all zeros), as counts per broker
(max minus min): preferred leaders at most 1, always. Replicas: at most 1 without racks (all
brokers rackless, or all in one rack), for any partition count; with racks of equal size,
0 when the partition count is a multiple of the broker count and at most 2 otherwise. With
racks of unequal size there is no replica bound: rack diversity comes first, so a small
rack's brokers carry more (as in Kafka). On a loaded cluster every new leadership goes to a
broker with the fewest leaderships and new followers to the least committed load, so new
replicas land on the least-loaded brokers. The leader bound holds by construction (one
leadership per broker per round, water-filling after); the replica bounds were checked
exhaustively for up to 24 brokers, every replication factor and up to three partitions per
broker, and are property-tested in ``tests/controller/test_placement.py``.

Leader choice is Kafka's: the first replica, in replica order, that is alive and in the ISR;
with unclean election, failing that, the first alive replica. Preferred-leader balancing
moves leadership back to the first replica whenever it is alive and in the ISR.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from controller.image import NO_LEADER
from storage.errors import invariant

__all__ = [
    "NO_LEADER",
    "BrokerSlot",
    "PlacementError",
    "choose_leader",
    "place_replicas",
    "preferred_leader_moves",
]

K = TypeVar("K")


@dataclass(frozen=True, slots=True)
class BrokerSlot:
    """A broker that may receive new replicas: registered, unfenced, not shutting down."""

    broker_id: int
    rack: str | None


class PlacementError(ValueError):
    """The requested placement is impossible (bad counts, too few brokers, duplicate ids)."""


def place_replicas(
    brokers: Sequence[BrokerSlot],
    partitions: int,
    replication_factor: int,
    load: Mapping[int, tuple[int, int]] | None = None,
    start: int = 0,
) -> list[tuple[int, ...]]:
    """The replica lists of ``partitions`` new partitions, preferred leader first.

    ``load`` maps a broker id to the (replicas, preferred leaderships) it already holds;
    brokers missing from it hold none, and ids not in ``brokers`` are ignored. ``start``
    rotates where the placement begins. Raises ``PlacementError``.
    """
    _validate(brokers, partitions, replication_factor)
    cluster = _Cluster(brokers, load or {}, start)
    rounds = partitions // cluster.size if cluster.is_level() else 0
    striped = rounds * cluster.size
    placed = [cluster.striped(p, replication_factor) for p in range(striped)]
    placed += cluster.greedy(range(striped, partitions), replication_factor)
    for replicas in placed:
        invariant(
            len(set(replicas)) == len(replicas) == replication_factor,
            f"placement produced {replicas} for replication factor {replication_factor}",
        )
    return placed


def choose_leader(
    replicas: Sequence[int], isr: Sequence[int], alive: Container[int], unclean: bool
) -> int:
    """Kafka's leader election: the first replica (in replica order) that is alive and in
    the ISR; if none and ``unclean``, the first alive replica; otherwise ``NO_LEADER``."""
    in_sync = set(isr)
    for replica in replicas:
        if replica in in_sync and replica in alive:
            return replica
    if unclean:
        for replica in replicas:
            if replica in alive:
                return replica
    return NO_LEADER


def preferred_leader_moves(
    partitions: Iterable[tuple[K, Sequence[int], Sequence[int], int]],
    alive: Container[int],
) -> list[tuple[K, int]]:
    """For periodic preferred-leader balancing: ``(key, preferred replica)`` for each
    ``(key, replicas, isr, leader)`` whose leader is not its first replica while that
    replica is alive and in the ISR. Order follows ``partitions``."""
    moves: list[tuple[K, int]] = []
    for key, replicas, isr, leader in partitions:
        if not replicas:
            continue
        preferred = replicas[0]
        if leader != preferred and preferred in alive and preferred in isr:
            moves.append((key, preferred))
    return moves


def _validate(brokers: Sequence[BrokerSlot], partitions: int, replication_factor: int) -> None:
    if partitions < 1:
        raise PlacementError(f"the partition count must be at least 1, not {partitions}")
    if replication_factor < 1:
        raise PlacementError(f"the replication factor must be at least 1, not {replication_factor}")
    counts = Counter(b.broker_id for b in brokers)
    duplicates = sorted(broker_id for broker_id, n in counts.items() if n > 1)
    if duplicates:
        raise PlacementError(f"duplicate broker ids: {', '.join(map(str, duplicates))}")
    if replication_factor > len(brokers):
        raise PlacementError(
            f"replication factor {replication_factor} is larger than the "
            f"{len(brokers)} available brokers"
        )


def _rack_alternated(brokers: Sequence[BrokerSlot]) -> list[BrokerSlot]:
    """Brokers taken from each rack in turn: racks by name (None last), brokers by id."""
    by_rack: dict[str | None, list[BrokerSlot]] = {}
    for broker in sorted(brokers, key=lambda b: b.broker_id):
        by_rack.setdefault(broker.rack, []).append(broker)
    racks = sorted(by_rack, key=lambda rack: (rack is None, rack or ""))
    deepest = max(len(members) for members in by_rack.values())
    return [by_rack[r][i] for i in range(deepest) for r in racks if i < len(by_rack[r])]


class _Cluster:
    """Working state of one ``place_replicas`` call: the rack-alternated broker list and
    each broker's replica and leadership counts, updated as partitions are placed."""

    def __init__(
        self, brokers: Sequence[BrokerSlot], load: Mapping[int, tuple[int, int]], start: int
    ) -> None:
        arranged = _rack_alternated(brokers)
        self.order = [b.broker_id for b in arranged]
        self.size = len(arranged)
        self.start = start
        self.position = {broker_id: i for i, broker_id in enumerate(self.order)}
        self.rack = {b.broker_id: b.rack for b in arranged}
        self.rack_count = len(set(self.rack.values()))
        self.replicas = {b: load.get(b, (0, 0))[0] for b in self.order}
        self.leaders = {b: load.get(b, (0, 0))[1] for b in self.order}

    def is_level(self) -> bool:
        return len(set(self.replicas.values())) == 1 and len(set(self.leaders.values())) == 1

    def rotation(self, broker: int) -> int:
        """Where ``broker`` falls in the list when it is read from ``start``."""
        return (self.position[broker] - self.start) % self.size

    def offset(self, leader: int, broker: int, shift: int) -> int:
        """Distance of ``broker`` from the striped follower slot after ``leader``."""
        if self.size == 1:
            return 0
        after = (self.position[broker] - self.position[leader] - 1) % self.size
        return (after - shift) % (self.size - 1)

    def rack_wanted(self, racks: set[str | None], replication_factor: int) -> bool:
        """Must the next replica go to a rack not yet in ``racks``?"""
        return len(racks) < min(replication_factor, self.rack_count)

    def record(self, replicas: tuple[int, ...]) -> tuple[int, ...]:
        self.leaders[replicas[0]] += 1
        for broker in replicas:
            self.replicas[broker] += 1
        return replicas

    def striped(self, partition: int, replication_factor: int) -> tuple[int, ...]:
        """Kafka's rack-aware layout for ``partition`` (a whole round on a level cluster)."""
        first = (partition + self.start) % self.size
        shift = (self.start + partition // self.size) * self.rack_count
        chosen = [self.order[first]]
        racks = {self.rack[chosen[0]]}
        k = 0
        while len(chosen) < replication_factor:
            step = 1 + (shift + k) % (self.size - 1)
            broker = self.order[(first + step) % self.size]
            k += 1
            if broker in chosen or (
                self.rack[broker] in racks and self.rack_wanted(racks, replication_factor)
            ):
                continue
            chosen.append(broker)
            racks.add(self.rack[broker])
        return self.record(tuple(chosen))

    def greedy(self, partitions: range, replication_factor: int) -> list[tuple[int, ...]]:
        """Least-loaded placement of ``partitions`` (indices within this call)."""
        planned = self.plan_leaders(len(partitions))
        return [self.greedy_one(p, replication_factor, planned) for p in partitions]

    def plan_leaders(self, count: int) -> Counter[int]:
        """Water-fill ``count`` leaderships: each to the broker leading fewest so far."""
        heap = [(self.leaders[b], self.replicas[b], self.rotation(b), b) for b in self.order]
        heapq.heapify(heap)
        planned: Counter[int] = Counter()
        for _ in range(count):
            leaders, replicas, rotation, broker = heapq.heappop(heap)
            planned[broker] += 1
            heapq.heappush(heap, (leaders + 1, replicas + 1, rotation, broker))
        return planned

    def greedy_one(
        self, partition: int, replication_factor: int, planned: Counter[int]
    ) -> tuple[int, ...]:
        leader = min(
            (b for b in self.order if planned[b] > 0),
            key=lambda b: (self.leaders[b], self.replicas[b], self.rotation(b)),
        )
        planned[leader] -= 1
        shift = partition // self.size
        chosen = [leader]
        racks = {self.rack[leader]}
        while len(chosen) < replication_factor:
            new_rack = self.rack_wanted(racks, replication_factor)
            follower = min(
                (
                    b
                    for b in self.order
                    if b not in chosen and not (new_rack and self.rack[b] in racks)
                ),
                key=lambda b: (
                    self.replicas[b] + planned[b],
                    self.replicas[b],
                    self.offset(leader, b, shift),
                ),
            )
            chosen.append(follower)
            racks.add(self.rack[follower])
        return self.record(tuple(chosen))
