"""A log line for an event that can repeat without end (a flood of messages): said at once,
then at most once per interval with the count of those kept quiet. Pure: the caller passes
the time."""

from __future__ import annotations

__all__ = ["LOG_INTERVAL_S", "LogThrottle", "more"]

LOG_INTERVAL_S = 10.0  # a line about drops that can repeat without end: at most this often


class LogThrottle:
    """At most one log line per ``interval_s``: the first is said at once; later ones are
    counted and the count is said with the next line."""

    def __init__(self, interval_s: float = LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._next_s = float("-inf")
        self._quiet = 0

    def ready(self, now_s: float) -> int | None:
        """None: keep quiet (counted); else log now, and this many were kept quiet before."""
        if now_s < self._next_s:
            self._quiet += 1
            return None
        quiet, self._quiet = self._quiet, 0
        self._next_s = now_s + self.interval_s
        return quiet


def more(quiet: int) -> str:
    """The count to append to a throttled line."""
    return f" ({quiet} more since the last such line)" if quiet else ""
