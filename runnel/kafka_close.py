"""A bounded close for confluent-kafka consumers (``runnel consume``, and the tests' consumers).

Why. librdkafka 2.16 can deadlock in ``Consumer.close()`` (confluentinc/librdkafka#5476, open):
its main thread, handling an OffsetForLeaderEpoch answer under a partition's lock, asks for
the client handle's write lock, while a broker thread whose connection failed holds the
handle's read lock and waits for that partition's lock. Seen here once (2026-11-25, a nemesis
run: the consumer's close hung right after the leaders had moved; gdb showed exactly those
three threads). The call waits in C, where neither Ctrl-C nor pytest's timeout reaches it.

How this works. ``close_consumer`` runs the close in a daemon thread and waits for it at most
``timeout_s``. A close that returns (or raises: raised again in the caller) is as before; one
that does not is left behind, and the consumer stays referenced (by the blocked call and by
this module), so nothing destroys it a second time before the process exits, which ends
librdkafka's threads with it.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["CLOSE_TIMEOUT_S", "close_consumer"]

CLOSE_TIMEOUT_S = 10.0  # a close without group membership or commits takes milliseconds
_left_behind: list[Any] = []


def close_consumer(consumer: Any, timeout_s: float = CLOSE_TIMEOUT_S) -> bool:
    """``consumer.close()``, waited for at most ``timeout_s``; whether it returned."""
    failed: list[BaseException] = []

    def close() -> None:
        try:
            consumer.close()
        except BaseException as e:  # raised in the caller's thread below
            failed.append(e)

    closer = threading.Thread(target=close, name="consumer-close", daemon=True)
    closer.start()
    closer.join(timeout_s)
    if closer.is_alive():
        _left_behind.append(consumer)
        return False
    if failed:
        raise failed[0]
    return True
