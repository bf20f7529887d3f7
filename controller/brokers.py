"""Broker lifecycle decisions of the active controller: registration, heartbeats and session
expiry (KIP-631).

How this works. Registration is durable (a RegisterBrokerRecord in the metadata log); a
broker's session is not: the active controller keeps a ``BrokerSession`` per broker in memory
(last heartbeat, reported metadata offset, and the offset the broker must reach to be
unfenced: the commit offset of its registration) and passes them in with the time. The
functions here read the image and the sessions and return an ``Outcome``; they never look at a
clock or change a session. After a heartbeat the controller records it (``touched``).

A broker's state is read from its registration, and a heartbeat moves it (Kafka's
BrokerHeartbeatManager)::

    state                 heartbeat                             next state (records)
    fenced                want_shutdown                         shut down now (none)
    fenced                want_fence, or not caught up          fenced (none)
    fenced                caught up                             unfenced (unfence + elections)
    any unfenced state    want_fence                            fenced (fence + elections);
                                                                shut down if want_shutdown
    unfenced              want_shutdown, leads nothing          shut down now (fence + elections)
    unfenced              want_shutdown, leads something        controlled shutdown (change
                                                                + leaders moved away)
    controlled shutdown   leads nothing (any heartbeat)         shut down now (fence + elections)
    controlled shutdown   still leads something                 controlled shutdown (moves again)

A fenced broker in controlled shutdown has been let go: every heartbeat answers
should_shut_down. A controlled shutdown cannot be called off; the broker registers afresh when
it starts again. The answer's flags describe the broker once the records are committed.

Expiry: an unfenced broker whose session's last heartbeat is more than the session timeout
ago is fenced (``fence_expired_brokers``). A broker without a session for its current
registration is never expired here: the controller must open a session (last heartbeat = now)
for every registered broker when it becomes active, or a dead broker stays unfenced.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from controller import elections
from controller.image import BrokerRegistration, MetadataDelta, MetadataImage
from controller.outcome import DecisionError, Outcome
from proto import controller_pb2 as cpb
from proto import metadata_pb2 as pb

__all__ = [
    "INCARNATION_ID_BYTES",
    "BrokerSession",
    "broker_heartbeat",
    "fence_expired_brokers",
    "register_broker",
]

INCARNATION_ID_BYTES = 16
_MAX_PORT = 65535

Records = list[pb.MetadataRecord]


@dataclass(frozen=True, slots=True)
class BrokerSession:
    """What the active controller remembers of a broker between heartbeats (not durable)."""

    broker_id: int
    broker_epoch: int
    last_heartbeat_ms: int
    metadata_offset: int  # the last one the broker reported; -1: none yet
    caught_up_offset: int  # the broker is unfenced once it has applied this offset

    def is_alive(self, now_ms: int, session_timeout_ms: int) -> bool:
        return now_ms - self.last_heartbeat_ms <= session_timeout_ms

    def touched(self, now_ms: int, metadata_offset: int) -> BrokerSession:
        """The session after a heartbeat at ``now_ms`` that reported ``metadata_offset``."""
        return replace(self, last_heartbeat_ms=now_ms, metadata_offset=metadata_offset)


# -- registration ------------------------------------------------------------------------------


def register_broker(
    image: MetadataImage,
    request: cpb.RegisterBrokerRequest,
    sessions: Mapping[int, BrokerSession],
    now_ms: int,
    session_timeout_ms: int,
    limit: int = elections.MAX_PARTITION_CHANGES,
) -> Outcome[cpb.RegisterBrokerResponse]:
    """A new registration (fenced, with the next broker epoch), or the current one again when
    the same process retries. A different process may take over an id only once the session
    of the one registered has expired; the previous incarnation then leaves every ISR and
    leadership first, as a fenced broker would (its log may have lost unflushed data). In
    more partitions than one decision may change (``limit``), it leaves the first ones and
    the answer is REQUEST_TIMED_OUT with nothing registered: the broker registers again, and
    each attempt moves the next ones, until none is left and the registration is written."""
    _validate_registration(request)
    broker_id = request.broker_id
    existing = image.brokers.get(broker_id)
    if existing is not None and existing.incarnation_id == request.incarnation_id:
        return _same_incarnation(existing, request)
    records: Records = []
    if existing is not None:
        session = _current_session(sessions, existing)
        if session is not None and session.is_alive(now_ms, session_timeout_ms):
            raise DecisionError(
                cpb.DUPLICATE_BROKER_REGISTRATION,
                f"broker {broker_id} is registered by another live process (incarnation "
                f"{existing.incarnation_id.hex()}, heard from {now_ms - session.last_heartbeat_ms}"
                " ms ago); it can register once that session expires",
            )
        records += elections.remove_from_partitions(image, broker_id, unclean=None, limit=limit)
        if len(records) >= limit:  # maybe more to leave: not registered yet
            message = (
                f"broker {broker_id}'s previous incarnation is still leaving its partitions "
                f"({len(records)} moved now); register again"
            )
            header = cpb.ResponseHeader(error=cpb.REQUEST_TIMED_OUT, message=message)
            return Outcome(tuple(records), cpb.RegisterBrokerResponse(header=header))
    epoch = image.next_broker_epoch
    register = pb.RegisterBrokerRecord(
        broker_id=broker_id,
        incarnation_id=request.incarnation_id,
        broker_epoch=epoch,
        listeners=request.listeners,
        rack=request.rack,
        fenced=True,
    )
    records.append(pb.MetadataRecord(register_broker=register))
    return Outcome(tuple(records), cpb.RegisterBrokerResponse(broker_epoch=epoch))


def _same_incarnation(
    existing: BrokerRegistration, request: cpb.RegisterBrokerRequest
) -> Outcome[cpb.RegisterBrokerResponse]:
    """A retry by the registered process: its epoch again, nothing to write. The same process
    asking with other listeners or rack is a bug in it, not a retry."""
    listeners = tuple((x.name, x.host, x.port) for x in request.listeners)
    if listeners != existing.listeners or (request.rack or None) != existing.rack:
        raise DecisionError(
            cpb.INVALID_REQUEST,
            f"broker {request.broker_id} incarnation {request.incarnation_id.hex()} is "
            "registered with other listeners or rack; a changed broker must restart",
        )
    return Outcome((), cpb.RegisterBrokerResponse(broker_epoch=existing.broker_epoch))


def _validate_registration(request: cpb.RegisterBrokerRequest) -> None:
    problem = _registration_problem(request)
    if problem:
        raise DecisionError(
            cpb.INVALID_REQUEST, f"registration of broker {request.broker_id}: {problem}"
        )


def _registration_problem(request: cpb.RegisterBrokerRequest) -> str:
    if request.broker_id < 0:
        return "the broker id must not be negative"
    if len(request.incarnation_id) != INCARNATION_ID_BYTES:
        return (
            f"the incarnation id has {len(request.incarnation_id)} bytes, "
            f"not {INCARNATION_ID_BYTES}"
        )
    if not request.listeners:
        return "at least one listener is needed"
    names = [x.name for x in request.listeners]
    if len(set(names)) != len(names):
        return f"listener names {names} repeat"
    for x in request.listeners:
        if not x.name or not x.host:
            return f"listener {x.name!r} at {x.host!r}: name and host must not be empty"
        if not 1 <= x.port <= _MAX_PORT:
            return f"listener {x.name!r}: port {x.port} is outside 1..{_MAX_PORT}"
    return ""


# -- heartbeats --------------------------------------------------------------------------------


def broker_heartbeat(
    image: MetadataImage,
    request: cpb.BrokerHeartbeatRequest,
    session: BrokerSession | None,
    committed_offset: int,
    now_ms: int,
    *,
    unclean: bool = False,
    limit: int = elections.MAX_PARTITION_CHANGES,
) -> Outcome[cpb.BrokerHeartbeatResponse]:
    """The next state of the broker (module doc's table) and the records that reach it.

    The broker is caught up once its metadata offset reaches its session's
    ``caught_up_offset``; without a session for this registration (a controller that just
    took over) it must reach ``committed_offset`` instead. ``now_ms`` is not needed by the
    decision (the controller touches the session); ``unclean`` applies to the elections a
    fence or an unfence triggers, ``limit`` bounds the partition changes of an unfence.
    """
    del now_ms
    reg = elections.registration(image, request.broker_id, request.broker_epoch)
    target = committed_offset
    if session is not None and session.broker_epoch == reg.broker_epoch:
        target = session.caught_up_offset
    caught_up = request.metadata_offset >= target
    if reg.fenced:
        records, fenced, shut_down = _fenced_heartbeat(
            image, reg, request, caught_up, unclean, limit
        )
    else:
        records, fenced, shut_down = _unfenced_heartbeat(image, reg, request, unclean)
    response = cpb.BrokerHeartbeatResponse(
        is_caught_up=caught_up, is_fenced=fenced, should_shut_down=shut_down
    )
    return Outcome(tuple(records), response)


def _fenced_heartbeat(
    image: MetadataImage,
    reg: BrokerRegistration,
    request: cpb.BrokerHeartbeatRequest,
    caught_up: bool,
    unclean: bool,
    limit: int,
) -> tuple[Records, bool, bool]:
    """(records, fenced after, should shut down) for a fenced broker."""
    if request.want_shutdown or reg.in_controlled_shutdown:
        return [], True, True
    if request.want_fence or not caught_up:
        return [], True, False
    return elections.unfence_broker(image, reg.broker_id, unclean, limit), False, False


def _unfenced_heartbeat(
    image: MetadataImage,
    reg: BrokerRegistration,
    request: cpb.BrokerHeartbeatRequest,
    unclean: bool,
) -> tuple[Records, bool, bool]:
    """(records, fenced after, should shut down) for an unfenced broker."""
    broker_id = reg.broker_id
    if request.want_fence:
        fence = elections.fence_broker(image, broker_id, unclean)
        done = elections.includes_fence(fence)
        return fence, done, done and request.want_shutdown
    if not (request.want_shutdown or reg.in_controlled_shutdown):
        return [], False, False
    if not image.leaders_of(broker_id):
        # Nothing left to hand over: let it go, fenced so that it leaves every ISR.
        fence = elections.fence_broker(image, broker_id, unclean)
        done = elections.includes_fence(fence)
        return fence, done, done
    moves = elections.move_leaders_away(image, broker_id)
    if reg.in_controlled_shutdown:
        return moves, False, False
    change = pb.BrokerRegistrationChangeRecord(
        broker_id=broker_id, broker_epoch=reg.broker_epoch, in_controlled_shutdown=True
    )
    return [pb.MetadataRecord(broker_registration_change=change), *moves], False, False


# -- session expiry ----------------------------------------------------------------------------


def fence_expired_brokers(
    image: MetadataImage,
    sessions: Mapping[int, BrokerSession],
    now_ms: int,
    session_timeout_ms: int,
    unclean: bool,
) -> Outcome[list[int]]:
    """Fences every unfenced broker whose session expired, in broker id order; the answer is
    the ids fenced (one in very many partitions takes several rounds: ``fence_broker``).
    Each fence is decided on the image the previous ones leave, so a partition whose leader
    and its successor both expired still ends up with a live leader or none."""
    expired = []
    for broker_id in sorted(image.brokers):
        reg = image.brokers[broker_id]
        session = _current_session(sessions, reg)
        if reg.fenced or session is None:
            continue
        if not session.is_alive(now_ms, session_timeout_ms):
            expired.append(broker_id)
    records: Records = []
    current = image
    fenced = []
    for broker_id in expired:
        fence = elections.fence_broker(current, broker_id, unclean)
        records += fence
        current = _replayed(current, fence)
        if elections.includes_fence(fence):
            fenced.append(broker_id)  # the others continue on the next round
    return Outcome(tuple(records), fenced)


def _current_session(
    sessions: Mapping[int, BrokerSession], reg: BrokerRegistration
) -> BrokerSession | None:
    """The session of this registration; one left from an earlier registration is no session."""
    session = sessions.get(reg.broker_id)
    if session is None or session.broker_epoch != reg.broker_epoch:
        return None
    return session


def _replayed(image: MetadataImage, records: Records) -> MetadataImage:
    """The image as it will be once ``records`` commit (offsets are placeholders)."""
    delta = MetadataDelta(image)
    for offset, record in enumerate(records, start=image.offset + 1):
        delta.replay(record, offset)
    return delta.apply()
