"""The replication simulation with follower fetch sessions (KIP-227), as the brokers fetch:
``replication.testing.simulation`` with ``SimConfig.fetch_sessions``, driven by the broker's
own session logic. It lives here, a layer above replication, because it imports the broker's
modules (replication imports nothing above it: DESIGN.md).

How this works. ``SessionSimulation`` extends ``Simulation``; everything else (the model
controller, the network, the faults, the invariants, the clients) is the base's.

- A follower keeps one fetcher per leader (``broker/replica_fetcher.py``): a
  ``FetchSessionClient``, each partition's position cached until an answer for it is applied,
  it rests, or every ``POSITION_REFRESH_MS``; an incremental request built from the
  partitions that may have changed since the last one (``build_changes``), a full one from
  all; a partition that errs rests for ``fetch_backoff_ms`` and is forgotten meanwhile; a
  request with no answer within the wait and the request timeout resets the session.
- A leader holds a ``FetchSessionCache`` per process incarnation and serves a session fetch
  as ``broker/handlers/fetch.py`` does, with its quiet rule (``quiet_for_follower``): quiet
  partitions watched and skipped, nothing to send parked until an append to a partition it
  read, a change of one its session watches (the session's poke) or the wait's end, each
  waking it on the loop's next turn; then it reads again and answers what the session lets
  out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from broker.fetch_session import (
    NO_SESSION,
    FetchContext,
    FetchPosition,
    FetchSessionCache,
    IncrementalFetch,
    News,
    SessionKey,
    SessionLimits,
    SessionRequest,
)
from broker.fetch_session_client import FetchSessionClient
from broker.handlers.fetch import quiet_for_follower
from broker.protocol import ErrorCode
from broker.replica_fetcher import POSITION_REFRESH_S, SESSION_ERRORS
from replication.partition import Partition, QuietWatch, Role
from replication.testing.simulation import (
    NO_ERROR,
    TOPIC,
    ExtensionPayload,
    Fetching,
    FetchResp,
    Msg,
    SimBroker,
    SimConfig,
    SimResult,
    Simulation,
    Timer,
)
from replication.testing.simulation import run_seed as run_base_seed

__all__ = ["SessionFetchReq", "SessionFetchResp", "SessionSimulation", "SimConfig", "run_seed"]

# Timer kinds: a fetcher's turn and its request's timeout (``pid`` is the leader's id), and
# a parked session fetch's expiry or wake-up (``token``).
FETCHER, FETCHER_TIMEOUT = "fetcher", "fetcher-timeout"
SESSION_POLL_EXPIRE, SESSION_WAKE = "session-poll", "session-wake"
POSITION_REFRESH_MS = round(POSITION_REFRESH_S * 1000)  # the real fetcher's, in virtual ms


@dataclass(frozen=True, slots=True)
class SessionFetchReq(ExtensionPayload):
    """A follower fetcher's request to one leader, in its fetch session: the partitions
    named (new, or their position changed) and those forgotten."""

    replica: int
    req_id: int
    session_id: int
    epoch: int
    partitions: tuple[tuple[int, FetchPosition], ...]
    forgotten: tuple[int, ...]
    broker_epoch: int = -1  # the follower's when it sent the fetch (Fetch v15)


@dataclass(frozen=True, slots=True)
class SessionFetchResp(ExtensionPayload):
    """The leader's answer: a session error, or the partitions with news (``req_id`` of
    each is the request's)."""

    req_id: int
    error: int
    session_id: int
    answers: tuple[FetchResp, ...]


@dataclass(slots=True)
class SessionFetching(Fetching):
    """A followed partition, as a session fetcher keeps it: the position last sent (read
    afresh after an answer for it was applied, a rest, or POSITION_REFRESH_MS), the end of a
    rest (0: not resting), and how many requests its fetcher had built when it began."""

    position: FetchPosition | None = None
    rest_until: int = 0
    since: int = 0


@dataclass(slots=True)
class Fetcher:
    """A follower's fetcher of one leader: its session, the request in flight (0: none) and
    its number among the requests built (an answer is not for a partition followed anew
    since), and the partitions that may have changed since the last request."""

    client: FetchSessionClient = field(default_factory=FetchSessionClient)
    in_flight: int = 0
    requests: int = 0
    asked: int = 0
    dirty: set[int] = field(default_factory=set)
    positions_read_ms: int = -POSITION_REFRESH_MS


@dataclass(slots=True)
class ParkedFetch:
    """A session fetch long-polled at the leader; ``pids``: the partitions it read."""

    msg: Msg
    request: SessionFetchReq
    context: FetchContext
    pids: frozenset[int]


@dataclass(slots=True)
class BrokerSessions:
    """One broker process's session state (gone with the process): its fetchers by leader,
    its session cache as a leader and the session fetches parked there, by token."""

    cache: FetchSessionCache
    fetchers: dict[int, Fetcher] = field(default_factory=dict)
    parked: dict[int, ParkedFetch] = field(default_factory=dict)


class SessionSimulation(Simulation):
    """One seeded run with fetch sessions (module doc); ``config.fetch_sessions`` is True."""

    SESSIONS = True

    def __init__(
        self, seed: int, config: SimConfig | None = None, directory: Path | None = None
    ) -> None:
        config = config or SimConfig(fetch_sessions=True)
        if not config.fetch_sessions:
            raise ValueError("SessionSimulation runs configs with fetch_sessions=True")
        super().__init__(seed, config, directory)
        self.sessions: dict[int, BrokerSessions] = {}

    # -- hooks of the base ----------------------------------------------------------------
    def _open(self, broker: SimBroker) -> None:
        self.sessions[broker.broker_id] = BrokerSessions(
            FetchSessionCache(SessionLimits(), self._next_id)
        )
        super()._open(broker)

    def _crash(self, broker: SimBroker, *, power_loss: bool = False) -> None:
        self.sessions.pop(broker.broker_id, None)
        super()._crash(broker, power_loss=power_loss)

    def _on_broker_message(self, broker: SimBroker, msg: Msg) -> None:
        payload = msg.payload
        if isinstance(payload, SessionFetchReq):
            self._serve_session_fetch(broker, msg, payload)
        elif isinstance(payload, SessionFetchResp):
            self._on_session_answer(broker, msg.src, payload)
        else:
            super()._on_broker_message(broker, msg)

    def _on_timer(self, timer: Timer) -> None:
        broker = self.brokers[timer.broker]
        if timer.kind == FETCHER:
            self._fetch_from(broker, timer.pid)
        elif timer.kind == FETCHER_TIMEOUT:
            self._fetcher_timed_out(broker, timer.pid, timer.token)
        elif timer.kind in (SESSION_POLL_EXPIRE, SESSION_WAKE):
            waiting = self.sessions[broker.broker_id].parked.pop(timer.token, None)
            if waiting is not None:
                self._answer_session_fetch(broker, waiting, may_park=False)
        else:
            super()._on_timer(timer)

    def _unfollowed(self, broker: SimBroker, pid: int, before: Fetching) -> None:
        fetcher = self.sessions[broker.broker_id].fetchers.get(before.leader)
        if fetcher is not None:
            fetcher.dirty.add(pid)

    def _followed(self, broker: SimBroker, pid: int, partition: Partition) -> None:
        leader = partition.leader_id
        fetcher = self.sessions[broker.broker_id].fetchers.setdefault(leader, Fetcher())
        fetching = SessionFetching(leader, partition.leader_epoch, self._next_id())
        fetching.since = fetcher.requests
        broker.fetching[pid] = fetching
        fetcher.dirty.add(pid)
        self._timer(broker, self.now, FETCHER, leader)

    def _wake_parked(self, broker: SimBroker, pid: int) -> None:
        super()._wake_parked(broker, pid)
        state = self.sessions.get(broker.broker_id)
        for token, parked in state.parked.items() if state is not None else ():
            if pid in parked.pids:  # woken as the purgatory wakes it: on the loop's next turn
                self._timer(broker, self.now, SESSION_WAKE, token=token)

    # -- a follower's fetchers -------------------------------------------------------------
    def _followed_from(self, broker: SimBroker, leader: int) -> dict[int, SessionFetching]:
        return {
            pid: f
            for pid, f in broker.fetching.items()
            if f.leader == leader and isinstance(f, SessionFetching)
        }

    def _fetch_from(self, broker: SimBroker, leader: int) -> None:
        """broker/replica_fetcher.py's loop: one request for every partition followed from
        ``leader`` that is not resting, in the fetcher's session."""
        fetchers = self.sessions[broker.broker_id].fetchers
        fetcher = fetchers.setdefault(leader, Fetcher())
        if fetcher.in_flight:
            return  # the answer's handling fetches again, with what changed meanwhile
        followed = self._followed_from(broker, leader)
        if not followed:  # following nothing there: the connection, and the session, go
            del fetchers[leader]
            return
        for pid, f in followed.items():
            if f.rest_until and f.rest_until <= self.now:  # the rest is over
                f.rest_until = 0
                fetcher.dirty.add(pid)
        ready = {pid: f for pid, f in followed.items() if not f.rest_until}
        if not ready:
            until = min(f.rest_until for f in followed.values())
            self._timer(broker, until, FETCHER, leader)
            return
        if self.now - fetcher.positions_read_ms >= POSITION_REFRESH_MS:
            fetcher.positions_read_ms = self.now
            for f in followed.values():
                f.position = None
            fetcher.dirty.update(followed)
        fetcher.requests += 1
        if fetcher.client.full_next:
            wanted = {(TOPIC, pid): self._position(broker, pid, f) for pid, f in ready.items()}
            request = fetcher.client.build(wanted)
        else:  # from what changed alone, as the real fetcher builds it
            changed, gone = {}, []
            for pid in fetcher.dirty:
                wanted_now = ready.get(pid)
                if wanted_now is None:
                    gone.append((TOPIC, pid))
                else:
                    changed[TOPIC, pid] = self._position(broker, pid, wanted_now)
            request = fetcher.client.build_changes(changed, gone)
        fetcher.dirty.clear()
        req_id = self._next_id()
        fetcher.in_flight, fetcher.asked = req_id, fetcher.requests
        fetch = SessionFetchReq(
            broker.broker_id,
            req_id,
            request.session_id,
            request.epoch,
            tuple((key[1], position) for key, position in request.partitions.items()),
            tuple(key[1] for key in request.forgotten),
            broker.broker_epoch,
        )
        self._send_from(broker, leader, fetch)
        timeout = self.config.fetch_wait_max_ms + self.config.request_timeout_ms
        self._timer(broker, self.now + timeout, FETCHER_TIMEOUT, leader, req_id)

    def _position(self, broker: SimBroker, pid: int, fetching: SessionFetching) -> FetchPosition:
        if fetching.position is None:
            partition = broker.partitions[pid]
            offset, last_epoch = partition.fetch_position()
            fetching.position = FetchPosition(
                offset,
                last_epoch,
                fetching.leader_epoch,
                partition.log_start_offset,
                self.config.fetch_max_bytes,
            )
        return fetching.position

    def _fetcher_timed_out(self, broker: SimBroker, leader: int, req_id: int) -> None:
        """No answer: the real fetcher drops the connection (its next request is a full
        one) and tries again after a backoff."""
        fetcher = self.sessions[broker.broker_id].fetchers.get(leader)
        if fetcher is not None and fetcher.in_flight == req_id:
            fetcher.in_flight = 0
            fetcher.client.reset()
            self._timer(broker, self.now + self.config.fetch_backoff_ms, FETCHER, leader)

    def _on_session_answer(self, broker: SimBroker, leader: int, answer: SessionFetchResp) -> None:
        """ReplicaFetcher._handle: a partition left out of the answer has no news."""
        fetcher = self.sessions[broker.broker_id].fetchers.get(leader)
        if fetcher is None or fetcher.in_flight != answer.req_id:
            return  # timed out: its fate was reset with the session
        fetcher.in_flight = 0
        if not fetcher.client.handle_response(answer.error, answer.session_id):
            if answer.error not in SESSION_ERRORS:
                for pid, asked in self._followed_from(broker, leader).items():
                    if not asked.rest_until:
                        self._rest(broker, pid)
            self._timer(broker, self.now, FETCHER, leader)
            return
        for part in answer.answers:
            fetching = broker.fetching.get(part.pid)
            if (
                not isinstance(fetching, SessionFetching)
                or fetching.since >= fetcher.asked
                or fetching.rest_until
            ):
                continue  # unfollowed, followed anew or resting since the request
            partition = broker.partitions[part.pid]
            if not (
                partition.role is Role.FOLLOWER
                and partition.leader_id == leader
                and partition.leader_epoch == fetching.leader_epoch
            ):
                continue  # a newer leader or epoch in the image: dropped
            fetching.position = None
            fetcher.dirty.add(part.pid)
            if self._apply_answer(broker, part.pid, partition, part):
                self._rest(broker, part.pid)
        self._timer(broker, self.now, FETCHER, leader)

    def _rest(self, broker: SimBroker, pid: int) -> None:
        fetching = broker.fetching.get(pid)
        if isinstance(fetching, SessionFetching):
            fetching.rest_until = self.now + max(1, self.config.fetch_backoff_ms)
            fetching.position = None
            fetcher = self.sessions[broker.broker_id].fetchers.get(fetching.leader)
            if fetcher is not None:
                fetcher.dirty.add(pid)

    # -- a leader's side -------------------------------------------------------------------
    def _serve_session_fetch(self, broker: SimBroker, msg: Msg, req: SessionFetchReq) -> None:
        """broker/handlers/fetch.py with the broker's session cache."""
        session_request = SessionRequest(
            req.session_id,
            req.epoch,
            req.replica,
            {(TOPIC, pid): position for pid, position in req.partitions},
            [(TOPIC, pid) for pid in req.forgotten],
        )
        context = self.sessions[broker.broker_id].cache.begin(session_request, self.now)
        if context.error_code != ErrorCode.NONE:
            self._reply(msg, SessionFetchResp(req.req_id, context.error_code, NO_SESSION, ()))
            return
        parked = ParkedFetch(msg, req, context, frozenset())
        self._answer_session_fetch(broker, parked, may_park=True)

    def _answer_session_fetch(self, broker: SimBroker, fetch: ParkedFetch, may_park: bool) -> None:
        """Read what the context says (of an incremental fetch, what its quiet partitions
        leave), park when there is nothing, else answer what the session lets out."""
        req, context = fetch.request, fetch.context
        if isinstance(context, IncrementalFetch):
            context.parked(None)
            context.skip_quiet(self._quiet_for(broker, req.replica))
            self.result.quiet_skips += len(context.session.partitions) - len(context.partitions)
        read = [self._session_read(broker, req, key[1], pos) for key, pos in context.partitions]
        nothing = all(not a.records and not a.error and a.diverging is None for a, _ in read)
        watching = isinstance(context, IncrementalFetch) and context.watching
        if nothing and may_park and (read or watching):
            token = self._next_id()
            pids = frozenset(key[1] for key, _ in context.partitions)
            self.sessions[broker.broker_id].parked[token] = ParkedFetch(
                fetch.msg, req, context, pids
            )
            if isinstance(context, IncrementalFetch) and watching:
                context.parked(lambda key, appended: self._poked(broker, token, appended))
            wait = self.now + self.config.fetch_wait_max_ms
            self._timer(broker, wait, SESSION_POLL_EXPIRE, token=token)
            return
        said = context.finish([news for _, news in read], self.now)
        if said.error_code != ErrorCode.NONE:
            answer = SessionFetchResp(req.req_id, said.error_code, said.session_id, ())
        else:
            parts = tuple(a for (a, _), go in zip(read, said.include, strict=True) if go)
            answer = SessionFetchResp(req.req_id, ErrorCode.NONE, said.session_id, parts)
        self._reply(fetch.msg, answer)

    def _session_read(
        self, broker: SimBroker, req: SessionFetchReq, pid: int, position: FetchPosition
    ) -> tuple[FetchResp, News]:
        """One partition read as the base reads it, with the news it tells the session."""
        answer = self._read_partition(
            broker,
            req.replica,
            req.req_id,
            pid,
            position.fetch_offset,
            position.last_fetched_epoch,
            position.current_leader_epoch,
            position.max_bytes,
            req.broker_epoch,
            position.log_start_offset,
        )
        partition = broker.partitions.get(pid)
        if answer.error != NO_ERROR or partition is None:
            news = News(0, answer.high_watermark, -1, answer.log_start, answer.error)
        else:
            news = News(
                len(answer.records),
                answer.high_watermark,
                partition.last_stable_offset,
                answer.log_start,
                NO_ERROR,
                answer.diverging is not None,
            )
        return answer, news

    def _poked(self, broker: SimBroker, token: int, appended: int) -> None:
        """A watched partition of a parked fetch's session changed (FetchPurgatory's poke):
        bytes appended or a leadership change wake it on the loop's next turn."""
        state = self.sessions.get(broker.broker_id)
        if appended != 0 and state is not None and token in state.parked:
            self._timer(broker, self.now, SESSION_WAKE, token=token)

    def _quiet_for(
        self, broker: SimBroker, replica: int
    ) -> Callable[[SessionKey, Any, QuietWatch], bool]:
        """broker/handlers/fetch.py's rule (``quiet_for_follower``), on this broker's
        partitions at the virtual time."""

        def quiet(key: SessionKey, heard: Any, watch: QuietWatch) -> bool:
            partition = broker.partitions.get(key[1])
            return partition is not None and quiet_for_follower(
                partition, replica, heard, watch, self.now
            )

        return quiet


def run_seed(
    seed: int,
    config: SimConfig | None = None,
    *,
    directory: Path | None = None,
    trace: bool = False,
) -> SimResult:
    """``replication.testing.run_seed`` with fetch sessions (``config.fetch_sessions``)."""
    return run_base_seed(
        seed,
        config or SimConfig(fetch_sessions=True),
        directory=directory,
        trace=trace,
        simulation=SessionSimulation,
    )
