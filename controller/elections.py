"""Partition leadership and ISR decisions of the active controller (KIP-631, KIP-497, KIP-903).

How this works. Every function here is pure: it reads a ``MetadataImage`` and returns the
``PartitionChangeRecord``s (and broker records) that carry out a decision, or an ``Outcome``
for a request. A change record names only the fields that change (absent: unchanged); replay
in ``controller.image`` bumps the partition epoch on every change and the leader epoch only
when the leader changes, so an ISR-only change never invalidates followers' fetches.

A broker is *alive* when it is registered, unfenced and not in controlled shutdown; only an
alive broker may become a leader. When a broker goes away (fenced, or entering controlled
shutdown) it leaves every ISR it is in, except where it is the last member: Kafka keeps the
last member so that the partition remembers which replica holds all committed data, and
that replica is elected again when it returns (``unfence_broker``). If it led, the new leader
is the first alive ISR member in replica order (``placement.choose_leader``); with unclean
election enabled and no such member, an alive out-of-sync replica is chosen and the ISR
becomes that replica alone (its log is now the truth); otherwise the partition has no leader
(with unclean election enabled, until an out-of-sync replica is unfenced).

Whether unclean election is enabled is decided per partition (``unclean_allowed``, Kafka's
order): the topic's ``unclean.leader.election.enable`` if set, else the cluster-wide dynamic
broker config of that name, else the controller's static ``unclean_leader_election_enable``,
which the callers pass as ``unclean``. ``unclean=None`` means never, whatever the configs say
(a controlled shutdown, a replaced incarnation).

Requests: ``alter_partition`` is a leader proposing a new ISR, checked against the leader
epoch, the partition epoch and each member's registration; ElectLeaders is
``elect_preferred_leaders`` (leadership back to each partition's first replica) or
``elect_unclean_leaders`` (a leader for a partition without one, outside the ISR if need
be, whatever the configs say: the operator asks for it); ``rebalance_leaders`` does what
the first does for the periodic balancing the placement module asks for.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple, cast

from controller.image import NO_LEADER, BrokerRegistration, MetadataImage, PartitionState
from controller.outcome import DecisionError, Outcome
from controller.placement import choose_leader, preferred_leader_moves
from controller.records import ConfigResourceType
from proto import controller_pb2 as cpb
from proto import metadata_pb2 as pb

_log = logging.getLogger(__name__)

__all__ = [
    "ElectionResult",
    "alive_brokers",
    "alter_partition",
    "elect_leaderless",
    "elect_preferred_leaders",
    "elect_unclean_leaders",
    "fence_broker",
    "hit_limit",
    "move_leaders_away",
    "rebalance_leaders",
    "remove_from_partitions",
    "unfence_broker",
]

TopicRef = bytes | str  # a topic id, or a topic name


class ElectionResult(NamedTuple):
    """One partition's answer to an ElectLeaders request (``cpb.NONE`` when elected)."""

    topic: str
    partition: int
    error: int
    message: str


# Partition changes one decision may write (KRaft bounds a batch at 10,000 records): more
# would stall the active controller's event loop for seconds at 100,000 partitions.
MAX_PARTITION_CHANGES = 10_000


def alive_brokers(image: MetadataImage) -> frozenset[int]:
    """Registered, unfenced and not in controlled shutdown: the brokers that may lead."""
    return frozenset(
        b for b, reg in image.brokers.items() if not reg.fenced and not reg.in_controlled_shutdown
    )


# -- brokers coming and going ------------------------------------------------------------------


def fence_broker(
    image: MetadataImage, broker_id: int, unclean: bool | None, limit: int = MAX_PARTITION_CHANGES
) -> list[pb.MetadataRecord]:
    """The partition changes that take ``broker_id`` out of ISRs and leaderships (module doc)
    and, once they all fit in ``limit``, the FenceBrokerRecord after them. A broker in more
    partitions is fenced over several decisions (``includes_fence`` tells which one ended
    it): one decision stays small enough not to stall the controller's event loop.
    ``unclean``: the static default of unclean election (module doc)."""
    reg = registration(image, broker_id)
    changes = remove_from_partitions(image, broker_id, unclean, limit)
    if len(changes) >= limit:
        return changes
    fence = pb.FenceBrokerRecord(broker_id=broker_id, broker_epoch=reg.broker_epoch)
    return [*changes, pb.MetadataRecord(fence_broker=fence)]


def includes_fence(records: list[pb.MetadataRecord]) -> bool:
    return any(r.WhichOneof("record") == "fence_broker" for r in records)


def move_leaders_away(
    image: MetadataImage, broker_id: int, limit: int = MAX_PARTITION_CHANGES
) -> list[pb.MetadataRecord]:
    """For a controlled shutdown: partitions ``broker_id`` leads get another leader from their
    ISR (or none, if no other member is alive), and it leaves ISRs where others remain; at
    most ``limit`` changes, the rest on the broker's next heartbeat. Never unclean: a broker
    shutting down cleanly is no reason to lose data."""
    return remove_from_partitions(image, broker_id, unclean=None, limit=limit)


def remove_from_partitions(
    image: MetadataImage, broker_id: int, unclean: bool | None, limit: int = MAX_PARTITION_CHANGES
) -> list[pb.MetadataRecord]:
    """The partition changes for ``broker_id`` leaving (fenced, shutting down, or a previous
    incarnation replaced): one record per partition whose ISR or leader changes, at most
    ``limit`` of them (the first ones by topic id and partition id). ``unclean``: the static
    default of unclean election, None for never (module doc)."""
    alive = alive_brokers(image) - {broker_id}
    records: list[pb.MetadataRecord] = []
    for p in image.replicas_of(broker_id):
        if len(records) >= limit:
            break
        if broker_id not in p.isr:
            continue
        isr = p.isr if len(p.isr) == 1 else tuple(b for b in p.isr if b != broker_id)
        leader = p.leader
        if leader == broker_id:
            leader, isr = _elect(p.replicas, isr, alive, unclean_allowed(image, p, unclean))
        record = _change(p, leader, isr)
        if record is not None:
            records.append(record)
    return records


def unfence_broker(
    image: MetadataImage,
    broker_id: int,
    unclean: bool | None = False,
    limit: int = MAX_PARTITION_CHANGES,
) -> list[pb.MetadataRecord]:
    """An UnfenceBrokerRecord, and a leader for the leaderless partitions whose ISR holds
    ``broker_id`` (typically the last ISR member coming back); where unclean election is
    enabled (``unclean``: its static default, module doc), also for the leaderless
    partitions of which it is a replica and no ISR member is alive (Kafka elects an offline
    partition's first alive replica then). At most ``limit`` elections: a broker that was the
    last ISR member of more partitions gets the rest from ``elect_leaderless`` in later
    decisions (``hit_limit`` tells the caller)."""
    reg = registration(image, broker_id)
    unfence = pb.UnfenceBrokerRecord(broker_id=broker_id, broker_epoch=reg.broker_epoch)
    records = [pb.MetadataRecord(unfence_broker=unfence)]
    if reg.in_controlled_shutdown:
        return records  # unfenced, but still not a broker to lead anything
    alive = alive_brokers(image) | {broker_id}
    partitions = image.replicas_of(broker_id)
    return records + _elect_leaderless(image, partitions, alive, unclean, limit, broker_id)


def elect_leaderless(
    image: MetadataImage, unclean: bool | None, limit: int = MAX_PARTITION_CHANGES
) -> list[pb.MetadataRecord]:
    """A leader for at most ``limit`` leaderless partitions that can have one: an ISR
    member is alive, or (unclean election allowed) another replica is. The active controller
    runs it after an unfence that ``hit_limit`` and once when it takes over (a previous
    controller may have stopped in the middle of such a series). One pass over the image."""
    leaderless = image.leaders_of(NO_LEADER)
    return _elect_leaderless(image, leaderless, alive_brokers(image), unclean, limit)


def hit_limit(records: Sequence[pb.MetadataRecord], limit: int = MAX_PARTITION_CHANGES) -> bool:
    """Whether a decision made ``limit`` partition changes: there may be more to make."""
    changes = sum(1 for r in records if r.WhichOneof("record") == "partition_change")
    return changes >= limit


def _elect_leaderless(
    image: MetadataImage,
    partitions: Iterable[PartitionState],
    alive: frozenset[int],
    unclean: bool | None,
    limit: int,
    member: int | None = None,
) -> list[pb.MetadataRecord]:
    """Elections for the leaderless ``partitions``: clean where an alive broker is in the
    ISR (where ``member`` is, if given), unclean where none is and it is allowed."""
    records: list[pb.MetadataRecord] = []
    for p in partitions:
        if len(records) >= limit:
            break
        if p.leader != NO_LEADER:
            continue
        if member in p.isr if member is not None else alive.intersection(p.isr):
            leader, isr = _elect(p.replicas, p.isr, alive, unclean=False)
        elif not alive.intersection(p.isr) and unclean_allowed(image, p, unclean):
            leader, isr = _elect(p.replicas, p.isr, alive, unclean=True)
        else:
            continue
        record = _change(p, leader, isr)
        if record is not None:
            records.append(record)
    return records


# -- AlterPartition ----------------------------------------------------------------------------

# One request's changes become one metadata batch; brokers send at most 1,000
# (broker/alter_partition.py).
MAX_ISR_CHANGES_PER_REQUEST = 10_000


def alter_partition(
    image: MetadataImage, request: cpb.AlterPartitionRequest
) -> Outcome[cpb.AlterPartitionResponse]:
    """A leader's new ISRs (KIP-497), with each member's broker epoch (KIP-903), one result
    per change: the partition as it will be once the change is committed, or why it was
    refused (that change writes nothing; the others go on). Each change is judged against
    ``image``; a partition named twice is refused the second time. A requester that is not
    the current registration of its broker is refused as a whole (DecisionError)."""
    if len(request.changes) > MAX_ISR_CHANGES_PER_REQUEST:
        raise DecisionError(
            cpb.INVALID_REQUEST,
            f"{len(request.changes)} ISR changes in one request; at most "
            f"{MAX_ISR_CHANGES_PER_REQUEST}",
        )
    reg = image.brokers.get(request.broker_id)
    if reg is None or reg.broker_epoch != request.broker_epoch:
        held = "not registered" if reg is None else f"registered at epoch {reg.broker_epoch}"
        raise DecisionError(
            cpb.STALE_BROKER_EPOCH,
            f"broker {request.broker_id} at epoch {request.broker_epoch} is {held}",
        )
    records: list[pb.MetadataRecord] = []
    results: list[cpb.IsrChangeResult] = []
    seen: set[tuple[bytes, int]] = set()
    for change in request.changes:
        key = (change.topic_id, change.partition_id)
        try:
            if key in seen:
                raise DecisionError(
                    cpb.INVALID_REQUEST,
                    f"partition {change.partition_id} of topic id {change.topic_id.hex()} is "
                    "named twice",
                )
            seen.add(key)
            record, after = _alter_one(image, request.broker_id, change)
        except DecisionError as e:
            error = cast(cpb.ErrorCode, e.code)  # (the stubs have no ValueType)
            results.append(cpb.IsrChangeResult(error=error, message=e.message))
            continue
        if record is not None:
            records.append(record)
        results.append(cpb.IsrChangeResult(partition=after))
    return Outcome(tuple(records), cpb.AlterPartitionResponse(results=results))


def _alter_one(
    image: MetadataImage, broker_id: int, change: cpb.IsrChange
) -> tuple[pb.MetadataRecord | None, pb.PartitionRecord]:
    """One change's record (None: the ISR is already so) and the partition after it."""
    p = image.partition(change.topic_id, change.partition_id)
    if p is None:
        raise DecisionError(
            cpb.UNKNOWN_TOPIC_OR_PARTITION,
            f"no partition {change.partition_id} of topic id {change.topic_id.hex()}",
        )
    _check_leader(p, broker_id, change)
    new_isr = _checked_isr(image, p, change)
    after = partition_record(p)
    if set(new_isr) == set(p.isr):
        return None, after
    record = pb.PartitionChangeRecord(
        topic_id=p.topic_id, partition_id=p.partition_id, isr=pb.BrokerIds(ids=new_isr)
    )
    after.ClearField("isr")
    after.isr.extend(new_isr)
    after.partition_epoch = p.partition_epoch + 1
    return pb.MetadataRecord(partition_change=record), after


def _check_leader(p: PartitionState, broker_id: int, change: cpb.IsrChange) -> None:
    """The requester must be the current leader, at the current leader and partition
    epochs."""
    where = f"partition {p.partition_id} of topic id {p.topic_id.hex()}"
    if p.leader != broker_id or p.leader_epoch != change.leader_epoch:
        raise DecisionError(
            cpb.FENCED_LEADER_EPOCH,
            f"{where}: broker {broker_id} at leader epoch {change.leader_epoch} is not "
            f"the leader (leader {p.leader} at leader epoch {p.leader_epoch})",
        )
    if p.partition_epoch != change.partition_epoch:
        raise DecisionError(
            cpb.INVALID_UPDATE_VERSION,
            f"{where}: partition epoch {change.partition_epoch} is not the current "
            f"{p.partition_epoch}",
        )


def _checked_isr(image: MetadataImage, p: PartitionState, change: cpb.IsrChange) -> tuple[int, ...]:
    """The proposed ISR's broker ids, once it is well formed and every member may be in it."""
    where = f"partition {p.partition_id} of topic id {p.topic_id.hex()}"
    isr = tuple(m.broker_id for m in change.new_isr)
    if not isr or len(set(isr)) != len(isr) or p.leader not in isr:
        raise DecisionError(
            cpb.INVALID_REQUEST,
            f"{where}: new ISR {list(isr)} is empty, repeats a broker or leaves out the leader",
        )
    for member in change.new_isr:
        why = _ineligible(image, p, member)
        if why:
            raise DecisionError(cpb.INELIGIBLE_REPLICA, f"{where}: broker {member.broker_id} {why}")
    return isr


def _ineligible(image: MetadataImage, p: PartitionState, member: cpb.IsrMember) -> str:
    """Why ``member`` may not be in the ISR, or "" if it may."""
    reg = image.brokers.get(member.broker_id)
    if member.broker_id not in p.replicas:
        return f"is not a replica (replicas {list(p.replicas)})"
    if reg is None:
        return "is not registered"
    if reg.fenced:
        return "is fenced"
    if reg.in_controlled_shutdown:
        return "is in controlled shutdown"
    if reg.broker_epoch != member.broker_epoch:
        # KIP-903: a replica that restarted (new epoch) may have lost data it acknowledged
        # while the leader still counts fetches from its previous incarnation.
        return f"has broker epoch {reg.broker_epoch}, not {member.broker_epoch}"
    return ""


# -- ElectLeaders and preferred leaders --------------------------------------------------------


def elect_preferred_leaders(
    image: MetadataImage,
    partitions: Iterable[tuple[TopicRef, int]] | None,
    limit: int = MAX_PARTITION_CHANGES,
) -> Outcome[list[ElectionResult]]:
    """ElectLeaders PREFERRED: moves leadership to each partition's first replica where it
    is alive and in the ISR (PREFERRED_LEADER_NOT_AVAILABLE otherwise; ELECTION_NOT_NEEDED
    where it leads already). ``partitions`` and ``limit``: ``_elect_each``."""
    return _elect_each(image, partitions, limit, _elect_preferred)


def elect_unclean_leaders(
    image: MetadataImage,
    partitions: Iterable[tuple[TopicRef, int]] | None,
    limit: int = MAX_PARTITION_CHANGES,
) -> Outcome[list[ElectionResult]]:
    """ElectLeaders UNCLEAN (Kafka's ``Election.UNCLEAN``): a partition that has a leader
    needs no election (ELECTION_NOT_NEEDED); one without gets its first alive ISR member in
    replica order, else its first alive replica, which then becomes the whole ISR (logged
    at ERROR, as every unclean election is); with no replica alive,
    ELIGIBLE_LEADERS_NOT_AVAILABLE. ``unclean.leader.election.enable`` plays no part: the
    request is the operator asking for it, as in Kafka. ``partitions`` and ``limit``:
    ``_elect_each``."""
    return _elect_each(image, partitions, limit, _elect_unclean)


# One partition's election: its change (None: none) and its answer's error and message.
_ElectOne = Callable[[PartitionState, frozenset[int]], tuple[pb.MetadataRecord | None, int, str]]


def _elect_each(
    image: MetadataImage,
    partitions: Iterable[tuple[TopicRef, int]] | None,
    limit: int,
    elect: _ElectOne,
) -> Outcome[list[ElectionResult]]:
    """What both ElectLeaders types share. ``partitions`` names topics by id or by name,
    at most ``limit`` of them (INVALID_REQUEST otherwise), each answered once in the order
    asked (UNKNOWN_TOPIC_OR_PARTITION where there is no such partition); ``None`` means
    every partition, and then, as in Kafka, partitions that need no election are left out
    of the answer, and after ``limit`` changes the rest are left for another request (one
    decision stays small)."""
    every = partitions is None
    if partitions is not None:
        partitions = list(dict.fromkeys(partitions))
        if len(partitions) > limit:
            raise DecisionError(
                cpb.INVALID_REQUEST,
                f"{len(partitions)} partitions named; at most {limit} per request",
            )
    alive = alive_brokers(image)
    records: list[pb.MetadataRecord] = []
    results = []
    for name, partition_id, p in _named_partitions(image, partitions):
        if len(records) >= limit:
            break
        if p is None:
            unknown = cpb.UNKNOWN_TOPIC_OR_PARTITION
            message = f"no partition {partition_id} of topic {name}"
            results.append(ElectionResult(name, partition_id, unknown, message))
            continue
        record, error, message = elect(p, alive)
        if record is not None:
            records.append(record)
        if not (every and error == cpb.ELECTION_NOT_NEEDED):
            results.append(ElectionResult(name, partition_id, error, message))
    return Outcome(tuple(records), results)


def _named_partitions(
    image: MetadataImage, partitions: Iterable[tuple[TopicRef, int]] | None
) -> Iterator[tuple[str, int, PartitionState | None]]:
    """Each partition asked for (every one for None) as (topic name, partition id, its
    state or None when there is no such partition), once: a topic named both by name and by
    id is one topic."""
    if partitions is None:
        for p in _partition_states(image):
            yield image.topics[p.topic_id].name, p.partition_id, p
        return
    seen: set[tuple[TopicRef, int]] = set()
    for topic, partition_id in partitions:
        topic_id = image.topic_ids.get(topic) if isinstance(topic, str) else topic
        topic_image = None if topic_id is None else image.topics.get(topic_id)
        key = (topic if topic_image is None else topic_image.topic_id, partition_id)
        if key in seen:
            continue
        seen.add(key)
        if topic_image is None:
            yield _topic_label(topic), partition_id, None
        else:
            yield topic_image.name, partition_id, topic_image.partitions.get(partition_id)


def _elect_preferred(
    p: PartitionState, alive: frozenset[int]
) -> tuple[pb.MetadataRecord | None, int, str]:
    preferred = p.replicas[0]
    if p.leader == preferred:
        return None, cpb.ELECTION_NOT_NEEDED, f"preferred replica {preferred} already leads"
    if preferred not in alive or preferred not in p.isr:
        state = "not alive" if preferred not in alive else "not in the ISR"
        message = f"preferred replica {preferred} is {state}"
        return None, cpb.PREFERRED_LEADER_NOT_AVAILABLE, message
    return _change(p, preferred, p.isr), cpb.NONE, ""


def _elect_unclean(
    p: PartitionState, alive: frozenset[int]
) -> tuple[pb.MetadataRecord | None, int, str]:
    if p.leader != NO_LEADER:
        return None, cpb.ELECTION_NOT_NEEDED, f"replica {p.leader} leads"
    leader, isr = _elect(p.replicas, p.isr, alive, unclean=True)
    if leader == NO_LEADER:
        message = f"no replica of {list(p.replicas)} is alive"
        return None, cpb.ELIGIBLE_LEADERS_NOT_AVAILABLE, message
    return _change(p, leader, isr), cpb.NONE, ""


def rebalance_leaders(
    image: MetadataImage, imbalance_percentage: int = 0, limit: int = MAX_PARTITION_CHANGES
) -> list[pb.MetadataRecord]:
    """The periodic preferred-leader balancing: each partition whose first replica is alive
    and in the ISR but does not lead is handed back to it (``placement``'s rule), for the
    brokers whose imbalance (the share of the partitions they are preferred for that they do
    not lead) is above ``imbalance_percentage`` (Kafka's
    ``leader.imbalance.per.broker.percentage``); at most ``limit`` of them, the rest at the
    next period."""
    partitions = list(_partition_states(image))
    preferred = Counter(p.replicas[0] for p in partitions)
    states = ((p, p.replicas, p.isr, p.leader) for p in partitions)
    moves = preferred_leader_moves(states, alive_brokers(image))
    behind = Counter(broker for _, broker in moves)
    over = {b for b, n in behind.items() if 100 * n > imbalance_percentage * preferred[b]}
    records: list[pb.MetadataRecord] = []
    for p, broker in moves:
        if len(records) >= limit:
            break
        record = _change(p, broker, p.isr) if broker in over else None
        if record is not None:
            records.append(record)
    return records


# -- helpers -----------------------------------------------------------------------------------


def registration(
    image: MetadataImage, broker_id: int, broker_epoch: int | None = None
) -> BrokerRegistration:
    """The broker's current registration: BROKER_ID_NOT_REGISTERED without one, and
    STALE_BROKER_EPOCH when ``broker_epoch`` is given and is not its epoch."""
    reg = image.brokers.get(broker_id)
    if reg is None:
        raise DecisionError(cpb.BROKER_ID_NOT_REGISTERED, f"broker {broker_id} is not registered")
    if broker_epoch is not None and reg.broker_epoch != broker_epoch:
        raise DecisionError(
            cpb.STALE_BROKER_EPOCH,
            f"broker {broker_id} is registered at epoch {reg.broker_epoch}, not {broker_epoch}",
        )
    return reg


UNCLEAN_CONFIG = "unclean.leader.election.enable"
_TOPIC, _BROKER = int(ConfigResourceType.TOPIC), int(ConfigResourceType.BROKER)


def unclean_allowed(image: MetadataImage, p: PartitionState, default: bool | None) -> bool:
    """Whether ``p`` may elect an out-of-sync leader: its topic's config, else the
    cluster-wide dynamic broker config, else ``default``; never when ``default`` is None."""
    if default is None:
        return False
    topic = image.topics.get(p.topic_id)
    resources = [(_BROKER, "")] if topic is None else [(_TOPIC, topic.name), (_BROKER, "")]
    for resource in resources:
        value = image.configs.get(resource, {}).get(UNCLEAN_CONFIG)
        if value is not None:
            return value == "true"  # the controller commits the canonical text only
    return default


def _elect(
    replicas: Sequence[int], isr: tuple[int, ...], alive: frozenset[int], unclean: bool
) -> tuple[int, tuple[int, ...]]:
    """The leader ``choose_leader`` picks and the ISR that goes with it: an unclean leader
    (outside the ISR) becomes the whole ISR."""
    leader = choose_leader(replicas, isr, alive, unclean)
    if leader != NO_LEADER and leader not in isr:
        # Logged when decided (the change may still fail to commit): loud on purpose.
        _log.error(
            "UNCLEAN LEADER ELECTION: replica %d, outside the ISR %s, becomes leader "
            "(replicas %s); records the ISR had and it lacks are lost, and the other "
            "replicas will truncate to its log",
            leader,
            isr,
            tuple(replicas),
        )
        return leader, (leader,)
    return leader, isr


def _change(p: PartitionState, leader: int, isr: tuple[int, ...]) -> pb.MetadataRecord | None:
    """A PartitionChangeRecord naming only what differs from ``p``; None if nothing does."""
    if leader == p.leader and isr == p.isr:
        return None
    change = pb.PartitionChangeRecord(topic_id=p.topic_id, partition_id=p.partition_id)
    if leader != p.leader:
        change.leader = leader
    if isr != p.isr:
        change.isr.CopyFrom(pb.BrokerIds(ids=isr))
    return pb.MetadataRecord(partition_change=change)


def partition_record(p: PartitionState) -> pb.PartitionRecord:
    """The full record of a partition's current state."""
    return pb.PartitionRecord(
        topic_id=p.topic_id,
        partition_id=p.partition_id,
        replicas=p.replicas,
        isr=p.isr,
        leader=p.leader,
        leader_epoch=p.leader_epoch,
        partition_epoch=p.partition_epoch,
    )


def _partition_states(image: MetadataImage) -> Iterable[PartitionState]:
    for topic_id in sorted(image.topics):
        partitions = image.topics[topic_id].partitions
        yield from (partitions[n] for n in sorted(partitions))


def _topic_label(topic: TopicRef) -> str:
    return topic if isinstance(topic, str) else f"(topic id {topic.hex()})"
