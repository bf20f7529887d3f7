"""The followers a new leader waits for: keeping their long polls short until they fetch.

Why. A follower fetches all its partitions from one leader in one request, long-polled for
up to ``replica_fetch_wait_max_ms`` (500 ms). When this broker becomes the leader of a
partition (a new topic, an election, a reassignment), a follower that already fetches other
partitions from it has such a request parked here: it adds the partition only to its next
request, so the partition's first acks=all writes waited up to the whole long poll for it
(0.36-0.42 s in 5 of 12 topic creations by hand on 1 controller + 3 brokers). The follower
cannot take a parked request back, so the leader helps:

* on becoming the leader it wakes those followers' parked fetches (they answer at once and
  the followers send new ones, naming the partition if they know of it by then);
* until a follower's fetches hold the partition (named, or in its fetch session), or for at
  most ``AWAIT_MS``, that follower's fetches long-poll for at most ``SHORT_POLL_MS``: a
  follower that applies the metadata after the leader (by milliseconds, usually) is asked
  again soon instead of in half a second.

How this works. ``expect(key, followers)`` notes, for each follower, the partition and until
when it is awaited (oldest first); ``short_poll(replica_id, holds)`` is asked on each follower
fetch: it drops, oldest first, the entries that expired or that the fetch holds, and stops at
the first still awaited, so a fetch costs O(1) plus what it drops (each entry is dropped
once). A follower awaited for nothing costs one dict lookup per fetch.

Limits: at most one entry per (follower, partition) led here, each gone within ``AWAIT_MS``
or when this broker stops leading the partition (``forget``).

Concurrency: the broker's event loop only.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

__all__ = ["AWAIT_MS", "SHORT_POLL_MS", "AwaitedFollowers"]

AWAIT_MS = 2_000  # how long a new leader keeps a follower's polls short, at most
SHORT_POLL_MS = 10  # a long poll's limit meanwhile

PartitionKey = tuple[str, int]


class AwaitedFollowers:
    """See the module docstring."""

    def __init__(self, clock_ms: Callable[[], int]) -> None:
        self._clock_ms = clock_ms
        self._awaited: dict[int, OrderedDict[PartitionKey, int]] = {}  # follower -> until

    def __len__(self) -> int:
        """(Follower, partition) pairs awaited now."""
        return sum(len(keys) for keys in self._awaited.values())

    def expect(self, key: PartitionKey, followers: Iterable[int]) -> None:
        until = self._clock_ms() + AWAIT_MS
        for follower in followers:
            keys = self._awaited.setdefault(follower, OrderedDict())
            keys[key] = until
            keys.move_to_end(key)  # kept oldest first: a renewed entry goes last

    def forget(self, key: PartitionKey) -> None:
        """This broker no longer leads ``key``: nobody is awaited for it."""
        for follower in [f for f, keys in self._awaited.items() if keys.pop(key, 0)]:
            if not self._awaited[follower]:
                del self._awaited[follower]

    def short_poll(self, replica_id: int, holds: Callable[[PartitionKey], bool]) -> bool:
        """Whether ``replica_id``'s fetch, which holds the partitions ``holds`` says, must
        long-poll for at most ``SHORT_POLL_MS``: it is awaited for a partition it does not
        hold yet."""
        keys = self._awaited.get(replica_id)
        if keys is None:
            return False
        now = self._clock_ms()
        while keys:
            key, until = next(iter(keys.items()))
            if until > now and not holds(key):
                return True
            del keys[key]
        del self._awaited[replica_id]
        return False
