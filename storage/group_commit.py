"""Group commit: make appends durable with one fdatasync for many concurrent waiters.

An asyncio caller appends (which writes to the page cache and returns at once) and then
awaits ``durable(last_offset)``. At most one flush runs at a time, in a worker thread so the
event loop keeps accepting appends. A flush covers everything appended before it began;
callers that arrive while one is in flight wait for it and then share the next one. Under
load the number of fsyncs therefore tracks the fsync latency, not the append rate.

Used with ``LogConfig.fsync_each_append = False``: that setting makes every append fsync
inline, which is right for synchronous callers and wasteful under concurrency. The broker
does not use this class (only tests do): a broker with ``fsync_each_append`` fsyncs once per
append, on its event loop.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor

from storage.log import Log


class GroupCommit:
    """Coalesces durability waits on one log. Use from a single event loop."""

    def __init__(self, log: Log, *, executor: Executor | None = None) -> None:
        self._log = log
        self._executor = executor
        self._in_flight: asyncio.Future[None] | None = None

    async def durable(self, offset: int) -> None:
        """Return once every record below ``offset`` is fsynced (recovery point >= offset)."""
        while self._log.recovery_point < offset:
            if self._in_flight is None:
                loop = asyncio.get_running_loop()
                self._in_flight = loop.run_in_executor(self._executor, self._log.flush)
                self._in_flight.add_done_callback(self._clear)
            await asyncio.shield(self._in_flight)

    def _clear(self, future: asyncio.Future[None]) -> None:
        if self._in_flight is future:
            self._in_flight = None
