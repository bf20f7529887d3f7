"""How many file descriptors partition logs may take: a budget that keeps some for the rest.

Every segment of a log keeps its file open (and an index may keep one too), so a broker
holding many partitions can run out of descriptors (EMFILE). Its metadata log, its client
connections and its checkpoint files need them as well, and a metadata log that cannot open
a file stops the node. So opening a new log is refused (``OutOfFileDescriptorsError``, the
log's partition is not served here, nothing goes offline) once fewer than ``reserve``
descriptors of the process's soft limit would be left.

Counting the open descriptors (``/proc/self/fd``) costs time in their number, so it is done
only near the budget: the last count plus ``PER_NEW_LOG`` for each log opened since is an
upper bound; below the ceiling nothing is counted. A refusal is remembered for
``RECOUNT_S`` before counting again. The process's own limit is read again at each count,
so a limit raised on the running process (``prlimit --nofile``) takes effect.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable

from storage.errors import OutOfFileDescriptorsError

__all__ = ["DescriptorBudget", "open_descriptors"]

MIN_RESERVE = 256
RESERVE_SHARE = 10  # a tenth of the limit, at least MIN_RESERVE
PER_NEW_LOG = 3  # a new log's segment and, at most, its two indexes
RECOUNT_S = 1.0


def open_descriptors() -> int | None:
    """The number of descriptors this process has open; None where /proc cannot tell."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def _soft_limit() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else soft


class DescriptorBudget:
    """``limit``: the process's soft limit by default (None: no limit); ``reserve``: what logs
    leave free (by default a tenth of the limit, at least ``MIN_RESERVE``)."""

    def __init__(
        self,
        limit: int | None = None,
        reserve: int | None = None,
        *,
        count: Callable[[], int | None] = open_descriptors,
        clock: Callable[[], float] = time.monotonic,
        soft_limit: Callable[[], int | None] = _soft_limit,
    ) -> None:
        self._soft_limit = soft_limit if limit is None else None  # read again at each count
        self._given_reserve = reserve
        self._set_limit(soft_limit() if limit is None else limit)
        self.refusals = 0
        self._count = count
        self._clock = clock
        self._counted: int | None = None
        self._since = 0
        self._refused_at: float | None = None

    def _set_limit(self, limit: int | None) -> None:
        self.limit = limit
        given = self._given_reserve
        self.reserve = max(MIN_RESERVE, (limit or 0) // RESERVE_SHARE) if given is None else given

    def take(self, what: str) -> None:
        """Before ``what`` (a log) opens its files: OutOfFileDescriptorsError when that could
        leave fewer than ``reserve`` descriptors."""
        if self.limit is None:
            return
        ceiling = self.limit - self.reserve
        if self._counted is not None and self._counted + PER_NEW_LOG * (self._since + 1) < ceiling:
            self._since += 1
            return
        now = self._clock()
        if self._refused_at is not None and now - self._refused_at < RECOUNT_S:
            self._refuse(what, ceiling)
        if self._soft_limit is not None:
            limit = self._soft_limit()
            self._set_limit(limit)
            if limit is None:
                return
            ceiling = limit - self.reserve
        counted = self._count()
        if counted is None:  # nothing to count with: no budget
            self.limit = None
            return
        self._counted, self._since, self._refused_at = counted, 0, None
        if counted + PER_NEW_LOG > ceiling:
            self._refused_at = now
            self._refuse(what, ceiling)
        self._since = 1

    def _refuse(self, what: str, ceiling: int) -> None:
        self.refusals += 1
        raise OutOfFileDescriptorsError(
            f"{what}: not opened: {self._counted} of {self.limit} file descriptors are open and "
            f"{self.reserve} stay free for the metadata log and connections (at most {ceiling} "
            "for logs); raise the open file limit (ulimit -n)"
        )
