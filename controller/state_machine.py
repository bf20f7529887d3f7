"""The metadata log's state machine, on every node that replicates it: controllers (voters)
and brokers (observers). It turns committed records into the metadata image.

How this works. ``RaftNode`` hands committed records over one at a time, in log order
(``apply``), and snapshots to load (``restore``). Records go into an open ``MetadataDelta``;
the image is built from it only when someone asks (``image``), so a burst of records costs
one rebuild, not one per record. A snapshot is the image's canonical encoding
(``encode_snapshot``), so every node's snapshot of the same state is the same bytes.

``RaftNode`` takes snapshots by itself (``snapshot_interval_bytes``) and loads the leader's
when it is behind its log start; nothing else writes or reads them.

Listeners (``on_publish``) hear of every new image once per event-loop turn in which records
were applied, and after a snapshot is loaded: a broker turns each into partition changes.

A record that does not decode, or that breaks the image's invariants, is a bug in whoever
wrote the log: it raises, which stops the node loudly rather than serving a wrong image.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from controller.image import MetadataDelta, MetadataImage, decode_snapshot, encode_snapshot
from controller.records import decode

__all__ = ["MetadataStateMachine"]


class MetadataStateMachine:
    """``raft.driver.StateMachine`` for the metadata log. Use from the node's event loop;
    other threads read ``published`` only."""

    def __init__(self) -> None:
        self._image = MetadataImage.EMPTY
        self._delta: MetadataDelta | None = None
        self._publish_scheduled = False
        self._listeners: list[Callable[[MetadataImage], None]] = []
        self.records_applied = 0

    def on_publish(self, listener: Callable[[MetadataImage], None]) -> None:
        """Call ``listener(image)`` with each new image built on the event loop."""
        self._listeners.append(listener)

    @property
    def published(self) -> MetadataImage:
        """The latest image built, for readers on other threads (metrics): it never builds,
        so it may trail ``image`` by the records of the current event-loop turn."""
        return self._image

    @property
    def image(self) -> MetadataImage:
        """Everything applied so far (built now if records came since the last call)."""
        if self._delta is not None:
            self._image = self._delta.apply()
            self._delta = None
        return self._image

    def apply(self, offset: int, record: bytes) -> None:
        if self._delta is None:
            self._delta = MetadataDelta(self._image)
        self._delta.replay(decode(record), offset)
        self.records_applied += 1
        self._schedule_publish()

    def _schedule_publish(self) -> None:
        """Build the image once the current burst of records is applied (next loop turn),
        so ``published`` stays fresh on nodes where nobody asks for ``image``."""
        if self._publish_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no event loop (tools, tests): ``image`` builds on demand
        self._publish_scheduled = True
        loop.call_soon(self._publish)

    def _publish(self) -> None:
        self._publish_scheduled = False
        image = self.image
        for listener in self._listeners:
            listener(image)

    def snapshot(self) -> bytes:
        return encode_snapshot(self.image)

    def restore(self, data: bytes) -> None:
        self._image = decode_snapshot(data)
        self._delta = None
        self._schedule_publish()
