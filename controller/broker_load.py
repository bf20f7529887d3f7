"""Each broker's load in a metadata image: the replicas it holds and the partitions whose
preferred (first) replica it is. Replica placement balances new partitions against it.

How this works. The load is a function of the image's partitions, so it is *derived* state:
``MetadataImage.broker_load`` holds it and ``MetadataDelta`` keeps it up to date as records
add, change and remove partitions, through a ``LoadChanges`` (per-broker differences from
the delta's base image, which ``applied_to`` folds into the next image's mapping). It is not
part of a snapshot or the digest: replaying a snapshot's partition records rebuilds it. So
placement reads it in O(brokers) instead of a pass over every partition per request (a pass
took about 30 ms at 100,000 partitions). ``count_load`` is that pass, for tests and checks.

A broker whose counts drop to zero leaves the mapping, so equal partitions always give equal
mappings. Counts are per broker id, registered or not. Not thread-safe: a delta's owner only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from itertools import chain
from types import MappingProxyType
from typing import NamedTuple

from storage.errors import invariant

__all__ = ["NO_LOAD", "BrokerLoad", "LoadChanges", "count_load"]


class BrokerLoad(NamedTuple):
    replicas: int  # partitions with a replica on the broker
    preferred_leaders: int  # partitions whose first replica is the broker


NO_LOAD = BrokerLoad(0, 0)


class LoadChanges:
    """What one delta's records changed in each broker's load, relative to its base image.

    Replay only notes the replica lists that came and went (a list append each, the hot
    path); ``applied_to`` counts them at C speed when an image is built.
    """

    __slots__ = ("_added", "_removed")

    def __init__(self) -> None:
        self._added: list[tuple[int, ...]] = []
        self._removed: list[tuple[int, ...]] = []

    def add(self, replicas: tuple[int, ...]) -> None:
        """A partition with these replicas (first: the preferred leader) came into being."""
        self._added.append(replicas)

    def remove(self, replicas: tuple[int, ...]) -> None:
        """A partition with these replicas went (or is about to be replaced)."""
        self._removed.append(replicas)

    def applied_to(self, base: Mapping[int, BrokerLoad]) -> Mapping[int, BrokerLoad]:
        """``base`` with the changes made, as a new read-only mapping; ``base`` itself when
        no replica list came or went (most deltas: heartbeats, ISR changes, leader moves)."""
        if not self._added and not self._removed:
            return base
        added, removed = count_load(self._added), count_load(self._removed)
        merged = dict(base)
        for broker in added.keys() | removed.keys():
            old = merged.get(broker, NO_LOAD)
            plus, minus = added.get(broker, NO_LOAD), removed.get(broker, NO_LOAD)
            new = BrokerLoad(
                old.replicas + plus.replicas - minus.replicas,
                old.preferred_leaders + plus.preferred_leaders - minus.preferred_leaders,
            )
            invariant(
                new.replicas >= 0 and new.preferred_leaders >= 0,
                f"broker {broker}: negative load {new} (was {old})",
            )
            if new == NO_LOAD:
                merged.pop(broker, None)
            else:
                merged[broker] = new
        return MappingProxyType(merged)


def count_load(replica_lists: Iterable[tuple[int, ...]]) -> dict[int, BrokerLoad]:
    """The load of the partitions with these replica lists, counted in one pass."""
    lists = list(replica_lists)
    # One Counter over a flat iterable counts at C speed; update() per partition is 5x slower.
    replicas = Counter(chain.from_iterable(lists))
    preferred = Counter(r[0] for r in lists)
    return {b: BrokerLoad(replicas[b], preferred[b]) for b in replicas}
