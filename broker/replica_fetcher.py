"""Follower fetchers: one per leader broker, each fetching every partition this broker
follows from that leader in one Kafka Fetch request.

How this works. ``ReplicaFetcherManager.follow(partition)`` (called by the replica manager
whenever a partition here becomes a follower, or its leader or leader epoch changes) puts
the partition under the ``ReplicaFetcher`` of its leader, starting that fetcher's task if it
is new; ``unfollow`` takes it out (it became leader, or stopped). A fetcher's loop:

1. builds one Fetch v15 request with ``replica_state`` = this broker's id and broker epoch
   (KIP-903: the leader takes it into the ISR only as the incarnation its metadata names),
   topics named by id (a topic created again under its name is another id: the partition
   is named anew by it and the old id's forgotten) and, per partition, the
   fetch offset (its log end), the epoch of its last batch (``last_fetched_epoch``) and the
   leader epoch it follows (``current_leader_epoch``: the leader fences a stale one), within
   a fetch session (KIP-227, ``broker.fetch_session_client``): the first request is a full
   one that opens the session; each later one is incremental, naming only the partitions
   that are new or whose position changed, and forgetting those no longer fetched (moved to
   another leader, or resting after an error). The leader still fetches every partition of
   the session, so idle ones keep reporting this follower's position. A position is read
   from the log again only after an answer for its partition was applied or the partition
   rested, and at least every ``POSITION_REFRESH_S`` (the log start moves by retention).
   An incremental request looks only at the partitions that may have changed since the
   last one (followed, unfollowed, an answer applied, a rest begun or ended, all of them at
   a refresh; ``FetchSessionClient.build_changes``), so it costs what changed, not how many
   partitions are followed; a full one looks at every partition;
2. sends it over its own connection to the leader's listener (the address from the metadata
   image) and waits: the leader long-polls up to ``replica_fetch_wait_max_ms``, answering as
   soon as it appends;
3. handles each partition's answer (an incremental answer leaves out the partitions with no
   news), first checking that the partition still follows the same leader at the same epoch
   (an answer for an older epoch is dropped: the follower side of the fencing):

   ``replication.follower.apply_fetch_answer`` does the rest: records are appended verbatim
   with the leader's HW and log start; a diverging epoch truncates (never to a stale HW:
   KIP-101/279) and the next fetch carries the new last epoch; OFFSET_OUT_OF_RANGE restarts
   at the leader's log start or truncates to its HW. An answer saying that the two brokers'
   metadata disagree (NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH,
   UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_ID) rests the partition briefly:
   ``METADATA_REST_FIRST_S``, doubling with each such answer in a row up to
   ``replica_fetch_backoff_ms``. If this broker is the one behind, its metadata image brings
   the new leader or epoch and following anew ends the rest; but after an election the new
   leader is often the one behind (by the milliseconds until it applies the same record: it
   answers UNKNOWN_LEADER_EPOCH), and nothing would end a full rest early, so acks=all
   writes to the new leader stalled for the whole backoff (a second by default) in about a
   third of the benchmark's failovers. Any other error and a storage error rest it for
   ``replica_fetch_backoff_ms``. While a partition rests, a request waits at most until its
   rest ends (``max_wait_ms``), so a long poll on the others does not keep it waiting.
4. if the answer moved a partition's log start up (the leader's DeleteRecords or
   retention), has it made durable (``persist_log_starts``: the data directories'
   checkpoints) before the next request says it: the leader counts that towards a
   DeleteRecords' answer.

A session error in the answer (an unknown session, a wrong epoch) makes the next request a
full one, sent at once; so does a connection error, which also closes the connection: the
fetcher reconnects after a backoff that doubles up to ``MAX_RECONNECT_BACKOFF_S``. Everything
is bounded: the response size (``replica_fetch_response_max_bytes``,
``replica_fetch_max_bytes`` per partition) and every wait (connect, response).

Concurrency: asyncio, the broker's event loop; partitions are only touched on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

from broker.connection import Chunk, FrameReader, FrameSizeError
from broker.fetch_session import FetchPosition
from broker.fetch_session_client import FetchSessionClient
from broker.protocol import (
    ApiKey,
    ErrorCode,
    ProtocolError,
    decode_response,
    encode_request,
)
from replication.errors import ReplicationError
from replication.follower import FetchAnswer, Outcome, apply_fetch_answer
from replication.partition import Partition, PartitionKey, Role

__all__ = [
    "POSITION_REFRESH_S",
    "SESSION_ERRORS",
    "FetcherConfig",
    "ReplicaFetcher",
    "ReplicaFetcherManager",
]

_log = logging.getLogger(__name__)

FETCH_VERSION = 15  # topics by id (13), this broker's epoch in replica_state (15)
CONNECT_TIMEOUT_S = 5.0
MIN_RECONNECT_BACKOFF_S = 0.05
MAX_RECONNECT_BACKOFF_S = 1.0
MAX_RESPONSE_SLACK_BYTES = 1 << 20  # the answer's header and framing beyond the records
PARTITION_ANSWER_BYTES = 64  # a partition's fields in an answer, its records aside
POSITION_REFRESH_S = 1.0  # every partition's position is read afresh at least this often
METADATA_REST_FIRST_S = 0.01  # the first rest after a metadata disagreement (module doc)
_READ_BUFFER_BYTES = 1 << 20  # answers up to half of it are read with others; bigger ones alone
SESSION_ERRORS = frozenset(  # the next request is a full one, sent at once
    {ErrorCode.FETCH_SESSION_ID_NOT_FOUND, ErrorCode.INVALID_FETCH_SESSION_EPOCH}
)
_METADATA_ERRORS = frozenset(  # the leader and this broker disagree on the partition's state
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.UNKNOWN_TOPIC_ID,
    }
)

AddressOf = Callable[[int], tuple[str, int] | None]  # broker id -> its listener, if known
BrokerEpoch = Callable[[], int]  # this broker's epoch from its registration (-1: none yet)
# Makes the log starts of these partitions durable (their data directories' checkpoints).
PersistLogStarts = Callable[[list[Partition]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class FetcherConfig:
    broker_id: int
    fetch_wait_max_ms: int = 500  # Kafka's replica.fetch.wait.max.ms
    fetch_max_bytes: int = 1_048_576  # per partition: replica.fetch.max.bytes
    fetch_response_max_bytes: int = 10_485_760  # replica.fetch.response.max.bytes
    fetch_backoff_ms: int = 1000  # replica.fetch.backoff.ms: a partition's rest after an error
    request_timeout_ms: int = 30_000  # beyond the wait, for the leader's answer
    # The largest batch a leader may hold (the brokers' socket_request_max_bytes): an answer
    # carries its first partition's first batch whole, however big (KIP-74).
    largest_batch_bytes: int = 104_857_600


@dataclass(slots=True)
class _Followed:
    partition: Partition
    leader_epoch: int  # the epoch it follows; an answer for another is dropped
    topic_id: uuid.UUID  # what requests name its topic by
    # The requests built before this one followed the partition: an answer to any of them
    # is not for it (it was followed anew since).
    since: int = 0
    # The position last sent, kept until an answer is applied or the partition rests: the
    # log end and last epoch change only then (``POSITION_REFRESH_S``: the log start also
    # moves by retention, behind the fetcher's back).
    position: FetchPosition | None = None
    # Metadata-disagreement answers in a row (each doubles the next rest), since the last
    # answer applied or since the partition was followed.
    disagreements: int = 0


class _Connection(asyncio.BufferedProtocol):
    """One Kafka connection to a leader, one request at a time. Answers are read straight
    into a ``FrameReader``'s memory (``recv_into``: no stream buffer copying each answer
    twice); an answer's records stay views of it, so its chunk is lent out until the next
    request, by when the fetcher has applied them."""

    def __init__(self, max_frame_bytes: int, keep_bytes: int | None = None) -> None:
        # One big answer's buffer is kept for the next, up to keep_bytes (default: the
        # limit): the usual big answer, not the rare one with a huge batch.
        keep = max_frame_bytes if keep_bytes is None else min(keep_bytes, max_frame_bytes)
        self._reader = FrameReader(max_frame_bytes, _READ_BUFFER_BYTES, keep)
        self._transport: asyncio.Transport | None = None
        self._ids = itertools.count(1)
        self._answer: asyncio.Future[memoryview] | None = None
        self._lent: Chunk | None = None  # the last answer's memory
        self._failure: BaseException | None = None  # the connection is unusable

    @classmethod
    async def open(
        cls, host: str, port: int, max_frame_bytes: int, keep_bytes: int | None = None
    ) -> _Connection:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            transport, connection = await loop.create_connection(
                lambda: cls(max_frame_bytes, keep_bytes), host, port
            )
        sock = transport.get_extra_info("socket")
        if sock is not None:  # small requests: never wait for Nagle
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection

    async def request(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        """The decoded answer (views of this connection's memory until the next request),
        within the connection's frame limit. One request at a time; requests are small, so
        no write buffer builds up."""
        FrameReader.release(self._lent)
        self._lent = None
        if self._failure is not None:
            raise self._failure
        transport = self._transport
        if transport is None or transport.is_closing():
            raise EOFError("the connection is closed")
        correlation_id = next(self._ids)
        for part in encode_request(api_key, version, correlation_id, "runnel-replica", body):
            if not isinstance(part, bytes | bytearray | memoryview):  # never in a request
                raise ProtocolError(f"a request cannot carry {part!r}")
            transport.write(part)
        self._answer = asyncio.get_running_loop().create_future()
        try:
            frame = await self._answer
        finally:
            self._answer = None
        got, value = decode_response(api_key, version, frame)
        if got != correlation_id:
            raise ProtocolError(f"correlation id {got}, expected {correlation_id}")
        return value

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    # -- asyncio.BufferedProtocol ----------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reader.recv_target()

    def buffer_updated(self, nbytes: int) -> None:
        self._reader.received(nbytes)
        try:
            item = self._reader.next_frame()
        except FrameSizeError as e:
            self._fail(ProtocolError(f"a {e.size}-byte response is over the {e.limit}-byte limit"))
            return
        if item is None:
            return
        frame, chunk = item
        answer = self._answer
        if answer is None or answer.done() or self._reader.buffered_bytes:
            self._fail(ProtocolError("the leader sent a response to no request"))
            return
        FrameReader.retain(chunk)
        self._lent = chunk
        answer.set_result(frame)

    def eof_received(self) -> bool:
        self._fail(EOFError("the leader closed the connection"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc if exc is not None else EOFError("the connection was closed"))

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
        answer = self._answer
        if answer is not None and not answer.done():
            answer.set_exception(exc)
        if self._transport is not None:
            self._transport.close()


class ReplicaFetcher:
    """Fetches the partitions this broker follows from one leader (module doc)."""

    def __init__(
        self,
        leader_id: int,
        config: FetcherConfig,
        address_of: AddressOf,
        broker_epoch: BrokerEpoch = lambda: -1,
        persist_log_starts: PersistLogStarts | None = None,
    ) -> None:
        self.leader_id = leader_id
        self.config = config
        self.address_of = address_of
        self.broker_epoch = broker_epoch
        self.persist_log_starts = persist_log_starts
        # Partitions whose log start the last answer moved up: made durable before the next
        # request says so (the leader may then answer a DeleteRecords, ``_persist_log_starts``).
        self._starts_moved: list[Partition] = []
        self.followed: dict[PartitionKey, _Followed] = {}
        self.fetches = 0
        self.full_fetches = 0  # of ``fetches``: the full ones (opening a session)
        self.session_errors = 0  # answers refusing the session (the next fetch is full)
        self.bytes_appended = 0
        self.truncations = 0
        self.metadata_rests = 0  # rests after a metadata disagreement with the leader
        self.session = FetchSessionClient()
        # What the next incremental request must look at: partitions followed or unfollowed,
        # whose answer was applied, that began or ended a rest (all of them at a refresh).
        # The others are fetched from the positions last sent, so a request costs what
        # changed, not how many partitions are followed.
        self._dirty: set[PartitionKey] = set()
        self._resting: dict[PartitionKey, float] = {}  # until when (monotonic seconds)
        # The topic id the leader's session holds each partition by, and the reverse: an
        # answer names (topic id, partition).
        self._sent_ids: dict[PartitionKey, uuid.UUID] = {}
        self._by_id: dict[tuple[uuid.UUID, int], PartitionKey] = {}
        self._requests = 0  # built so far
        self._wanted = asyncio.Event()
        self._connection: _Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._positions_read = 0.0  # monotonic seconds: when every position was read afresh

    def add(self, partition: Partition) -> None:
        key = partition.key
        topic_id = uuid.UUID(bytes=partition.topic_id)
        self.followed[key] = _Followed(partition, partition.leader_epoch, topic_id, self._requests)
        self._resting.pop(key, None)
        self._dirty.add(key)
        self._wanted.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"replica-fetcher-{self.leader_id}"
            )
            self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """The loop ends only by close() or a broken invariant: the latter said loudly."""
        if not task.cancelled() and task.exception() is not None:
            _log.critical(
                "replication from broker %d stopped: %r",
                self.leader_id,
                task.exception(),
                exc_info=task.exception(),
            )

    def remove(self, key: PartitionKey) -> None:
        if self.followed.pop(key, None) is not None:
            self._resting.pop(key, None)
            self._dirty.add(key)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            # A loop ended by a broken invariant was reported by _ended: the node still stops.
            with contextlib.suppress(asyncio.CancelledError, AssertionError):
                await self._task
            self._task = None
        self._disconnect()

    # -- the loop --------------------------------------------------------------------------
    async def _run(self) -> None:
        backoff_s = MIN_RECONNECT_BACKOFF_S
        while True:
            if self._starts_moved:  # before any request says them (whatever came before)
                await self._persist_log_starts()
            if not self._any_ready():
                await self._idle()
                continue
            try:
                connection = await self._connect()
                response = await self._fetch(connection)
            except (OSError, EOFError, TimeoutError, ProtocolError) as e:
                _log.info(
                    "fetch from broker %d failed: %r; again in %.2f s", self.leader_id, e, backoff_s
                )
            except AssertionError:  # a broken invariant (storage.errors): never caught
                raise
            except Exception:  # a bug: logged, and the fetcher goes on (it must not die)
                _log.exception(
                    "fetch from broker %d failed; again in %.2f s", self.leader_id, backoff_s
                )
            else:
                backoff_s = MIN_RECONNECT_BACKOFF_S
                self.fetches += 1
                try:
                    self._handle(response, self._requests)
                except AssertionError:
                    raise
                except Exception:
                    _log.exception("answer from broker %d not applied", self.leader_id)
                else:
                    continue
            self._disconnect()
            await asyncio.sleep(backoff_s)
            backoff_s = min(2 * backoff_s, MAX_RECONNECT_BACKOFF_S)

    async def _persist_log_starts(self) -> None:
        """Make the log starts the last answer moved durable before the next request says
        them: the leader counts what its followers say towards a DeleteRecords' answer, so a
        follower that crashed right after saying it must not come back with the old start
        (and, elected, serve the deleted records again). Rare: a start moves by DeleteRecords
        or by the leader's retention."""
        moved, self._starts_moved = self._starts_moved, []
        if self.persist_log_starts is not None:
            try:
                await self.persist_log_starts(moved)
            except Exception:  # a failed write took its directory offline: said there
                _log.exception("log starts from broker %d not checkpointed", self.leader_id)

    def _any_ready(self) -> bool:
        """Whether a partition is followed and not resting (rests that ended are over)."""
        resting = self._resting
        if resting:
            now = time.monotonic()
            for key in [k for k, until in resting.items() if until <= now]:
                del resting[key]
                self._dirty.add(key)
        return len(self.followed) > len(resting)

    async def _idle(self) -> None:
        """Nothing to fetch now: wait for a new partition or the end of the shortest rest.
        Following nothing from this leader any more, it lets the connection go (and with
        it the fetch session), as Kafka shuts idle fetcher threads down."""
        if not self.followed:
            self._disconnect()
        self._wanted.clear()
        rests = self._resting.values()
        timeout = max(0.0, min(rests) - time.monotonic()) if rests else None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wanted.wait(), timeout)

    async def _connect(self) -> _Connection:
        if self._connection is None:
            address = self.address_of(self.leader_id)
            if address is None:
                raise OSError(f"broker {self.leader_id} has no known address")
            keep = self.config.fetch_response_max_bytes + MAX_RESPONSE_SLACK_BYTES
            self._connection = await _Connection.open(*address, self.response_limit(), keep)
        return self._connection

    def response_limit(self) -> int:
        """The largest answer taken: the records' limit, one batch beyond it (KIP-74: the
        first partition with data gets a whole batch whatever its size), and each followed
        partition's fields. Set when the connection opens; an answer over it (more
        partitions followed since) fails that connection, and the next one allows for
        them."""
        config = self.config
        return (
            config.fetch_response_max_bytes
            + config.largest_batch_bytes
            + MAX_RESPONSE_SLACK_BYTES
            + PARTITION_ANSWER_BYTES * len(self.followed)
        )

    def _disconnect(self) -> None:
        self.session.reset()  # a new connection may reach a restarted leader
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    async def _fetch(self, connection: _Connection) -> Any:
        config = self.config
        now = time.monotonic()
        if now - self._positions_read >= POSITION_REFRESH_S:
            self._positions_read = now
            for followed in self.followed.values():
                followed.position = None
            self._dirty.update(self.followed)
        following, resting, read = self.followed, self._resting, self._position
        self._requests += 1
        if self.session.full_next:
            wanted = {k: read(f) for k, f in following.items() if k not in resting}
            request = self.session.build(wanted)
        else:
            changed, gone = {}, []
            for key in self._dirty:
                f = following.get(key)
                if f is None or key in resting:
                    gone.append(key)
                else:
                    changed[key] = read(f)
            request = self.session.build_changes(changed, gone)
            sent_ids = self._sent_ids
            for key, position in changed.items():
                sent_id = sent_ids.get(key)
                if sent_id is not None and sent_id != following[key].topic_id:
                    # The topic was created again under its name: named anew by its new id
                    # even where the position did not change (the old id's is forgotten).
                    request.partitions.setdefault(key, position)
        self._dirty.clear()
        forgotten = self._note_ids(request.partitions, request.forgotten, request.full)
        topics: dict[uuid.UUID, list[dict[str, Any]]] = {}
        for key, position in request.partitions.items():
            topics.setdefault(following[key].topic_id, []).append(
                {
                    "partition": key[1],
                    "current_leader_epoch": position.current_leader_epoch,
                    "fetch_offset": position.fetch_offset,
                    "last_fetched_epoch": position.last_fetched_epoch,
                    "log_start_offset": position.log_start_offset,
                    "partition_max_bytes": position.max_bytes,
                }
            )
        wait_ms = config.fetch_wait_max_ms
        if resting:  # answer by the time a rest ends, so that the partition is fetched then
            wait_ms = max(0, min(wait_ms, math.ceil((min(resting.values()) - now) * 1000)))
        body = {
            "replica_state": {"replica_id": config.broker_id, "replica_epoch": self.broker_epoch()},
            "max_wait_ms": wait_ms,
            "min_bytes": 1,
            "max_bytes": config.fetch_response_max_bytes,
            "isolation_level": 0,
            "session_id": request.session_id,
            "session_epoch": request.epoch,
            "topics": [{"topic_id": t, "partitions": ps} for t, ps in topics.items()],
            "forgotten_topics_data": [
                {"topic_id": t, "partitions": i} for t, i in forgotten.items()
            ],
            "rack_id": "",
        }
        self.full_fetches += request.full
        timeout_s = (config.fetch_wait_max_ms + config.request_timeout_ms) / 1000
        async with asyncio.timeout(timeout_s):
            return await connection.request(ApiKey.FETCH, FETCH_VERSION, body)

    def _note_ids(
        self, named: dict[PartitionKey, FetchPosition], gone: list[PartitionKey], full: bool
    ) -> dict[uuid.UUID, list[int]]:
        """Note the ids the request names its partitions by (what the leader's session will
        hold them by) and return what it forgets, by those ids: a partition whose topic was
        created again under its name (another id) forgets the old id's partition too, or the
        leader would answer that one UNKNOWN_TOPIC_ID at every fetch."""
        sent, by_id, following = self._sent_ids, self._by_id, self.followed
        if full:  # a new session: it holds what this request names, by these ids
            sent.clear()
            by_id.clear()
        forgotten: dict[uuid.UUID, list[int]] = {}
        for key in gone:
            old = sent.pop(key, None)
            if old is not None:
                del by_id[old, key[1]]
                forgotten.setdefault(old, []).append(key[1])
        for key in named:
            topic_id = following[key].topic_id
            old = sent.get(key)
            if old != topic_id:
                if old is not None:
                    del by_id[old, key[1]]
                    forgotten.setdefault(old, []).append(key[1])
                sent[key] = topic_id
                by_id[topic_id, key[1]] = key
        return forgotten

    def _position(self, followed: _Followed) -> FetchPosition:
        position = followed.position
        if position is None:
            partition = followed.partition
            fetch_offset, last_epoch = partition.fetch_position()
            position = followed.position = FetchPosition(
                fetch_offset,
                last_epoch,
                followed.leader_epoch,
                partition.log_start_offset,
                self.config.fetch_max_bytes,
            )
        return position

    # -- answers ---------------------------------------------------------------------------
    def _handle(self, response: Any, request: int) -> None:
        """The answer to request number ``request`` (an incremental answer may leave any
        partition out: no news)."""
        code = response.error_code
        if not self.session.handle_response(code, response.session_id):
            if code in SESSION_ERRORS:  # the next fetch is full, at once
                self.session_errors += 1
                _log.info("fetch from broker %d: session error %d", self.leader_id, code)
                return
            _log.warning("fetch from broker %d: error %d", self.leader_id, code)
            self._rest_all()
            return
        if not response.responses:
            return  # no news anywhere (an idle session's usual answer)
        by_id = self._by_id
        for topic in response.responses:
            topic_id = topic.topic_id
            for answer in topic.partitions:
                key = by_id.get((topic_id, answer.partition_index))
                if key is None:
                    continue  # forgotten since the request
                followed = self.followed.get(key)
                if followed is None or followed.since >= request or key in self._resting:
                    continue  # unfollowed, followed anew or resting since the request: dropped
                if not self._still_following(followed):
                    continue  # a newer leader or epoch in the image: dropped
                try:
                    self._apply(followed, answer)
                except ReplicationError as e:
                    _log.error("%r: follower append failed: %s", followed.partition, e)
                    self._rest(followed)

    def _still_following(self, followed: _Followed) -> bool:
        partition = followed.partition
        return (
            partition.role is Role.FOLLOWER
            and partition.leader_id == self.leader_id
            and partition.leader_epoch == followed.leader_epoch
        )

    def _apply(self, followed: _Followed, answer: Any) -> None:
        partition = followed.partition
        followed.position = None  # whatever the answer does, read the position afresh
        self._dirty.add(partition.key)
        diverging = getattr(answer, "diverging_epoch", None)
        if diverging is not None and diverging.epoch < 0 and diverging.end_offset < 0:
            diverging = None  # the tagged field's default: no divergence
        records = answer.records if answer.records is not None else b""
        start_before = partition.log_start_offset
        done = apply_fetch_answer(
            partition,
            FetchAnswer(
                answer.error_code,
                answer.high_watermark,
                answer.log_start_offset,
                memoryview(records),
                None if diverging is None else (diverging.epoch, diverging.end_offset),
            ),
        )
        if partition.log_start_offset > start_before:
            self._starts_moved.append(partition)
        if done.outcome is Outcome.REST:
            code = answer.error_code
            if code in _METADATA_ERRORS:
                longest_s = self.config.fetch_backoff_ms / 1000
                rest_s = min(METADATA_REST_FIRST_S * 2**followed.disagreements, longest_s)
                if followed.disagreements == 0:  # the first in a row: around elections
                    _log.info(
                        "%r: broker %d answered error %d (its metadata or ours is behind): "
                        "fetching it again in %.0f ms",
                        partition,
                        self.leader_id,
                        code,
                        rest_s * 1000,
                    )
                if rest_s < longest_s:
                    followed.disagreements += 1
                self.metadata_rests += 1
                self._rest(followed, rest_s)
            else:
                _log.warning("%r: fetch from broker %d: error %d", partition, self.leader_id, code)
                self._rest(followed)
            return
        followed.disagreements = 0
        if done.outcome is Outcome.APPENDED:
            self.bytes_appended += done.bytes_appended
            return
        self.truncations += 1
        _log.info(
            "%r: %s to follow leader %d (diverging %s, leader log start %d, HW %d): log end "
            "%d -> %d",
            partition,
            done.outcome.value,
            self.leader_id,
            diverging,
            answer.log_start_offset,
            answer.high_watermark,
            done.log_end_before,
            done.log_end_after,
        )

    def _rest(self, followed: _Followed, seconds: float | None = None) -> None:
        """Leave the partition out of requests for ``seconds`` (by default the fetch
        backoff)."""
        key = followed.partition.key
        if seconds is None:
            seconds = self.config.fetch_backoff_ms / 1000
        self._resting[key] = time.monotonic() + seconds
        self._dirty.add(key)
        followed.position = None

    def _rest_all(self) -> None:
        for key, followed in self.followed.items():
            if key not in self._resting:
                self._rest(followed)


class ReplicaFetcherManager:
    """The fetchers of one broker, by leader (module doc)."""

    def __init__(
        self,
        config: FetcherConfig,
        address_of: AddressOf,
        broker_epoch: BrokerEpoch = lambda: -1,
        persist_log_starts: PersistLogStarts | None = None,
    ) -> None:
        self.config = config
        self.address_of = address_of
        self.broker_epoch = broker_epoch
        self.persist_log_starts = persist_log_starts
        self.fetchers: dict[int, ReplicaFetcher] = {}
        self._leader_of: dict[PartitionKey, int] = {}

    def follow(self, partition: Partition) -> None:
        leader = partition.leader_id
        self.unfollow(partition)
        fetcher = self.fetchers.get(leader)
        if fetcher is None:
            fetcher = self.fetchers[leader] = ReplicaFetcher(
                leader, self.config, self.address_of, self.broker_epoch, self.persist_log_starts
            )
        fetcher.add(partition)
        self._leader_of[partition.key] = leader

    def unfollow(self, partition: Partition) -> None:
        leader = self._leader_of.pop(partition.key, None)
        if leader is not None:
            self.fetchers[leader].remove(partition.key)

    def following(self) -> int:
        return len(self._leader_of)

    async def close(self) -> None:
        fetchers, self.fetchers = list(self.fetchers.values()), {}
        self._leader_of.clear()
        for fetcher in fetchers:
            await fetcher.close()
