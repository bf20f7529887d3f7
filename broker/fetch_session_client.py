"""Fetch sessions (KIP-227), the fetching side: what a client puts in its next Fetch request
so that the leader's session (``broker.fetch_session``) and the client agree.

How this works. The client keeps the session id and the epoch of its next request, and the
position it last sent for each partition (what the leader's session holds). ``build(wanted)``
takes the partitions the client wants fetched now, with their positions, and returns the
request's session fields:

* no session (the start, or after any failure): a full request of every wanted partition
  with epoch 0, which asks the leader to open a session (and names the previous session, if
  any, so the leader closes it: Kafka's ``nextCloseExisting``);
* a session open at epoch N: an incremental request with epoch N naming only the
  partitions that are new or whose position changed, and forgetting (``forgotten``) those
  no longer wanted. A partition not named is fetched by the leader from the position it
  holds, and an answer that leaves a partition out means it has no news.

A client that knows which partitions may have changed since its last request builds the
next one from those alone: ``full_next`` says whether it must be a full one (then ``build``
with every wanted partition), and ``build_changes(changed, gone)`` makes an incremental one
from the positions of the partitions that may have changed and those no longer wanted; it is
the request ``build`` would make from the whole map, at the cost of what changed.

``handle_response(error_code, session_id)`` reads the answer: a session error
(FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, or any other top-level error)
returns False and makes the next request full; a full answer with a session id opens the
session at epoch 1; an answer with session id 0 means none is open (the leader declined
one, or closed it). ``reset()`` makes the next request full after anything that leaves the
request's fate unknown: a lost connection, a timeout, an undecodable answer. This is Kafka's
``FetchSessionHandler``.

Pure logic, no I/O. One request at a time: ``build`` assumes the previous request's answer
was handled (or ``reset`` called).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from broker.fetch_session import (
    INITIAL_EPOCH,
    NO_SESSION,
    FetchPosition,
    PartitionKey,
    next_epoch,
)
from broker.protocol import ErrorCode
from storage.errors import invariant

__all__ = ["FetchSessionClient", "SessionFetch"]


class SessionFetch(NamedTuple):
    """The session fields of the next request."""

    session_id: int
    epoch: int
    partitions: dict[PartitionKey, FetchPosition]  # to name in the request
    forgotten: list[PartitionKey]

    @property
    def full(self) -> bool:
        return self.epoch == INITIAL_EPOCH


class FetchSessionClient:
    """One fetching client's session with one leader (module doc)."""

    def __init__(self) -> None:
        self.session_id = NO_SESSION
        self.epoch = INITIAL_EPOCH  # of the next request: INITIAL_EPOCH asks for a new session
        self._sent: dict[PartitionKey, FetchPosition] = {}  # what the leader's session holds
        self._last_full = True  # whether the request in flight is a full one

    def build(self, wanted: Mapping[PartitionKey, FetchPosition]) -> SessionFetch:
        previous, self._sent = self._sent, dict(wanted)
        self._last_full = self.epoch == INITIAL_EPOCH
        if self._last_full:
            return SessionFetch(self.session_id, INITIAL_EPOCH, dict(wanted), [])
        changed = {k: p for k, p in wanted.items() if previous.get(k) != p}
        forgotten = [k for k in previous if k not in wanted]
        return SessionFetch(self.session_id, self.epoch, changed, forgotten)

    @property
    def full_next(self) -> bool:
        """Whether the next request must be a full one (``build`` with every partition)."""
        return self.epoch == INITIAL_EPOCH

    def build_changes(
        self, changed: Mapping[PartitionKey, FetchPosition], gone: Iterable[PartitionKey]
    ) -> SessionFetch:
        """The next, incremental, request from what may have changed: ``changed`` the
        wanted partitions whose position may differ from the one last sent (new ones too),
        ``gone`` those no longer wanted. Every other partition must be wanted at the
        position last sent. Only while ``full_next`` is False."""
        invariant(not self.full_next, "a full request needs every partition: build()")
        self._last_full = False
        sent = self._sent
        named = {}
        for key, position in changed.items():
            if sent.get(key) != position:
                sent[key] = named[key] = position
        forgotten = [key for key in gone if sent.pop(key, None) is not None]
        return SessionFetch(self.session_id, self.epoch, named, forgotten)

    def handle_response(self, error_code: int, session_id: int) -> bool:
        """Take the answer's top-level fields; False if it is a session error (nothing in
        it was fetched, and the next request is full)."""
        if error_code != ErrorCode.NONE:
            if error_code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND:
                self.session_id = NO_SESSION
            self.epoch = INITIAL_EPOCH
            return False
        if session_id == NO_SESSION:  # declined, or closed by the leader
            self.session_id, self.epoch = NO_SESSION, INITIAL_EPOCH
        elif self._last_full:
            self.session_id, self.epoch = session_id, next_epoch(INITIAL_EPOCH)
        else:
            self.epoch = next_epoch(self.epoch)
        return True

    def reset(self) -> None:
        """The next request is full (and closes the session it names, if any)."""
        self.epoch = INITIAL_EPOCH
