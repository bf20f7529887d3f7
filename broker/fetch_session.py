"""Fetch sessions (KIP-227), the leader's side: for each session, the partitions its client
fetches, from where, and what the client last heard of each; so the client's next request
names only what changed, and the answer carries only what changed.

How this works. A Fetch carries ``(session_id, session_epoch)``; ``FetchSessionCache.begin``
reads it and returns a context, one class per kind of fetch::

    (0, -1)   Sessionless       a full fetch: the request names every partition; answered
                                in full with session id 0
    (0, 0)    FullFetch         a full fetch that opens a session: answered in full with the
                                new session's id, or 0 when none is made (see the bounds)
    (S, 0)    FullFetch         closes session S first (if the same replica id opened it)
    (S, -1)   Sessionless       closes session S first
    (S, N)    IncrementalFetch  N must be S's next epoch; the request's partitions are added
                                to or updated in S, then ``forgotten_topics_data`` removed
    errors    SessionError      S unknown (or opened by another replica id):
                                FETCH_SESSION_ID_NOT_FOUND; N not its next epoch:
                                INVALID_FETCH_SESSION_EPOCH. Answered with no partitions and
                                session id 0; the client's next fetch is a full one

A session opened by a fetch naming topics by id (Fetch v13+) holds its partitions by
(topic id, partition) (``SessionKey``; the handler looks each id up when it reads), one
opened by names by (name, partition); a request of the other kind naming the session is
answered FETCH_SESSION_TOPIC_ID_ERROR (after the epoch check, as in Kafka).

A session's epochs run 1, 2, ... 2**31-1, 1, ...: the full fetch that opens it is epoch 0,
and each incremental request must carry the next. An incremental request that leaves its
session empty closes it and is served as a sessionless fetch of what it names; a full fetch
naming no partition opens no session. An incremental fetch overtaken, while it waited, by
the next request of its session is answered INVALID_FETCH_SESSION_EPOCH (Kafka's "possible
duplicate request").

The handler fetches every partition of ``context.partitions`` (for an incremental fetch,
every partition of the session, named or not: a follower's fetch must report its position
for idle partitions too, or the leader would drop it from the ISR), perhaps after a long
poll, and calls ``context.finish(news, now_ms)`` with what each answer says. ``finish``
opens a full fetch's session and says the session id to answer with; for an incremental
fetch it says which answers go out: those with something the client has not heard
(records, a changed high watermark, last stable offset or log start offset, an error, a
diverging epoch), as Kafka's ``CachedPartition.maybeUpdateResponseData``. After an error or a
diverging epoch the cached high watermark is forgotten, so the partition is answered again
with it (a follower that truncates does not take the HW from that answer, and a session that
took it as heard never said it again to an idle partition's follower: found by the
replication simulation's fetch sessions).
Answered partitions move to the end of the session's order, so a response's size limits
do not starve the partitions after them (Kafka does the same).

Watches (a follower's session only). ``IncrementalFetch.skip_quiet`` asks the handler, for
each partition the session does not watch, whether it is quiet for the follower; a quiet one
starts a ``_Watch``, which the partition holds (``replication.partition.QuietWatch``), and
the session's later fetches skip it. The partition ends the watch (``disturbed``) when it
changes; the session ends it when the partition is named anew or forgotten, when the session
goes, and for all its partitions every ``QUIET_RECHECK_MS``. Until it ends, the watch says
the follower fetched at the session's latest fetch (``last_fetch_ms``); after, at the last
fetch it covered. A fetch parked by the handler hears of its session's watched partitions
through ``IncrementalFetch.parked``. The session keeps its unwatched partitions apart
(``_Session.unwatched``, in the order fetches read them; a partition whose watch ends goes to
the end), so a fetch walks those alone and costs what changed, not the session's size
(``bench.fetch_session_walk``).

Bounds. At most ``max_sessions`` sessions (Kafka's max.incremental.fetch.session.cache.slots)
holding at most ``max_partitions`` partitions in all. A session unused for ``expiry_ms`` is
dropped. runnel's eviction rule, simpler than Kafka's: a full fetch that does not fit may
evict the least recently used *consumer* sessions, and only a follower's (replica id >= 0)
may do so; a consumer's full fetch that does not fit opens no session (answered with
session id 0, its client goes on fetching in full). An incremental request that would take
the cache over ``max_partitions`` closes its session (FETCH_SESSION_ID_NOT_FOUND). Kafka has
no partition bound; its eviction also weighs session sizes and ages.

Pure logic: no I/O, no clock (``now_ms`` is an argument), no randomness of its own (session
ids come from the ``new_session_id`` function given). Not thread-safe: the broker's event
loop owns it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from broker.protocol import ErrorCode
from storage.errors import invariant

__all__ = [
    "DEFAULT_EXPIRY_MS",
    "DEFAULT_MAX_PARTITIONS",
    "DEFAULT_MAX_SESSIONS",
    "FINAL_EPOCH",
    "INITIAL_EPOCH",
    "NO_SESSION",
    "QUIET_RECHECK_MS",
    "FetchContext",
    "FetchPosition",
    "FetchSessionCache",
    "FullFetch",
    "IncrementalFetch",
    "News",
    "PartitionKey",
    "SessionAnswer",
    "SessionError",
    "SessionLimits",
    "SessionKey",
    "SessionRequest",
    "Sessionless",
    "next_epoch",
]

NO_SESSION = 0  # a request's session id when it has none; an answer's when none is open
INITIAL_EPOCH = 0  # a full fetch that opens a session
FINAL_EPOCH = -1  # a full fetch without a session (it closes the one it names)
MAX_EPOCH = 2**31 - 1
MAX_SESSION_ID = 2**31 - 1
MAX_ID_DRAWS = 64  # a random 31-bit id collides this often only if the generator is broken

DEFAULT_MAX_SESSIONS = 1000  # Kafka's max.incremental.fetch.session.cache.slots
DEFAULT_MAX_PARTITIONS = 200_000
DEFAULT_EXPIRY_MS = 120_000  # Kafka's MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS
# A follower session looks at every partition afresh at least this often: what changes
# without the partition's knowing (the log start, moved by retention in the maintenance
# thread) reaches the follower within it.
QUIET_RECHECK_MS = 1_000

PartitionKey = tuple[str, int]  # (topic name, partition id)
# A session's key of a partition: (topic name, partition id), or in a session by topic ids
# (Fetch v13+) (topic id, partition id), the id as its 16 bytes (they hash faster).
SessionKey = tuple[str | bytes, int]


def next_epoch(epoch: int) -> int:
    """The epoch after ``epoch``: 1 after 0 and after the largest, -1 after a negative one."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == MAX_EPOCH else epoch + 1


class FetchPosition(NamedTuple):
    """What a Fetch request says of one partition (its FetchPartition fields)."""

    fetch_offset: int
    last_fetched_epoch: int = -1
    current_leader_epoch: int = -1
    log_start_offset: int = -1  # the fetcher's own
    max_bytes: int = 1_048_576


class SessionRequest(NamedTuple):
    """A Fetch request as far as sessions go."""

    session_id: int
    epoch: int
    replica_id: int  # >= 0: a follower's fetch
    partitions: dict[SessionKey, FetchPosition]  # named, in request order
    forgotten: Sequence[SessionKey] = ()
    by_ids: bool = False  # topics named by id (v13+): the keys hold topic ids


class News(NamedTuple):
    """What one partition's answer tells the client, as far as sessions compare."""

    records_bytes: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    error_code: int = ErrorCode.NONE
    diverging: bool = False


class SessionAnswer(NamedTuple):
    """How to answer: the top-level error, the session id, and which partitions go out
    (one flag per ``context.partitions`` entry, in that order)."""

    error_code: int
    session_id: int
    include: tuple[bool, ...]


@dataclass(frozen=True, slots=True)
class SessionLimits:
    max_sessions: int = DEFAULT_MAX_SESSIONS
    max_partitions: int = DEFAULT_MAX_PARTITIONS
    expiry_ms: int = DEFAULT_EXPIRY_MS

    def __post_init__(self) -> None:
        if self.max_sessions < 0 or self.max_partitions < 0 or self.expiry_ms < 1:
            raise ValueError(f"bad fetch session limits: {self}")


@dataclass(slots=True)
class _Cached:
    """One partition of a session: the client's last request for it, and the offsets the
    client last heard (-1: nothing yet, or an error since)."""

    position: FetchPosition
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1

    def heard(self, news: News) -> None:
        # A follower truncating on a diverging epoch does not take the HW of that answer (its
        # log may still diverge below it), so it has not heard it either.
        forget = news.error_code != ErrorCode.NONE or news.diverging
        self.high_watermark = -1 if forget else news.high_watermark
        self.last_stable_offset = news.last_stable_offset
        self.log_start_offset = news.log_start_offset

    def must_answer(self, news: News) -> bool:
        return (
            news.records_bytes > 0
            or news.error_code != ErrorCode.NONE
            or news.diverging
            or news.high_watermark != self.high_watermark
            or news.last_stable_offset != self.last_stable_offset
            or news.log_start_offset != self.log_start_offset
        )


class _Watch:
    """A follower session's watch of one partition it found quiet
    (``replication.partition.QuietWatch``): the follower fetched it, at the leader's log
    end, at every fetch of the session until the watch ends (the partition changed, or the
    session named it anew, forgot it or went away)."""

    __slots__ = ("ended_ms", "key", "session")

    def __init__(self, session: _Session, key: SessionKey) -> None:
        self.session = session
        self.key = key
        self.ended_ms: int | None = None

    @property
    def last_fetch_ms(self) -> int:
        return self.session.last_used_ms if self.ended_ms is None else self.ended_ms

    def end(self) -> None:
        """The session's fetches no longer cover the partition: they count up to now only."""
        if self.ended_ms is None:
            self.ended_ms = self.session.last_used_ms

    def disturbed(self, appended_bytes: int, leadership: bool) -> None:
        session = self.session
        if session.quiet.get(self.key) is not self:
            return  # ended, or replaced by a newer watch
        del session.quiet[self.key]
        session.unwatched[self.key] = None
        if session.poke is not None and (appended_bytes > 0 or leadership):
            session.poke(self.key, -1 if leadership else appended_bytes)


@dataclass(slots=True)
class _Session:
    id: int
    replica_id: int
    epoch: int  # the epoch the next incremental request must carry
    last_used_ms: int
    by_ids: bool  # opened by a fetch naming topics by id: its keys hold topic ids
    partitions: dict[SessionKey, _Cached] = field(default_factory=dict)
    # A follower's session: the partitions it watches as quiet, skipped by its fetches
    # (``IncrementalFetch.skip_quiet``), and since when none was looked at afresh.
    quiet: dict[SessionKey, _Watch] = field(default_factory=dict)
    quiet_since_ms: int = 0
    # The others (every key of ``partitions`` is in one of the two), in the order fetches
    # read them: a fetch walks these alone, so it costs what changed, not the session's size.
    unwatched: dict[SessionKey, None] = field(default_factory=dict)
    # While a fetch of the session is parked: feeds it as ``FetchPurgatory.notify`` would
    # (bytes appended to a watched partition; -1: a leadership change).
    poke: Callable[[SessionKey, int], None] | None = None

    @property
    def privileged(self) -> bool:
        return self.replica_id >= 0

    def update(
        self, named: dict[SessionKey, FetchPosition], forgotten: Iterable[SessionKey]
    ) -> None:
        """Kafka's order: add or update what is named, then remove what is forgotten. Named
        or forgotten partitions are no longer watched (a new position is read afresh)."""
        partitions, quiet, unwatched = self.partitions, self.quiet, self.unwatched
        for key, position in named.items():
            cached = partitions.get(key)
            if cached is None:
                partitions[key] = _Cached(position)
                unwatched[key] = None
            else:
                if quiet:
                    self.unwatch(key)
                if cached.position.current_leader_epoch != position.current_leader_epoch:
                    # Followed anew: an answer the client dropped meanwhile may have marked
                    # offsets heard that it never took; it hears them all again.
                    partitions[key] = _Cached(position)
                else:
                    cached.position = position
        for key in forgotten:
            if partitions.pop(key, None) is not None:
                watch = quiet.pop(key, None)
                if watch is not None:
                    watch.end()
                unwatched.pop(key, None)

    def unwatch(self, key: SessionKey) -> None:
        watch = self.quiet.pop(key, None)
        if watch is not None:
            watch.end()
            self.unwatched[key] = None

    def unwatch_all(self) -> None:
        for key, watch in self.quiet.items():
            watch.end()
            self.unwatched[key] = None
        self.quiet.clear()


class SessionError:
    """A request naming a session that is gone or at another epoch: nothing is fetched."""

    def __init__(self, error_code: int) -> None:
        self.error_code = error_code
        self.partitions: list[tuple[SessionKey, FetchPosition]] = []

    def finish(self, news: Sequence[News], now_ms: int) -> SessionAnswer:
        return SessionAnswer(self.error_code, NO_SESSION, ())


class Sessionless:
    """A full fetch without a session: everything it names is answered."""

    error_code = ErrorCode.NONE

    def __init__(self, partitions: dict[SessionKey, FetchPosition]) -> None:
        self.partitions = list(partitions.items())

    def finish(self, news: Sequence[News], now_ms: int) -> SessionAnswer:
        return SessionAnswer(ErrorCode.NONE, NO_SESSION, (True,) * len(news))


class FullFetch:
    """A full fetch opening a session (made when the answer is, if it fits)."""

    error_code = ErrorCode.NONE

    def __init__(self, cache: FetchSessionCache, request: SessionRequest) -> None:
        self.cache = cache
        self.replica_id = request.replica_id
        self.by_ids = request.by_ids
        self.partitions = list(request.partitions.items())

    def finish(self, news: Sequence[News], now_ms: int) -> SessionAnswer:
        invariant(len(news) == len(self.partitions), "one answer per partition")
        session_id = self.cache.open(
            self.replica_id, self.partitions, news, now_ms, by_ids=self.by_ids
        )
        return SessionAnswer(ErrorCode.NONE, session_id, (True,) * len(news))


class IncrementalFetch:
    """The next request of a session: every partition of the session is fetched, and only
    those with news are answered. A follower's skips the partitions its session watches as
    quiet (``skip_quiet``)."""

    error_code = ErrorCode.NONE

    def __init__(self, session: _Session) -> None:
        self.session = session
        self.epoch = session.epoch  # the session's epoch once this request is taken
        self._partitions: list[tuple[SessionKey, FetchPosition]] | None = None
        self._keys: list[SessionKey] | None = None
        self._poke: Callable[[SessionKey, int], None] | None = None

    @property
    def partitions(self) -> list[tuple[SessionKey, FetchPosition]]:
        """What to read: the whole session, or what ``skip_quiet`` left of it."""
        if self._partitions is None:
            self._partitions = [(key, c.position) for key, c in self.session.partitions.items()]
        return self._partitions

    @property
    def keys(self) -> list[SessionKey]:
        """What a long poll waits on by key: the partitions read."""
        if self._keys is None:
            self._keys = [key for key, _ in self.partitions]
        return self._keys

    def holds(self, key: SessionKey) -> bool:
        """Whether ``key`` is in the session (read by this request or watched as quiet)."""
        return key in self.session.partitions

    def skip_quiet(self, quiet: Callable[[SessionKey, _Cached, _Watch], bool]) -> None:
        """Read, answer and wait on only the partitions the session does not watch and for
        which ``quiet`` (given each one's request, what the client last heard, and a watch
        to start) says False. A True must mean the partition has no news, ``quiet`` did
        what reading it would have (a follower's position noted), and the partition holds
        the watch, which tells when that ends (``replication.partition.QuietWatch``). Each
        call starts again from every partition the session does not watch; the watched
        ones are not visited at all."""
        session = self.session
        watched, unwatched, partitions = session.quiet, session.unwatched, session.partitions
        chosen = []
        for key in list(unwatched):
            cached = partitions[key]
            watch = _Watch(session, key)
            if quiet(key, cached, watch):
                watched[key] = watch
                del unwatched[key]
            else:
                chosen.append((key, cached.position))
        self._partitions = chosen
        self._keys = None

    @property
    def watching(self) -> bool:
        """Whether partitions of the session are watched: a long poll waits on them too."""
        return bool(self.session.quiet)

    def parked(self, poke: Callable[[SessionKey, int], None] | None) -> None:
        """While this fetch is parked, ``poke`` hears of the session's watched partitions
        (``_Watch.disturbed``); None when it is no longer parked. A later fetch of the
        session that parks takes over."""
        session = self.session
        if poke is not None:
            self._poke = session.poke = poke
        elif session.poke is self._poke:
            session.poke = None

    def finish(self, news: Sequence[News], now_ms: int) -> SessionAnswer:
        invariant(len(news) == len(self.partitions), "one answer per partition")
        session = self.session
        if session.epoch != self.epoch:
            # A later request of this session was taken while this one waited (a client
            # sending twice): this one's answer would tell it news twice, or never.
            return SessionAnswer(ErrorCode.INVALID_FETCH_SESSION_EPOCH, session.id, ())
        include = []
        partitions, unwatched = session.partitions, session.unwatched
        for (key, _), said in zip(self.partitions, news, strict=True):
            cached = partitions.get(key)
            answer = cached is not None and cached.must_answer(said)
            if cached is not None and answer:
                cached.heard(said)
                del partitions[key]
                partitions[key] = cached  # to the end of the session's order
                if key in unwatched:
                    del unwatched[key]
                    unwatched[key] = None
            include.append(answer)
        return SessionAnswer(ErrorCode.NONE, session.id, tuple(include))


FetchContext = SessionError | Sessionless | FullFetch | IncrementalFetch


class _Lane:
    """The sessions of one kind (followers' or consumers'), least recently used first."""

    __slots__ = ("partitions", "sessions")

    def __init__(self) -> None:
        self.sessions: OrderedDict[int, _Session] = OrderedDict()
        self.partitions = 0


class FetchSessionCache:
    """Every fetch session of this broker (module doc)."""

    def __init__(self, limits: SessionLimits, new_session_id: Callable[[], int]) -> None:
        self.limits = limits
        self.new_session_id = new_session_id
        self._lanes = {True: _Lane(), False: _Lane()}  # by privilege: followers' first
        self._sessions: dict[int, _Session] = {}
        self.evictions = 0  # sessions evicted to make room so far
        self.expirations = 0  # sessions dropped after expiry_ms unused so far

    @property
    def size(self) -> int:
        """Sessions open now."""
        return len(self._sessions)

    @property
    def partitions(self) -> int:
        """Partitions cached now, in all sessions."""
        return sum(lane.partitions for lane in self._lanes.values())

    @property
    def watched(self) -> int:
        """Partitions the followers' sessions watch as quiet now (their fetches skip them)."""
        return sum(len(s.quiet) for s in self._lanes[True].sessions.values())

    def epoch_of(self, session_id: int) -> int | None:
        """The epoch session ``session_id``'s next request must carry; None if none open."""
        session = self._sessions.get(session_id)
        return None if session is None else session.epoch

    def begin(self, request: SessionRequest, now_ms: int) -> FetchContext:
        """Take one Fetch request: the context it is served in (module doc)."""
        self._expire(now_ms)
        if request.epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            found = self._sessions.get(request.session_id)
            if found is not None and found.replica_id == request.replica_id:
                self._remove(found.id)
            if request.epoch == FINAL_EPOCH:
                return Sessionless(request.partitions)
            return FullFetch(self, request)
        session = self._sessions.get(request.session_id)
        if session is None or session.replica_id != request.replica_id:
            return SessionError(ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
        if session.epoch != request.epoch:
            return SessionError(ErrorCode.INVALID_FETCH_SESSION_EPOCH)
        if session.by_ids != request.by_ids:  # Kafka's rule: a session keeps its kind of key
            return SessionError(ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR)
        lane = self._lanes[session.privileged]
        before = len(session.partitions)
        session.update(request.partitions, request.forgotten)
        lane.partitions += len(session.partitions) - before
        if not session.partitions:
            self._remove(session.id)
            return Sessionless(request.partitions)
        if self.partitions > self.limits.max_partitions:
            self._remove(session.id)
            return SessionError(ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
        session.epoch = next_epoch(session.epoch)
        session.last_used_ms = now_ms
        lane.sessions.move_to_end(session.id)
        if session.quiet and now_ms - session.quiet_since_ms >= QUIET_RECHECK_MS:
            session.unwatch_all()
        if not session.quiet:
            session.quiet_since_ms = now_ms
        return IncrementalFetch(session)

    def open(
        self,
        replica_id: int,
        partitions: Sequence[tuple[SessionKey, FetchPosition]],
        news: Sequence[News],
        now_ms: int,
        *,
        by_ids: bool = False,
    ) -> int:
        """A new session of ``partitions``, whose client has just heard ``news``: its id,
        or NO_SESSION if it does not fit (module doc: bounds). ``by_ids``: its keys hold
        topic ids, and only requests naming topics by id may go on with it."""
        privileged = replica_id >= 0
        if not partitions or not self._make_room(privileged, len(partitions)):
            return NO_SESSION
        session = _Session(self._unused_id(), replica_id, next_epoch(INITIAL_EPOCH), now_ms, by_ids)
        for (key, position), said in zip(partitions, news, strict=True):
            cached = _Cached(position)
            cached.heard(said)
            session.partitions[key] = cached
            session.unwatched[key] = None
        lane = self._lanes[privileged]
        lane.sessions[session.id] = session
        lane.partitions += len(session.partitions)
        self._sessions[session.id] = session
        return session.id

    def _make_room(self, privileged: bool, size: int) -> bool:
        """Whether a session of ``size`` partitions fits, evicting consumers' sessions for a
        follower's if that makes it fit."""
        limits, consumers = self.limits, self._lanes[False]

        def fits(sessions: int, partitions: int) -> bool:
            return sessions < limits.max_sessions and partitions + size <= limits.max_partitions

        if fits(len(self._sessions), self.partitions):
            return True
        followers = self._lanes[True]
        if not privileged or not fits(len(followers.sessions), followers.partitions):
            return False
        while not fits(len(self._sessions), self.partitions):
            oldest = next(iter(consumers.sessions))
            self._remove(oldest)
            self.evictions += 1
        return True

    def _unused_id(self) -> int:
        for _ in range(MAX_ID_DRAWS):
            candidate = self.new_session_id()
            if 0 < candidate <= MAX_SESSION_ID and candidate not in self._sessions:
                return candidate
        invariant(False, f"no unused session id in {MAX_ID_DRAWS} draws: a broken generator")
        return NO_SESSION  # unreachable

    def _expire(self, now_ms: int) -> None:
        expiry_ms = self.limits.expiry_ms
        for lane in self._lanes.values():
            while lane.sessions:
                oldest = next(iter(lane.sessions.values()))
                if now_ms - oldest.last_used_ms <= expiry_ms:
                    break
                self._remove(oldest.id)
                self.expirations += 1

    def _remove(self, session_id: int) -> None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            session.unwatch_all()
            lane = self._lanes[session.privileged]
            del lane.sessions[session_id]
            lane.partitions -= len(session.partitions)
