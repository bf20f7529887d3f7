"""Leader elections and ISR changes: one test per rule of controller/elections.py.

Images are built by replaying records, and every decision's records are replayed through
``MetadataDelta`` too, so each test also proves that what the controller would commit
applies cleanly. The helpers here (``cluster``, ``replay``) are shared with test_brokers.py.
A property test drives random fences, unfences and controlled shutdowns and checks the
invariants that leadership must keep after each.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller import elections
from controller import records as rec
from controller.image import MetadataDelta, MetadataImage, PartitionState
from controller.outcome import DecisionError, Outcome
from proto import controller_pb2 as cpb
from proto import metadata_pb2 as pb

ORDERS = bytes(range(16))
UNKNOWN = bytes(range(16, 32))
NO_LEADER = -1

PartitionSpec = tuple[Sequence[int], Sequence[int], int]  # replicas, isr, leader


def epoch_of(broker_id: int) -> int:
    return 100 + broker_id


def incarnation(broker_id: int, generation: int = 0) -> bytes:
    return bytes([broker_id, generation]) * 8


def replay(image: MetadataImage, records: Iterable[pb.MetadataRecord]) -> MetadataImage:
    """``image`` with ``records`` committed; every record must apply (none skipped)."""
    delta = MetadataDelta(image)
    for offset, record in enumerate(records, start=image.offset + 1):
        delta.replay(record, offset)
    assert delta.ignored_records == 0, delta.last_ignored
    return delta.apply()


def cluster(
    brokers: Iterable[int] = (1, 2, 3),
    partitions: Mapping[int, PartitionSpec] | None = None,
    *,
    fenced: Iterable[int] = (),
    shutting_down: Iterable[int] = (),
) -> MetadataImage:
    """Brokers (epoch 100 + id, unfenced unless in ``fenced``) and topic "orders" with the
    given partitions, all at leader and partition epoch 0."""
    fenced = set(fenced)
    records = [
        rec.register_broker(
            b, epoch_of(b), incarnation(b), [("PLAINTEXT", f"h{b}", 9092)], fenced=b in fenced
        )
        for b in brokers
    ]
    records += [
        rec.broker_registration_change(b, epoch_of(b), in_controlled_shutdown=True)
        for b in shutting_down
    ]
    records.append(rec.topic("orders", ORDERS))
    for partition_id, (replicas, isr, leader) in (partitions or {}).items():
        records.append(rec.partition(ORDERS, partition_id, replicas, isr, leader))
    return replay(MetadataImage.EMPTY, records)


def part(image: MetadataImage, partition_id: int) -> PartitionState:
    p = image.partition(ORDERS, partition_id)
    assert p is not None
    return p


def changes(records: Iterable[pb.MetadataRecord]) -> dict[int, pb.PartitionChangeRecord]:
    """The partition changes among ``records``, by partition id (at most one each)."""
    out = {}
    for r in records:
        if r.WhichOneof("record") == "partition_change":
            assert r.partition_change.partition_id not in out
            out[r.partition_change.partition_id] = r.partition_change
    return out


# -- fencing -----------------------------------------------------------------------------------


def test_a_fenced_leader_is_replaced_by_the_first_live_isr_member() -> None:
    image = cluster(partitions={0: ([1, 2, 3], [1, 2, 3], 1)})
    records = elections.fence_broker(image, 1, unclean=False)
    assert records[-1] == rec.fence_broker(1, epoch_of(1))  # after the partition changes
    after = replay(image, records)
    assert after.brokers[1].fenced
    p = part(after, 0)
    assert (p.leader, p.isr, p.leader_epoch, p.partition_epoch) == (2, (2, 3), 1, 1)


def test_a_broker_in_many_partitions_is_fenced_over_several_bounded_decisions() -> None:
    image = cluster(partitions={i: ([1, 2, 3], [1, 2, 3], 1) for i in range(5)})
    rounds = []
    while not image.brokers[1].fenced:
        records = elections.fence_broker(image, 1, unclean=False, limit=2)
        assert len(records) <= 3  # two changes, and the fence once they all fit
        rounds.append(elections.includes_fence(records))
        image = replay(image, records)
    assert rounds == [False, False, True]
    assert all(part(image, i).leader == 2 and 1 not in part(image, i).isr for i in range(5))


def test_a_controlled_shutdown_moves_a_bounded_number_of_leaders_per_heartbeat() -> None:
    image = cluster(partitions={i: ([1, 2, 3], [1, 2, 3], 1) for i in range(5)})
    moves = elections.move_leaders_away(image, 1, limit=2)
    after = replay(image, moves)
    assert sorted(p.leader for p in after.leaders_of(1)) == [1, 1, 1]


def test_a_broker_in_controlled_shutdown_is_not_elected() -> None:
    image = cluster(partitions={0: ([1, 2, 3], [1, 2, 3], 1)}, shutting_down=[2])
    after = replay(image, elections.fence_broker(image, 1, unclean=False))
    assert part(after, 0).leader == 3


def test_a_fenced_follower_leaves_the_isr_and_the_leader_epoch_stays() -> None:
    image = cluster(partitions={0: ([2, 3, 1], [2, 3, 1], 2)})
    records = elections.fence_broker(image, 3, unclean=False)
    change = changes(records)[0]
    assert not change.HasField("leader")
    assert list(change.isr.ids) == [2, 1]
    p = part(replay(image, records), 0)
    assert (p.leader, p.isr, p.leader_epoch, p.partition_epoch) == (2, (2, 1), 0, 1)


def test_fencing_touches_only_partitions_whose_isr_holds_the_broker() -> None:
    image = cluster(
        [1, 2, 3, 4],
        {0: ([1, 2], [1, 2], 1), 1: ([2, 3], [2, 3], 2), 2: ([3, 4], [3], 3)},
    )
    records = elections.fence_broker(image, 4, unclean=False)
    assert records == [rec.fence_broker(4, epoch_of(4))]
    assert set(changes(elections.fence_broker(image, 2, unclean=False))) == {0, 1}


def test_the_last_isr_member_stays_in_the_isr() -> None:
    image = cluster(partitions={0: ([1, 2], [1], 1)})
    change = changes(elections.fence_broker(image, 1, unclean=False))[0]
    assert change.leader == NO_LEADER
    assert not change.HasField("isr")
    p = part(replay(image, elections.fence_broker(image, 1, unclean=False)), 0)
    assert (p.leader, p.isr, p.leader_epoch) == (NO_LEADER, (1,), 1)


def test_unclean_election_only_when_enabled_and_said_loudly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    image = cluster(partitions={0: ([1, 2], [1], 1)})
    clean = part(replay(image, elections.fence_broker(image, 1, unclean=False)), 0)
    assert (clean.leader, clean.isr) == (NO_LEADER, (1,))
    with caplog.at_level(logging.ERROR, logger="controller.elections"):
        unclean = part(replay(image, elections.fence_broker(image, 1, unclean=True)), 0)
    assert (unclean.leader, unclean.isr, unclean.leader_epoch) == (2, (2,), 1)
    (said,) = [r.getMessage() for r in caplog.records if "UNCLEAN" in r.getMessage()]
    assert "replica 2, outside the ISR (1,)" in said and "lost" in said


def test_unclean_election_is_not_used_while_an_isr_member_is_alive() -> None:
    image = cluster(partitions={0: ([1, 2, 3], [1, 3], 1)})
    p = part(replay(image, elections.fence_broker(image, 1, unclean=True)), 0)
    assert (p.leader, p.isr) == (3, (3,))


TOPIC, BROKER = rec.ConfigResourceType.TOPIC, rec.ConfigResourceType.BROKER
UNCLEAN = "unclean.leader.election.enable"


def with_configs(
    image: MetadataImage, *entries: tuple[rec.ConfigResourceType, str, str]
) -> MetadataImage:
    """``image`` with ``unclean.leader.election.enable`` set on (resource type, name) to a
    value, as IncrementalAlterConfigs commits it."""
    return replay(image, [rec.config(kind, name, UNCLEAN, value) for kind, name, value in entries])


@pytest.mark.parametrize(
    ("static", "entries", "unclean"),
    [
        (False, [(TOPIC, "orders", "true")], True),  # the topic's config enables it
        (True, [(TOPIC, "orders", "false")], False),  # ... or disables it
        (False, [(BROKER, "", "true")], True),  # the cluster-wide default
        (True, [(BROKER, "", "false")], False),
        (False, [(BROKER, "", "true"), (TOPIC, "orders", "false")], False),  # the topic's wins
        (True, [(TOPIC, "payments", "false")], True),  # another topic's does not count
        (False, [(BROKER, "1", "true"), (BROKER, "2", "true")], False),  # nor a broker id's
        (True, [], True),  # nothing set: the controller's static setting
    ],
)
def test_unclean_election_follows_the_topic_then_the_cluster_config_then_the_static_one(
    static: bool, entries: list[tuple[rec.ConfigResourceType, str, str]], unclean: bool
) -> None:
    image = with_configs(cluster(partitions={0: ([1, 2], [1], 1)}), *entries)
    p = part(replay(image, elections.fence_broker(image, 1, unclean=static)), 0)
    assert (p.leader, p.isr) == ((2, (2,)) if unclean else (NO_LEADER, (1,)))
    # An offline partition's out-of-sync replica coming back is elected by the same rule.
    offline = with_configs(
        cluster(partitions={0: ([1, 2], [1], NO_LEADER)}, fenced=[1, 2]), *entries
    )
    p = part(replay(offline, elections.unfence_broker(offline, 2, unclean=static)), 0)
    assert p.leader == (2 if unclean else NO_LEADER)


def test_a_controlled_shutdown_is_never_unclean_whatever_the_configs() -> None:
    image = with_configs(
        cluster(partitions={0: ([1, 2], [1], 1)}), (TOPIC, "orders", "true"), (BROKER, "", "true")
    )
    p = part(replay(image, elections.move_leaders_away(image, 1)), 0)
    assert (p.leader, p.isr) == (NO_LEADER, (1,))


def test_preferred_leader_elections_change_at_most_limit_partitions_per_decision() -> None:
    image = cluster(partitions={p: ([1, 2], [1, 2], 2) for p in range(5)})
    assert len(elections.rebalance_leaders(image, limit=3)) == 3
    assert len(elections.rebalance_leaders(image)) == 5
    every = elections.elect_preferred_leaders(image, None, limit=3)
    assert len(every.records) == 3
    after = replay(image, every.records)
    assert len(elections.elect_preferred_leaders(after, None, limit=3).records) == 2
    named = [(ORDERS, p) for p in range(5)]
    with pytest.raises(DecisionError) as e:
        elections.elect_preferred_leaders(image, named, limit=3)
    assert e.value.code == cpb.INVALID_REQUEST
    assert len(elections.elect_preferred_leaders(image, named[:3], limit=3).records) == 3


def test_fencing_an_unregistered_broker_is_refused() -> None:
    with pytest.raises(DecisionError) as e:
        elections.fence_broker(cluster(), 9, unclean=False)
    assert e.value.code == cpb.BROKER_ID_NOT_REGISTERED


# -- unfencing ---------------------------------------------------------------------------------


def test_the_last_isr_member_is_elected_again_when_unfenced() -> None:
    image = cluster(partitions={0: ([1, 2], [1], 1)})
    image = replay(image, elections.fence_broker(image, 1, unclean=False))
    records = elections.unfence_broker(image, 1)
    assert records[0] == rec.unfence_broker(1, epoch_of(1))
    p = part(replay(image, records), 0)
    assert (p.leader, p.isr, p.leader_epoch, p.partition_epoch) == (1, (1,), 2, 2)


def test_unfencing_elects_the_broker_only_where_it_is_in_the_isr() -> None:
    image = cluster(
        partitions={0: ([1, 2], [1], NO_LEADER), 1: ([2, 1], [2], NO_LEADER)}, fenced=[1, 2]
    )
    records = elections.unfence_broker(image, 1)
    assert set(changes(records)) == {0}
    after = replay(image, records)
    assert (part(after, 0).leader, part(after, 1).leader) == (1, NO_LEADER)


def test_with_unclean_election_an_unfenced_out_of_sync_replica_leads_an_offline_partition(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Partition 0's last ISR member (2) is down; partition 1's ISR member (3) is alive and
    # leads; partition 2's ISR member (3) is alive but the partition has no leader yet.
    image = cluster(
        [1, 2, 3],
        {0: ([1, 2], [2], NO_LEADER), 1: ([1, 3], [3], 3), 2: ([1, 3], [3], NO_LEADER)},
        fenced=[1, 2],
    )
    assert set(changes(elections.unfence_broker(image, 1))) == set()  # clean: nothing
    with caplog.at_level(logging.ERROR, logger="controller.elections"):
        records = elections.unfence_broker(image, 1, unclean=True)
    assert set(changes(records)) == {0}
    p = part(replay(image, records), 0)
    assert (p.leader, p.isr, p.leader_epoch) == (1, (1,), 1)
    (said,) = [r.getMessage() for r in caplog.records if "UNCLEAN" in r.getMessage()]
    assert "replica 1, outside the ISR (2,)" in said


def test_unfencing_a_broker_in_controlled_shutdown_elects_nothing() -> None:
    image = cluster(partitions={0: ([1, 2], [1], NO_LEADER)}, fenced=[1], shutting_down=[1])
    assert elections.unfence_broker(image, 1) == [rec.unfence_broker(1, epoch_of(1))]


def test_the_last_isr_member_of_many_partitions_is_elected_over_several_bounded_decisions() -> None:
    # Broker 1 is the last ISR member of 5 leaderless partitions; one decision may make 2
    # changes: the unfence elects 2, the sweeps after it 2 and 1, and the next finds none.
    image = cluster(partitions={i: ([1, 2], [1], NO_LEADER) for i in range(5)}, fenced=[1])
    records = elections.unfence_broker(image, 1, limit=2)
    assert records[0] == rec.unfence_broker(1, epoch_of(1))
    assert (list(changes(records)), elections.hit_limit(records, 2)) == ([0, 1], True)
    image = replay(image, records)
    rounds = []
    while True:
        records = elections.elect_leaderless(image, unclean=False, limit=2)
        rounds.append(sorted(changes(records)))
        image = replay(image, records)
        if not elections.hit_limit(records, 2):
            break
    assert rounds == [[2, 3], [4]]
    assert [(part(image, i).leader, part(image, i).isr) for i in range(5)] == [(1, (1,))] * 5
    assert elections.elect_leaderless(image, unclean=False) == []


def test_the_leaderless_sweep_elects_clean_leaders_and_unclean_ones_only_where_allowed() -> None:
    # 0: its ISR member 2 is alive; 1: its ISR member 3 is fenced, replica 2 alive; 2: no
    # replica alive; 3: led already.
    image = cluster(
        partitions={
            0: ([1, 2], [2], NO_LEADER),
            1: ([3, 2], [3], NO_LEADER),
            2: ([1, 3], [3], NO_LEADER),
            3: ([2, 1], [2, 1], 2),
        },
        fenced=[1, 3],
    )
    clean = elections.elect_leaderless(image, unclean=False)
    assert {p: c.leader for p, c in changes(clean).items()} == {0: 2}
    unclean = replay(image, elections.elect_leaderless(image, unclean=True))
    assert [(part(unclean, i).leader, part(unclean, i).isr) for i in range(4)] == [
        (2, (2,)),
        (2, (2,)),  # out of sync: it becomes the whole ISR
        (NO_LEADER, (3,)),
        (2, (2, 1)),
    ]
    # unclean=None (never) whatever the static default: as for a controlled shutdown
    assert set(changes(elections.elect_leaderless(image, unclean=None))) == {0}


# -- controlled shutdown -----------------------------------------------------------------------


def test_a_controlled_shutdown_moves_leadership_to_another_isr_member() -> None:
    image = cluster(
        partitions={
            0: ([1, 2, 3], [1, 2, 3], 1),  # led: another ISR member takes over
            1: ([2, 1], [2, 1], 2),  # followed: it leaves the ISR
            2: ([1, 3], [1], 1),  # last ISR member: stays, but leads no more
        }
    )
    records = elections.move_leaders_away(image, 1)
    assert all(r.WhichOneof("record") == "partition_change" for r in records)
    after = replay(image, records)
    assert [(part(after, n).leader, part(after, n).isr) for n in range(3)] == [
        (2, (2, 3)),
        (2, (2,)),
        (NO_LEADER, (1,)),
    ]
    assert after.leaders_of(1) == ()


# -- AlterPartition ----------------------------------------------------------------------------


def change(
    image: MetadataImage,
    isr: Sequence[int],
    *,
    partition_id: int = 0,
    epochs: Mapping[int, int] | None = None,
    **fields: int,
) -> cpb.IsrChange:
    """A change of one partition's ISR at its current epochs (unless ``fields`` say
    otherwise), each member at its registered broker epoch."""
    p = part(image, partition_id)
    epochs = {**{b: epoch_of(b) for b in isr}, **(epochs or {})}
    made = cpb.IsrChange(
        topic_id=ORDERS,
        partition_id=partition_id,
        leader_epoch=p.leader_epoch,
        partition_epoch=p.partition_epoch,
        new_isr=[cpb.IsrMember(broker_id=b, broker_epoch=epochs[b]) for b in isr],
    )
    for name, value in fields.items():
        setattr(made, name, value)
    return made


def alter(
    image: MetadataImage,
    isr: Sequence[int],
    *,
    leader: int = 1,
    broker_epoch: int | None = None,
    **fields: Any,
) -> cpb.AlterPartitionRequest:
    """An AlterPartition request from ``leader`` with one change (see ``change``)."""
    return cpb.AlterPartitionRequest(
        broker_id=leader,
        broker_epoch=epoch_of(leader) if broker_epoch is None else broker_epoch,
        changes=[change(image, isr, **fields)],
    )


def committed(outcome: Outcome[cpb.AlterPartitionResponse]) -> pb.PartitionRecord:
    (result,) = outcome.response.results
    assert result.error == cpb.NONE, result.message
    return result.partition


def test_an_isr_only_change_keeps_the_leader_epoch() -> None:
    image = cluster(partitions={0: ([1, 2, 3], [1, 2, 3], 1)})
    outcome = elections.alter_partition(image, alter(image, [1, 2]))
    assert not changes(outcome.records)[0].HasField("leader")
    p = part(replay(image, outcome.records), 0)
    assert (p.leader, p.isr, p.leader_epoch, p.partition_epoch) == (1, (1, 2), 0, 1)


def test_alter_partition_answers_the_partition_as_committed() -> None:
    image = cluster(partitions={0: ([1, 2, 3], [1], 1)})
    outcome = elections.alter_partition(image, alter(image, [1, 3]))
    p = part(replay(image, outcome.records), 0)
    expected = rec.partition(
        ORDERS, 0, p.replicas, p.isr, p.leader, p.leader_epoch, p.partition_epoch
    )
    assert committed(outcome) == expected.partition
    assert p.isr == (1, 3)


def test_an_unchanged_isr_writes_nothing() -> None:
    image = cluster(partitions={0: ([1, 2, 3], [1, 2], 1)})
    for isr in ([1, 2], [2, 1]):
        outcome = elections.alter_partition(image, alter(image, isr))
        assert outcome.records == ()
        assert list(committed(outcome).isr) == [1, 2]
        assert committed(outcome).partition_epoch == 0


def test_one_request_changes_many_partitions_and_answers_each() -> None:
    """Changes are judged one by one: a refused change writes nothing and holds up none of
    the others; a partition named twice is refused the second time."""
    image = cluster(
        partitions={p: ([1, 2, 3], [1, 2, 3] if p % 2 else [1], 1) for p in range(4)},
        fenced=[3],
    )
    request = cpb.AlterPartitionRequest(
        broker_id=1,
        broker_epoch=epoch_of(1),
        changes=[
            change(image, [1, 2], partition_id=0),  # expand
            change(image, [1, 3], partition_id=2),  # expand with a fenced broker
            change(image, [1], partition_id=1),  # shrink
            change(image, [1, 2], partition_id=3),  # shrink
            change(image, [1, 3], partition_id=1),  # partition 1 again
        ],
    )
    outcome = elections.alter_partition(image, request)
    results = outcome.response.results
    assert [r.error for r in results] == [
        cpb.NONE,
        cpb.INELIGIBLE_REPLICA,
        cpb.NONE,
        cpb.NONE,
        cpb.INVALID_REQUEST,
    ]
    assert "named twice" in results[4].message and "is fenced" in results[1].message
    assert [(p, list(c.isr.ids)) for p, c in changes(outcome.records).items()] == [
        (0, [1, 2]),
        (1, [1]),
        (3, [1, 2]),
    ]
    after = replay(image, outcome.records)
    assert [part(after, p).isr for p in range(4)] == [(1, 2), (1,), (1,), (1, 2)]
    assert [list(results[i].partition.isr) for i in (0, 2, 3)] == [[1, 2], [1], [1, 2]]


def refused(image: MetadataImage, request: cpb.AlterPartitionRequest) -> int:
    """The error the request's only change was refused with (nothing written)."""
    outcome = elections.alter_partition(image, request)
    (result,) = outcome.response.results
    assert outcome.records == () and result.error != cpb.NONE and result.message
    return result.error


def test_alter_partition_refuses_an_unknown_partition() -> None:
    image = cluster(partitions={0: ([1, 2, 3], [1, 2, 3], 1)})
    request = alter(image, [1])
    request.changes[0].partition_id = 5
    assert refused(image, request) == cpb.UNKNOWN_TOPIC_OR_PARTITION
    request = alter(image, [1])
    request.changes[0].topic_id = UNKNOWN
    assert refused(image, request) == cpb.UNKNOWN_TOPIC_OR_PARTITION


def test_alter_partition_refuses_a_stale_broker_epoch_as_a_whole() -> None:
    image = cluster(partitions={0: ([1, 2, 3], [1, 2, 3], 1)})
    for request in (
        alter(image, [1, 2], broker_epoch=epoch_of(1) - 1),
        alter(image, [1, 2], leader=9),
    ):
        with pytest.raises(DecisionError) as e:
            elections.alter_partition(image, request)
        assert e.value.code == cpb.STALE_BROKER_EPOCH and e.value.message


def test_alter_partition_refuses_too_many_changes_as_a_whole() -> None:
    image = cluster(partitions={0: ([1, 2, 3], [1, 2, 3], 1)})
    request = alter(image, [1, 2])
    request.changes.extend([request.changes[0]] * elections.MAX_ISR_CHANGES_PER_REQUEST)
    with pytest.raises(DecisionError) as e:
        elections.alter_partition(image, request)
    assert e.value.code == cpb.INVALID_REQUEST and "at most 10000" in e.value.message


def test_alter_partition_refuses_a_broker_that_is_not_the_leader() -> None:
    image = cluster(partitions={0: ([1, 2, 3], [1, 2, 3], 1)})
    assert refused(image, alter(image, [1, 2], leader=2)) == cpb.FENCED_LEADER_EPOCH


def test_alter_partition_refuses_a_stale_leader_epoch() -> None:
    image = cluster(partitions={0: ([1, 2, 3], [1, 2, 3], 1)})
    assert refused(image, alter(image, [1, 2], leader_epoch=1)) == cpb.FENCED_LEADER_EPOCH


def test_alter_partition_refuses_a_stale_partition_epoch() -> None:
    image = cluster(partitions={0: ([1, 2, 3], [1, 2, 3], 1)})
    stale = alter(image, [1, 2])
    image = replay(image, elections.alter_partition(image, stale).records)
    assert refused(image, stale) == cpb.INVALID_UPDATE_VERSION


@pytest.mark.parametrize(
    ("isr", "epochs"),
    [([1, 4], {}), ([1, 3], {}), ([1, 5], {}), ([1, 2], {2: epoch_of(2) - 1})],
    ids=["not-a-replica", "fenced", "in-controlled-shutdown", "stale-broker-epoch"],
)
def test_alter_partition_refuses_an_ineligible_replica(
    isr: list[int], epochs: dict[int, int]
) -> None:
    image = cluster(
        [1, 2, 3, 4, 5],
        {0: ([1, 2, 3, 5], [1], 1)},
        fenced=[3],
        shutting_down=[5],
    )
    assert refused(image, alter(image, isr, epochs=epochs)) == cpb.INELIGIBLE_REPLICA


@pytest.mark.parametrize(
    "isr", [[], [1, 2, 2], [2, 3]], ids=["empty", "duplicate", "without-the-leader"]
)
def test_alter_partition_refuses_a_malformed_isr(isr: list[int]) -> None:
    image = cluster(partitions={0: ([1, 2, 3], [1, 2, 3], 1)})
    assert refused(image, alter(image, isr)) == cpb.INVALID_REQUEST


# -- preferred leaders -------------------------------------------------------------------------


def preferred_cluster() -> MetadataImage:
    return cluster(
        [1, 2, 3, 4],
        {
            0: ([1, 2], [1, 2], 2),  # electable
            1: ([2, 1], [2, 1], 2),  # already led by its preferred replica
            2: ([3, 1], [3, 1], 1),  # preferred replica fenced
            3: ([4, 1], [1], 1),  # preferred replica not in the ISR
        },
        fenced=[3],
    )


def test_preferred_election_moves_leadership_to_the_first_replica() -> None:
    image = preferred_cluster()
    outcome = elections.elect_preferred_leaders(image, [(ORDERS, 0), (ORDERS, 0)])
    assert outcome.response == [elections.ElectionResult("orders", 0, cpb.NONE, "")]
    assert len(outcome.records) == 1
    p = part(replay(image, outcome.records), 0)
    assert (p.leader, p.leader_epoch, p.isr) == (1, 1, (1, 2))


def test_preferred_election_answers_each_partition() -> None:
    image = preferred_cluster()
    asked: list[tuple[bytes | str, int]] = [
        (ORDERS, 1),
        ("orders", 2),
        (ORDERS, 3),
        ("orders", 9),
        ("nope", 0),
        (UNKNOWN, 0),
    ]
    outcome = elections.elect_preferred_leaders(image, asked)
    assert outcome.records == ()
    assert [(r.topic, r.partition, r.error) for r in outcome.response] == [
        ("orders", 1, cpb.ELECTION_NOT_NEEDED),
        ("orders", 2, cpb.PREFERRED_LEADER_NOT_AVAILABLE),
        ("orders", 3, cpb.PREFERRED_LEADER_NOT_AVAILABLE),
        ("orders", 9, cpb.UNKNOWN_TOPIC_OR_PARTITION),
        ("nope", 0, cpb.UNKNOWN_TOPIC_OR_PARTITION),
        (f"(topic id {UNKNOWN.hex()})", 0, cpb.UNKNOWN_TOPIC_OR_PARTITION),
    ]


def test_electing_every_partition_leaves_out_those_that_need_no_election() -> None:
    image = preferred_cluster()
    outcome = elections.elect_preferred_leaders(image, None)
    assert [(r.partition, r.error) for r in outcome.response] == [
        (0, cpb.NONE),
        (2, cpb.PREFERRED_LEADER_NOT_AVAILABLE),
        (3, cpb.PREFERRED_LEADER_NOT_AVAILABLE),
    ]
    assert part(replay(image, outcome.records), 0).leader == 1


def unclean_cluster() -> MetadataImage:
    """Brokers 3 and 4 fenced; the topic's own config forbids unclean election, which an
    UNCLEAN ElectLeaders does not ask (Kafka's ReplicationControlManager.electLeader)."""
    image = cluster(
        [1, 2, 3, 4],
        {
            0: ([1, 2], [1, 2], 1),  # led: no election needed
            1: ([3, 2, 1], [3, 1], NO_LEADER),  # ISR member 1 alive: a clean election
            2: ([3, 2], [3], NO_LEADER),  # only the out-of-sync 2 alive: unclean
            3: ([3, 4], [3], NO_LEADER),  # no replica alive
        },
        fenced=[3, 4],
    )
    return with_configs(image, (TOPIC, "orders", "false"), (BROKER, "", "false"))


def test_unclean_election_answers_each_partition_and_elects_outside_the_isr_loudly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    image = unclean_cluster()
    asked: list[tuple[bytes | str, int]] = [
        ("orders", 0),
        ("orders", 1),
        (ORDERS, 2),
        ("orders", 3),
        ("orders", 2),  # again: answered once
        ("orders", 9),
        ("nope", 0),
        (UNKNOWN, 0),
    ]
    with caplog.at_level(logging.ERROR, logger="controller.elections"):
        outcome = elections.elect_unclean_leaders(image, asked)
    assert [(r.topic, r.partition, r.error) for r in outcome.response] == [
        ("orders", 0, cpb.ELECTION_NOT_NEEDED),
        ("orders", 1, cpb.NONE),
        ("orders", 2, cpb.NONE),
        ("orders", 3, cpb.ELIGIBLE_LEADERS_NOT_AVAILABLE),
        ("orders", 9, cpb.UNKNOWN_TOPIC_OR_PARTITION),
        ("nope", 0, cpb.UNKNOWN_TOPIC_OR_PARTITION),
        (f"(topic id {UNKNOWN.hex()})", 0, cpb.UNKNOWN_TOPIC_OR_PARTITION),
    ]
    after = replay(image, outcome.records)
    assert set(changes(outcome.records)) == {1, 2}
    clean, unclean = part(after, 1), part(after, 2)
    assert (clean.leader, clean.isr, clean.leader_epoch) == (1, (3, 1), 1)
    assert (unclean.leader, unclean.isr, unclean.leader_epoch) == (2, (2,), 1)
    (said,) = [r.getMessage() for r in caplog.records if "UNCLEAN" in r.getMessage()]
    assert said.startswith("UNCLEAN LEADER ELECTION") and "replica 2, outside the ISR (3,)" in said


def test_unclean_election_of_every_partition_leaves_out_those_with_a_leader() -> None:
    image = unclean_cluster()
    outcome = elections.elect_unclean_leaders(image, None)
    assert [(r.partition, r.error) for r in outcome.response] == [
        (1, cpb.NONE),
        (2, cpb.NONE),
        (3, cpb.ELIGIBLE_LEADERS_NOT_AVAILABLE),
    ]
    after = replay(image, outcome.records)
    assert [
        (r.partition, r.error) for r in elections.elect_unclean_leaders(after, None).response
    ] == [(3, cpb.ELIGIBLE_LEADERS_NOT_AVAILABLE)]


def test_unclean_elections_change_at_most_limit_partitions_per_decision() -> None:
    image = cluster(partitions={p: ([1, 2], [1], NO_LEADER) for p in range(5)}, fenced=[1])
    every = elections.elect_unclean_leaders(image, None, limit=3)
    assert (len(every.records), [r.partition for r in every.response]) == (3, [0, 1, 2])
    after = replay(image, every.records)
    rest = elections.elect_unclean_leaders(after, None, limit=3)
    assert [r.partition for r in rest.response] == [3, 4] and len(rest.records) == 2
    named = [(ORDERS, p) for p in range(5)]
    with pytest.raises(DecisionError) as e:
        elections.elect_unclean_leaders(image, named, limit=3)
    assert e.value.code == cpb.INVALID_REQUEST
    assert len(elections.elect_unclean_leaders(image, named[:3], limit=3).records) == 3


def test_rebalancing_moves_leaders_back_to_live_preferred_replicas() -> None:
    image = cluster(
        partitions={0: ([1, 2, 3], [1, 2, 3], 2), 1: ([2, 3, 1], [2, 3, 1], 3)},
    )
    after = replay(image, elections.rebalance_leaders(image))
    assert (part(after, 0).leader, part(after, 1).leader) == (1, 2)
    assert elections.rebalance_leaders(after) == []


def test_rebalancing_waits_until_a_brokers_imbalance_is_above_the_percentage() -> None:
    # Broker 1 is preferred for four partitions and leads three: 25% imbalance.
    specs = {i: ([1, 2, 3], [1, 2, 3], 1) for i in range(4)}
    specs[0] = ([1, 2, 3], [1, 2, 3], 2)
    image = cluster(partitions=specs)
    assert elections.rebalance_leaders(image, imbalance_percentage=25) == []
    moved = changes(elections.rebalance_leaders(image, imbalance_percentage=24))
    assert list(moved) == [0] and moved[0].leader == 1


def test_rebalancing_leaves_a_partition_whose_preferred_replica_is_fenced() -> None:
    image = cluster(partitions={0: ([1, 2, 3], [2, 3], 2)}, fenced=[1])
    assert elections.rebalance_leaders(image) == []


# -- invariants under random broker churn ------------------------------------------------------

BROKERS = (1, 2, 3, 4)
Op = tuple[str, int, bool]


def churn(image: MetadataImage, op: Op) -> list[pb.MetadataRecord]:
    action, broker_id, unclean = op
    reg = image.brokers[broker_id]
    if action == "fence" and not reg.fenced:
        return elections.fence_broker(image, broker_id, unclean)
    if action == "unfence" and reg.fenced and not reg.in_controlled_shutdown:
        return elections.unfence_broker(image, broker_id)
    if action == "shutdown" and not reg.fenced and not reg.in_controlled_shutdown:
        change = rec.broker_registration_change(
            broker_id, reg.broker_epoch, in_controlled_shutdown=True
        )
        return [change, *elections.move_leaders_away(image, broker_id)]
    return []


def check_leadership(image: MetadataImage) -> None:
    alive = elections.alive_brokers(image)
    for topic in image.topics.values():
        for p in topic.partitions.values():
            assert p.isr, p
            assert p.leader == NO_LEADER or p.leader in alive, p
            gone = [b for b in p.isr if b not in alive]
            assert not gone or p.isr == tuple(gone[:1]), p  # only a last member may be gone
            assert p.leader != NO_LEADER or not set(p.isr) & alive, p


@st.composite
def partition_specs(draw: st.DrawFn) -> dict[int, PartitionSpec]:
    specs: dict[int, PartitionSpec] = {}
    for n in range(draw(st.integers(1, 6))):
        replicas = draw(st.permutations(BROKERS))[: draw(st.integers(1, 3))]
        specs[n] = (replicas, replicas, replicas[0])
    return specs


@settings(max_examples=150, deadline=None)
@given(
    specs=partition_specs(),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["fence", "unfence", "shutdown"]),
            st.sampled_from(BROKERS),
            st.booleans(),
        ),
        max_size=20,
    ),
)
def test_leaders_stay_alive_through_fences_unfences_and_shutdowns(
    specs: dict[int, PartitionSpec], ops: list[Op]
) -> None:
    image = cluster(BROKERS, specs)
    for op in ops:
        image = replay(image, churn(image, op))
        check_leadership(image)
