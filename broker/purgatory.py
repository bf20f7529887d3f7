"""The fetch purgatory: long-polling fetches parked until their partitions have new data.

How this works. A Fetch that finds fewer than ``min_bytes`` ready parks here with ``park``:
one waiter per request, registered under each of its partitions (``keys``). When a partition's
high watermark moves, the partition calls ``notify(key, bytes)`` (it is one of the
``Partition.on_append`` listeners) and each waiter on that key adds the bytes to its count;
a waiter whose count reaches its ``min_bytes`` wakes. So an append costs O(waiters on that
partition), and nothing polls. A waiter also wakes when its timeout passes (one event-loop
timer each), when ``wake(key)`` says a partition changed leader or went away (so the fetch
re-reads and answers the new error at once), when ``wake_owner(id)`` names the broker whose
fetch it is (a follower's, ``owner``: a new leader wakes its followers' parked fetches so
that they can name the new partition: ``broker.awaited_followers``), and when
``cancel_all`` shuts the broker down.

``park`` counts bytes appended *after* it was called: the caller reads first and asks for
what is missing (``min_bytes - bytes already read``). Bytes are those that became readable
by consumers (below the high watermark) in the consumers' purgatory, and bytes appended to a
leader's log in the followers' (the broker keeps one of each: follower fetches read to the
log end, so they wake on appends, not on the high watermark).

``park`` registers the waiter at once and returns its future, so that the read and the
registration happen in one event-loop callback: the fetch handler parks before it returns
its coroutine, and an append handled before that coroutine first runs still wakes it.
Until 2026-11-24 the purgatory offered a coroutine instead, which registered only when its
task first ran: an append in that gap left the fetch waiting its whole timeout with the
data there. A waiter unregisters itself by a callback of its future, at the event loop's
next turn after the future is done (woken, timed out or cancelled; ``waiting`` counts it
until then, and feeding or waking it again does nothing). The fetch handler's answer is a
future chained to the waiter's (``broker.handlers.common.then``), so a connection closed
before the answer is computed cancels the waiter too.

Limits: at most ``max_waiters`` parked fetches. One more is answered at once (as if it had
timed out; the client simply fetches again), counted in ``overflows`` and logged, so a
flood of long polls cannot hold unbounded memory and timers.

Concurrency: asyncio, one event loop. ``notify``, ``wake`` and ``cancel_all`` must be called
on the loop's thread (they are plain calls from the partition's append path).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Sequence

__all__ = ["DEFAULT_MAX_WAITERS", "FetchPurgatory", "WakeReason"]

_log = logging.getLogger(__name__)

DEFAULT_MAX_WAITERS = 10_000
Key = tuple[str, int]  # (topic name, partition id)


class WakeReason(enum.Enum):
    """Why ``wait`` returned."""

    BYTES = "bytes"  # min_bytes arrived
    TIMEOUT = "timeout"
    LEADERSHIP = "leadership"  # a partition changed leader or was removed, or a new one awaits
    CANCELLED = "cancelled"  # shutdown
    OVERFLOW = "overflow"  # too many waiters already: answered at once


class _Waiter:
    __slots__ = ("future", "keys", "min_bytes", "owner", "poke", "received", "timer")

    def __init__(
        self,
        future: asyncio.Future[WakeReason],
        keys: Sequence[Key],
        min_bytes: int,
        poke: Callable[[Callable[[object, int], None] | None], None] | None,
        owner: int | None,
    ):
        self.future = future
        self.keys = keys
        self.min_bytes = min_bytes
        self.poke = poke
        self.owner = owner
        self.received = 0
        self.timer: asyncio.TimerHandle | None = None

    def wake(self, reason: WakeReason) -> None:
        if not self.future.done():
            self.future.set_result(reason)

    def feed(self, key: object, bytes_appended: int) -> None:
        """``bytes_appended`` became readable on ``key`` (-1: it changed leader)."""
        if bytes_appended < 0:
            self.wake(WakeReason.LEADERSHIP)
            return
        if bytes_appended == 0:
            return
        self.received += bytes_appended
        if self.received >= self.min_bytes:
            self.wake(WakeReason.BYTES)


class FetchPurgatory:
    """Parked fetches by partition. See the module docstring."""

    def __init__(self, max_waiters: int = DEFAULT_MAX_WAITERS) -> None:
        if max_waiters < 0:
            raise ValueError(f"max_waiters must be at least 0, got {max_waiters}")
        self.max_waiters = max_waiters
        self.overflows = 0  # fetches answered at once because max_waiters were parked
        self._by_key: dict[Key, set[_Waiter]] = {}
        self._by_owner: dict[int, set[_Waiter]] = {}
        self._waiting = 0
        self._closed = False

    @property
    def waiting(self) -> int:
        """Fetches parked now."""
        return self._waiting

    def park(
        self,
        keys: Sequence[Key],
        min_bytes: int,
        timeout_ms: int,
        poke: Callable[[Callable[[object, int], None] | None], None] | None = None,
        owner: int | None = None,
    ) -> asyncio.Future[WakeReason]:
        """A future, registered now, done once ``min_bytes`` have become readable across
        ``keys`` since the call, or ``timeout_ms`` passed, or a partition changed leader, or
        shutdown began. ``min_bytes <= 0`` or ``timeout_ms <= 0`` are done at once; no keys
        waits the timeout (an empty incremental fetch waits too). ``poke``, if given, is
        handed a function that feeds this wait as ``notify`` does, for partitions not among
        ``keys`` (bytes -1: as ``wake``), while it is parked, and None once it is not.
        ``owner``, if given, is the broker whose fetch this is, for ``wake_owner``.
        Cancelling the future unparks it."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[WakeReason] = loop.create_future()
        if min_bytes <= 0:
            future.set_result(WakeReason.BYTES)
        elif timeout_ms <= 0:
            future.set_result(WakeReason.TIMEOUT)
        elif self._closed:
            future.set_result(WakeReason.CANCELLED)
        elif self._waiting >= self.max_waiters:
            self._overflow()
            future.set_result(WakeReason.OVERFLOW)
        else:
            waiter = _Waiter(future, tuple(keys), min_bytes, poke, owner)
            waiter.timer = loop.call_later(timeout_ms / 1000, waiter.wake, WakeReason.TIMEOUT)
            self._park(waiter)
            future.add_done_callback(lambda _: self._unpark(waiter))
            if poke is not None:
                poke(waiter.feed)
        return future

    def notify(self, key: Key, bytes_appended: int) -> None:
        """``bytes_appended`` became readable on ``key``: wake the waiters that have enough.
        The signature of ``replication.partition.AppendListener``."""
        waiters = self._by_key.get(key)
        if not waiters or bytes_appended <= 0:
            return
        for waiter in waiters:
            waiter.feed(key, bytes_appended)

    def wake(self, key: Key) -> None:
        """``key`` changed leader or was removed: its waiters answer now."""
        for waiter in self._by_key.get(key, ()):
            waiter.wake(WakeReason.LEADERSHIP)

    def wake_owner(self, owner: int) -> None:
        """The parked fetches of broker ``owner`` answer now."""
        for waiter in self._by_owner.get(owner, ()):
            waiter.wake(WakeReason.LEADERSHIP)

    def cancel_all(self) -> None:
        """Shutdown: wake every waiter, and answer later calls at once."""
        self._closed = True
        for waiters in self._by_key.values():
            for waiter in waiters:
                waiter.wake(WakeReason.CANCELLED)

    # -- internals ---------------------------------------------------------------------------
    def _park(self, waiter: _Waiter) -> None:
        self._waiting += 1
        for key in waiter.keys:
            self._by_key.setdefault(key, set()).add(waiter)
        if waiter.owner is not None:
            self._by_owner.setdefault(waiter.owner, set()).add(waiter)

    def _unpark(self, waiter: _Waiter) -> None:
        self._waiting -= 1
        if waiter.timer is not None:
            waiter.timer.cancel()
        for key in waiter.keys:
            waiters = self._by_key.get(key)
            if waiters is not None:
                waiters.discard(waiter)
                if not waiters:
                    del self._by_key[key]
        if waiter.owner is not None:
            owned = self._by_owner[waiter.owner]
            owned.discard(waiter)
            if not owned:
                del self._by_owner[waiter.owner]
        if waiter.poke is not None:
            waiter.poke(None)

    def _overflow(self) -> None:
        self.overflows += 1
        # The first time, then every 1,000th: a flood must not flood the log as well.
        if self.overflows % 1000 == 1:
            _log.warning(
                "fetch purgatory full (%d waiting): answering at once (%d times so far)",
                self._waiting,
                self.overflows,
            )
