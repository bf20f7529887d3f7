"""Fetch: consumers and follower replicas read record batches.

How this works. Each asked-for partition is read as a zero-copy file slice bounded by the
high watermark (consumers; the log end for a replica fetch), within the partition's limit
and what is left of the response's; the first partition with data returns at least one whole
batch even past the limits (KIP-74), so a batch larger than the limits cannot stall a client.
The slices go to the network layer untouched and leave by ``sendfile``. If fewer than
``min_bytes`` are ready and the client will wait, the request parks in the fetch purgatory
until enough bytes arrive on its partitions, a partition changes leader, or ``max_wait_ms``
(capped by ``fetch_max_wait_ms``) passes; then every partition is read again.

A consumer's fetch that names its last fetched epoch (v12+) is answered a diverging epoch
instead of records when that epoch does not end at or after its fetch offset here, as a
follower's is (KIP-320; Kafka's Partition.readRecords checks every fetch that sets it).

A fetch with a replica id (``replica_id >= 0``) is a follower's (Kafka's inter-broker
protocol): it reads to the log end, reports the follower's position (its fetch offset), which
may move the high watermark and the ISR (``Partition.read_for_follower``), and answers a
diverging epoch instead of records when the follower's last fetched epoch disagrees with the
leader's log. Follower fetches park in their own purgatory, woken by every leader append
rather than by the high watermark, and long-poll briefly while this broker awaits the
follower for a partition newly led here that the fetch does not hold yet
(``broker.awaited_followers``).

Fetch sessions (KIP-227, ``broker.fetch_session``): the broker's session cache says, from the
request's session id and epoch, which partitions to read (for an incremental request, every
partition of its session, named or not, so a follower's position is reported for its idle
partitions too) and, once they are read, which answers go out (an incremental answer carries
only partitions with news) and with which session id. A session error (an unknown session,
a wrong epoch) is answered at the top level with no partitions.

read_committed reads to the last stable offset, which equals the high watermark: runnel has
no transactions.

Versions 13-16 (KIP-516, -903, -951). From v13 a fetch names its topics by id, and its
session (if any) holds partitions by (topic id, partition): each id is looked up in the
broker's image whenever the partition is read, so a partition of an id the image does not
have is answered UNKNOWN_TOPIC_ID (at once, as any error) and stays in the session,
answered so at every fetch, until the image has that topic (the client may have heard of a
new topic first) or the client forgets it; a topic deleted and created again under its name
is another id, so the old id's partitions are UNKNOWN_TOPIC_ID from then on and never get
the new topic's records, not even when the deletion comes while a fetch waits. The answer
names topics by the ids asked. A session keeps the kind of names it was opened with:
continuing a session by names with ids, or the reverse, is FETCH_SESSION_TOPIC_ID_ERROR
(Kafka's rule). From v15 a follower's id and broker epoch are in ``replica_state``: the
epoch is noted with the follower's position, and the follower is proposed into the ISR only
as the incarnation the metadata names (KIP-903, ``broker.alter_partition``); runnel's own
followers fetch with v15. From v16 an answer that names partitions' current leaders (errors
NOT_LEADER_OR_FOLLOWER and FENCED_LEADER_EPOCH) lists those brokers in ``node_endpoints``,
as Metadata would, so the client can move without asking Metadata (KIP-951).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from broker.awaited_followers import SHORT_POLL_MS
from broker.context import BrokerContext
from broker.fetch_session import (
    FINAL_EPOCH,
    NO_SESSION,
    FetchContext,
    FetchPosition,
    IncrementalFetch,
    News,
    PartitionKey,
    SessionKey,
    SessionRequest,
)
from broker.handlers.common import (
    Reply,
    Response,
    current_leader,
    error_code_of,
    leader_endpoints,
    lookup_partition,
    then,
)
from broker.protocol import ErrorCode, RequestHeader
from broker.purgatory import WakeReason
from controller.image import MetadataImage
from replication.errors import ReplicationError
from replication.partition import Partition, QuietWatch
from storage.segment import FileSlice

__all__ = ["fetch", "quiet_for_follower"]

READ_COMMITTED = 1
TOPIC_IDS_FROM = 13  # topics named by id (KIP-516)
REPLICA_STATE_FROM = 15  # a follower's id in replica_state (KIP-903)
NODE_ENDPOINTS_FROM = 16  # the current leaders' endpoints (KIP-951)
_LEADER_HINT_ERRORS = (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH)


@dataclass(slots=True)
class _Asked:
    """What a request asks, read once when it arrives (a long poll reads the same again)."""

    version: int
    session: SessionRequest  # its replica_id >= 0: a follower's fetch; by_ids: v13+
    replica_epoch: int  # v15+: the follower's broker epoch (-1: not said)
    ids: dict[bytes, uuid.UUID]  # v13+: the topic ids the request names, by their bytes


@dataclass(slots=True)
class _Wanted:
    key: SessionKey  # (topic name or, by ids, topic id; partition)
    name: PartitionKey | None  # by name; None: a topic id the image does not have
    position: FetchPosition
    replica: Partition | int  # the replica here, or the error code saying why none


@dataclass(slots=True)
class _Plan:
    wanted: list[_Wanted]
    keys: list[PartitionKey]  # what a long poll waits on, besides the session's watches
    max_bytes: int
    replica_id: int  # >= 0: a follower's fetch
    replica_epoch: int  # the follower's broker epoch, if it said (v15+), else -1
    committed: bool
    watching: bool  # a follower's session watches quiet partitions: a long poll waits on them


def _asked(request: Any, version: int) -> _Asked:
    """The request's partitions, by topic name (v13+: by topic id)."""
    by_ids = version >= TOPIC_IDS_FROM
    partitions: dict[SessionKey, FetchPosition] = {}
    ids: dict[bytes, uuid.UUID] = {}
    for topic in request.topics:
        if by_ids:
            topic_id = topic.topic_id
            named: str | bytes = topic_id.bytes
            ids[topic_id.bytes] = topic_id
        else:
            named = topic.topic
        for p in topic.partitions:
            partitions[named, p.partition] = FetchPosition(
                p.fetch_offset,
                getattr(p, "last_fetched_epoch", -1),
                getattr(p, "current_leader_epoch", -1),
                getattr(p, "log_start_offset", -1),
                p.partition_max_bytes,
            )
    forgotten: list[SessionKey] = []
    for topic in getattr(request, "forgotten_topics_data", None) or ():
        named = topic.topic_id.bytes if by_ids else topic.topic
        forgotten += [(named, index) for index in topic.partitions]
    if version >= REPLICA_STATE_FROM:
        replica_id, replica_epoch = (
            request.replica_state.replica_id,
            request.replica_state.replica_epoch,
        )
    else:
        replica_id, replica_epoch = request.replica_id, -1
    session_id = getattr(request, "session_id", NO_SESSION)
    epoch = getattr(request, "session_epoch", FINAL_EPOCH)
    session = SessionRequest(session_id, epoch, replica_id, partitions, forgotten, by_ids)
    return _Asked(version, session, replica_epoch, ids)


def _names(image: MetadataImage) -> Callable[[SessionKey], PartitionKey | None]:
    """The partition named by a session key of a fetch by ids, by its topic's name in
    ``image`` now (None: the image has no topic of that id, deleted or not known yet)."""
    topics = image.topics

    def name(key: SessionKey) -> PartitionKey | None:
        topic_id = key[0]
        found = topics.get(topic_id) if isinstance(topic_id, bytes) else None
        return None if found is None else (found.name, key[1])

    return name


def _plan(context: BrokerContext, request: Any, asked: _Asked, session: FetchContext) -> _Plan:
    """What to read. Of a follower's incremental fetch, only partitions with news: see
    ``_quiet_for``."""
    image = context.image()
    watching = False
    replica_id = asked.session.replica_id
    name = _names(image) if asked.session.by_ids else None
    if isinstance(session, IncrementalFetch) and replica_id >= 0:
        session.skip_quiet(_quiet_for(context, replica_id, name))
        watching = session.watching
    wanted: list[_Wanted] = []
    if name is None:  # by names: the session's keys are the partitions' names
        for key, position in session.partitions:
            named = cast(PartitionKey, key)
            found = lookup_partition(context, image, named[0], named[1])
            wanted.append(_Wanted(key, named, position, found))
        if isinstance(session, IncrementalFetch):
            keys = cast(list[PartitionKey], session.keys)
        else:
            keys = [cast(PartitionKey, w.key) for w in wanted]
    else:
        for key, position in session.partitions:
            by_id = name(key)
            if by_id is None:
                wanted.append(_Wanted(key, None, position, ErrorCode.UNKNOWN_TOPIC_ID))
            else:
                found = lookup_partition(context, image, by_id[0], by_id[1])
                wanted.append(_Wanted(key, by_id, position, found))
        keys = [w.name for w in wanted if w.name is not None]
    max_bytes = min(getattr(request, "max_bytes", 2**31 - 1), context.settings.fetch_max_bytes)
    committed = getattr(request, "isolation_level", 0) == READ_COMMITTED
    return _Plan(wanted, keys, max_bytes, replica_id, asked.replica_epoch, committed, watching)


def _quiet_for(
    context: BrokerContext,
    replica_id: int,
    name: Callable[[SessionKey], PartitionKey | None] | None,
) -> Callable[[SessionKey, Any, QuietWatch], bool]:
    """``quiet_for_follower`` of each partition, as ``IncrementalFetch.skip_quiet`` asks
    (``name``: a session by ids, whose keys it names)."""
    get, now_ms = context.replicas.get, context.replicas.clock_ms()

    def quiet(key: SessionKey, heard: Any, watch: QuietWatch) -> bool:
        named = cast(PartitionKey, key) if name is None else name(key)
        if named is None:
            return False
        replica = get(named[0], named[1])
        return replica is not None and quiet_for_follower(replica, replica_id, heard, watch, now_ms)

    return quiet


def quiet_for_follower(
    replica: Partition, replica_id: int, heard: Any, watch: QuietWatch, now_ms: int
) -> bool:
    """Whether a partition of a follower's incremental fetch has no news for it: the follower
    already heard its offsets (``heard``: what its session holds) and is caught up with
    nothing to move (noted as a read would; ``Partition.read_for_quiet_follower``). Such a
    partition, usually most of a session, is neither read nor answered, and the session
    watches it: its next fetches skip it until the partition changes
    (``broker.fetch_session``), so a fetch costs what changed, not the whole session
    (``bench.idle_partitions``). The replication simulation applies the same rule."""
    position = heard.position
    return (
        heard.high_watermark == replica.high_watermark
        and heard.last_stable_offset == replica.last_stable_offset
        and heard.log_start_offset == replica.log_start_offset
        and replica.read_for_quiet_follower(
            replica_id,
            position.fetch_offset,
            last_fetched_epoch=position.last_fetched_epoch,
            current_leader_epoch=position.current_leader_epoch,
            now_ms=now_ms,
            watch=watch,
            log_start_offset=position.log_start_offset,
        )
    )


def _failed(index: int, code: int) -> dict[str, Any]:
    return {
        "partition_index": index,
        "error_code": code,
        "high_watermark": -1,
        "last_stable_offset": -1,
        "log_start_offset": -1,
        "records": b"",
    }


def _error(image: MetadataImage, w: _Wanted, code: int) -> dict[str, Any]:
    out = _failed(w.key[1], code)
    if code in _LEADER_HINT_ERRORS and w.name is not None:
        leader = current_leader(image, *w.name)
        if leader is not None:
            out["current_leader"] = leader
    return out


def _read(plan: _Plan, image: MetadataImage, now_ms: int) -> tuple[list[dict[str, Any]], int, bool]:
    """Every partition's answer (in ``plan.wanted``'s order), the bytes they carry, and
    whether one must be answered at once (an error, or a diverging epoch)."""
    answers = []
    left, total, urgent = plan.max_bytes, 0, False
    for w in plan.wanted:
        replica = w.replica
        if not isinstance(replica, Partition):
            answer = _error(image, w, replica)
        else:
            max_bytes = min(w.position.max_bytes, left)
            try:
                answer = _read_one(plan, w, replica, max_bytes, total == 0, now_ms)
            except Exception as e:  # mapped; a bug is logged by error_code_of
                answer = _error(image, w, error_code_of(e))
                if isinstance(e, ReplicationError) and e.code == ErrorCode.OFFSET_OUT_OF_RANGE:
                    answer["high_watermark"] = replica.high_watermark
                    answer["log_start_offset"] = replica.log_start_offset
            else:
                size = _records_bytes(answer)
                total += size
                left = max(0, left - size)
        urgent = urgent or answer["error_code"] != ErrorCode.NONE or "diverging_epoch" in answer
        answers.append(answer)
    return answers, total, urgent


def _records_bytes(answer: dict[str, Any]) -> int:
    records = answer["records"]
    return records.length if isinstance(records, FileSlice) else len(records)


def _read_one(
    plan: _Plan, w: _Wanted, replica: Partition, max_bytes: int, first: bool, now_ms: int
) -> dict[str, Any]:
    diverging = None
    position = w.position
    if plan.replica_id >= 0:
        found = replica.read_for_follower(
            plan.replica_id,
            position.fetch_offset,
            max_bytes,
            last_fetched_epoch=position.last_fetched_epoch,
            current_leader_epoch=position.current_leader_epoch,
            now_ms=now_ms,
            min_one_batch=first,
            broker_epoch=plan.replica_epoch,
            log_start_offset=position.log_start_offset,
        )
        data, diverging = found.data, found.diverging
    else:
        if position.last_fetched_epoch >= 0:  # a consumer checks for truncation too (v12+)
            diverging = replica.diverging_epoch(
                position.fetch_offset,
                position.last_fetched_epoch,
                current_leader_epoch=position.current_leader_epoch,
            )
        data = None
        if diverging is None:
            data = replica.read(
                position.fetch_offset,
                max_bytes,
                current_leader_epoch=position.current_leader_epoch,
                min_one_batch=first,
            )
    answer: dict[str, Any] = {
        "partition_index": w.key[1],
        "error_code": ErrorCode.NONE,
        # The replica's, not the read's: a follower's fetch may just have moved it.
        "high_watermark": replica.high_watermark,
        "last_stable_offset": replica.last_stable_offset,
        "log_start_offset": replica.log_start_offset,
        "aborted_transactions": [] if plan.committed else None,
        "preferred_read_replica": -1,
        "records": data.slice if data is not None and data.slice is not None else b"",
    }
    if diverging is not None:
        answer["diverging_epoch"] = {"epoch": diverging[0], "end_offset": diverging[1]}
    return answer


def fetch(context: BrokerContext, header: RequestHeader, request: Any) -> Reply:
    clock_ms = context.replicas.clock_ms
    asked = _asked(request, header.api_version)
    session = context.fetch_sessions.begin(asked.session, clock_ms())
    if session.error_code != ErrorCode.NONE:
        return _refused(session.error_code, NO_SESSION)
    plan = _plan(context, request, asked, session)
    answers, total, urgent = _read(plan, context.image(), clock_ms())
    wait_ms = min(request.max_wait_ms, context.settings.fetch_max_wait_ms)
    if plan.replica_id >= 0 and wait_ms > SHORT_POLL_MS and _awaited(context, plan, session):
        wait_ms = SHORT_POLL_MS
    if total >= request.min_bytes or wait_ms <= 0 or urgent or not (plan.keys or plan.watching):
        return _response(context, asked, session, plan, answers)
    # Parked now, not when the coroutine first runs: an append in between must wake it.
    parked = _park(context, session, plan, request.min_bytes - total, wait_ms)
    return _long_poll(context, request, asked, session, plan, parked)


def _awaited(context: BrokerContext, plan: _Plan, session: FetchContext) -> bool:
    """Whether this follower is awaited for a partition its fetch does not hold."""
    if isinstance(session, IncrementalFetch):
        if not session.session.by_ids:
            return context.replicas.awaited.short_poll(plan.replica_id, session.holds)
        image = context.image()

        def held(key: PartitionKey) -> bool:  # by the topic's id now
            found = image.topic_by_name(key[0])
            return found is not None and session.holds((found.topic_id, key[1]))

        return context.replicas.awaited.short_poll(plan.replica_id, held)
    named: set[PartitionKey | None] | None = None

    def holds(key: PartitionKey) -> bool:
        nonlocal named
        if named is None:  # built only if this follower is awaited at all
            named = {w.name for w in plan.wanted}
        return key in named

    return context.replicas.awaited.short_poll(plan.replica_id, holds)


def _park(
    context: BrokerContext, session: FetchContext, plan: _Plan, min_bytes: int, wait_ms: int
) -> asyncio.Future[WakeReason]:
    purgatory = context.purgatory
    if plan.replica_id >= 0 and context.replicas.replica_purgatory is not None:
        purgatory = context.replicas.replica_purgatory
    # The session's watched partitions wake the wait through the session, not by key.
    poke = session.parked if plan.watching and isinstance(session, IncrementalFetch) else None
    owner = plan.replica_id if plan.replica_id >= 0 else None
    return purgatory.park(plan.keys, min_bytes, wait_ms, poke=poke, owner=owner)


def _long_poll(
    context: BrokerContext,
    request: Any,
    asked: _Asked,
    session: FetchContext,
    plan: _Plan,
    parked: asyncio.Future[WakeReason],
) -> asyncio.Future[Response]:
    """The answer once ``parked`` is done: a future, not a coroutine, so that a connection
    closed before it ran still unparks the fetch (``then``)."""

    def answer(reason: WakeReason) -> Response:
        # Look the replicas up again: one may have moved or gone while the request waited.
        # Of the watched partitions, only those that changed meanwhile are looked at.
        again = _plan(context, request, asked, session)
        answers, _, _ = _read(again, context.image(), context.replicas.clock_ms())
        return _response(context, asked, session, again, answers)

    return then(parked, answer)


def _response(
    context: BrokerContext,
    asked: _Asked,
    session: FetchContext,
    plan: _Plan,
    answers: list[dict[str, Any]],
) -> dict[str, Any]:
    said = session.finish([_news(answer) for answer in answers], context.replicas.clock_ms())
    if said.error_code != ErrorCode.NONE:  # overtaken by the session's next request
        return _refused(said.error_code, said.session_id)
    by_topic: dict[str | bytes, list[dict[str, Any]]] = {}
    for w, answer, include in zip(plan.wanted, answers, said.include, strict=True):
        if include:
            by_topic.setdefault(w.key[0], []).append(answer)
    responses: list[dict[str, Any]]
    if asked.session.by_ids:
        ids = asked.ids  # the request's own, else (a session's partition not named) made anew
        responses = [
            {"topic_id": ids.get(t) or uuid.UUID(bytes=t), "partitions": ps}  # type: ignore[arg-type]
            for t, ps in by_topic.items()
        ]
    else:
        responses = [{"topic": t, "partitions": parts} for t, parts in by_topic.items()]
    body: dict[str, Any] = {
        "throttle_time_ms": 0,
        "error_code": ErrorCode.NONE,
        "session_id": said.session_id,
        "responses": responses,
    }
    if asked.version >= NODE_ENDPOINTS_FROM:
        leaders = {
            answer["current_leader"]["leader_id"]
            for topic in responses
            for answer in topic["partitions"]
            if answer["error_code"] in _LEADER_HINT_ERRORS and "current_leader" in answer
        }
        body["node_endpoints"] = leader_endpoints(
            context.image(), leaders, context.settings.listener_name
        )
    return body


def _refused(code: int, session_id: int) -> dict[str, Any]:
    """A session error: no partition is answered."""
    return {"throttle_time_ms": 0, "error_code": code, "session_id": session_id, "responses": []}


def _news(answer: dict[str, Any]) -> News:
    return News(
        _records_bytes(answer),
        answer["high_watermark"],
        answer["last_stable_offset"],
        answer["log_start_offset"],
        answer["error_code"],
        "diverging_epoch" in answer,
    )
