"""Broker lifecycle: one test per rule of controller/brokers.py (registration, the heartbeat
state table, session expiry). Every decision's records are replayed through ``MetadataDelta``
(the shared helpers of test_elections.py) to prove that they apply cleanly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from test_elections import NO_LEADER, cluster, epoch_of, incarnation, part, replay

from controller import records as rec
from controller.brokers import (
    BrokerSession,
    broker_heartbeat,
    fence_expired_brokers,
    register_broker,
)
from controller.image import MetadataImage
from controller.outcome import DecisionError, Outcome
from proto import controller_pb2 as cpb
from proto import metadata_pb2 as pb

NOW_MS = 1_000_000
TIMEOUT_MS = 9_000
REGISTERED_AT = 50  # the commit offset of each test broker's registration


def registration(
    broker_id: int, /, generation: int = 0, **fields: Any
) -> cpb.RegisterBrokerRequest:
    request = cpb.RegisterBrokerRequest(
        broker_id=broker_id,
        incarnation_id=incarnation(broker_id, generation),
        listeners=[pb.Listener(name="PLAINTEXT", host=f"h{broker_id}", port=9092)],
    )
    for name, value in fields.items():
        if name == "listeners":
            del request.listeners[:]
            request.listeners.extend(value)
        else:
            setattr(request, name, value)
    return request


def session(broker_id: int, last_heartbeat_ms: int = NOW_MS, **fields: int) -> BrokerSession:
    values = {
        "broker_id": broker_id,
        "broker_epoch": epoch_of(broker_id),
        "last_heartbeat_ms": last_heartbeat_ms,
        "metadata_offset": REGISTERED_AT,
        "caught_up_offset": REGISTERED_AT,
        **fields,
    }
    return BrokerSession(**values)


def sessions(*items: BrokerSession) -> Mapping[int, BrokerSession]:
    return {s.broker_id: s for s in items}


# -- registration ------------------------------------------------------------------------------


def test_a_new_broker_registers_fenced_with_the_next_broker_epoch() -> None:
    image = cluster()
    outcome = register_broker(image, registration(7, rack="r1"), {}, NOW_MS, TIMEOUT_MS)
    assert outcome.response.broker_epoch == image.next_broker_epoch == epoch_of(3) + 1
    after = replay(image, outcome.records)
    b = after.brokers[7]
    assert (b.broker_epoch, b.fenced, b.rack, b.incarnation_id) == (
        epoch_of(3) + 1,
        True,
        "r1",
        incarnation(7),
    )
    assert [tuple(x) for x in b.listeners] == [("PLAINTEXT", "h7", 9092)]


@pytest.mark.parametrize(
    "fields",
    [
        {"broker_id": -1},
        {"incarnation_id": b"short"},
        {"listeners": []},
        {"listeners": [pb.Listener(name="", host="h", port=9092)]},
        {"listeners": [pb.Listener(name="P", host="", port=9092)]},
        {"listeners": [pb.Listener(name="P", host="h", port=0)]},
        {"listeners": [pb.Listener(name="P", host="h", port=65536)]},
        {"listeners": [pb.Listener(name="P", host="h", port=1)] * 2},
    ],
    ids=[
        "negative-id",
        "short-incarnation",
        "no-listener",
        "unnamed-listener",
        "no-host",
        "port-0",
        "port-65536",
        "repeated-listener",
    ],
)
def test_registration_refuses_bad_input(fields: dict[str, Any]) -> None:
    with pytest.raises(DecisionError) as e:
        register_broker(cluster(), registration(7, **fields), {}, NOW_MS, TIMEOUT_MS)
    assert e.value.code == cpb.INVALID_REQUEST
    assert "registration of broker" in e.value.message


def test_a_retry_by_the_same_incarnation_returns_the_same_epoch_without_records() -> None:
    image = cluster()
    outcome = register_broker(image, registration(2), sessions(session(2)), NOW_MS, TIMEOUT_MS)
    assert outcome == Outcome((), cpb.RegisterBrokerResponse(broker_epoch=epoch_of(2)))


def test_the_same_incarnation_with_other_listeners_is_refused() -> None:
    request = registration(2, listeners=[pb.Listener(name="PLAINTEXT", host="h9", port=1)])
    with pytest.raises(DecisionError) as e:
        register_broker(cluster(), request, {}, NOW_MS, TIMEOUT_MS)
    assert e.value.code == cpb.INVALID_REQUEST


def test_a_second_live_process_with_the_same_id_is_refused() -> None:
    live = sessions(session(2, last_heartbeat_ms=NOW_MS - TIMEOUT_MS))
    with pytest.raises(DecisionError) as e:
        register_broker(cluster(), registration(2, generation=1), live, NOW_MS, TIMEOUT_MS)
    assert e.value.code == cpb.DUPLICATE_BROKER_REGISTRATION


def test_a_new_incarnation_takes_over_once_the_session_expired() -> None:
    image = cluster(partitions={0: ([2, 1, 3], [2, 1, 3], 2), 1: ([2, 3], [2], 2)})
    expired = sessions(session(2, last_heartbeat_ms=NOW_MS - TIMEOUT_MS - 1))
    outcome = register_broker(image, registration(2, generation=1), expired, NOW_MS, TIMEOUT_MS)
    assert outcome.records[-1].WhichOneof("record") == "register_broker"
    after = replay(image, outcome.records)
    b = after.brokers[2]
    assert (b.broker_epoch, b.fenced, b.incarnation_id) == (
        outcome.response.broker_epoch,
        True,
        incarnation(2, 1),
    )
    # The previous incarnation led both: it leaves the ISR (but stays as a last member).
    assert (part(after, 0).leader, part(after, 0).isr) == (1, (1, 3))
    assert (part(after, 1).leader, part(after, 1).isr) == (NO_LEADER, (2,))


def test_a_new_incarnation_registers_only_once_the_previous_left_every_partition() -> None:
    """One decision changes at most ``limit`` partitions: the previous incarnation leaves
    them over several attempts, each answered REQUEST_TIMED_OUT with nothing registered,
    and the registration comes only when none is left (else the new process would lead
    what the old one led, on a log that may have lost data)."""
    image = cluster(partitions={p: ([2, 1], [2, 1], 2) for p in range(5)})
    request = registration(2, generation=1)
    attempts = []
    while True:
        outcome = register_broker(image, request, {}, NOW_MS, TIMEOUT_MS, limit=2)
        attempts.append(outcome.response.header.error)
        image = replay(image, outcome.records)
        if outcome.response.header.error == cpb.NONE:
            break
        assert image.brokers[2].incarnation_id == incarnation(2)  # not registered yet
        assert len(attempts) < 10
    assert attempts == [cpb.REQUEST_TIMED_OUT, cpb.REQUEST_TIMED_OUT, cpb.NONE]
    assert image.brokers[2].incarnation_id == incarnation(2, 1)
    assert all(part(image, p).leader == 1 and part(image, p).isr == (1,) for p in range(5))


def test_a_session_of_an_earlier_registration_does_not_block_a_new_incarnation() -> None:
    old = sessions(session(2, broker_epoch=epoch_of(2) - 1))
    outcome = register_broker(cluster(), registration(2, generation=1), old, NOW_MS, TIMEOUT_MS)
    assert outcome.response.broker_epoch == epoch_of(3) + 1


# -- heartbeats --------------------------------------------------------------------------------


def heartbeat(
    image: MetadataImage,
    broker_id: int,
    *,
    offset: int = REGISTERED_AT,
    sess: BrokerSession | None = None,
    committed: int = REGISTERED_AT,
    unclean: bool = False,
    **flags: bool | int,
) -> Outcome[cpb.BrokerHeartbeatResponse]:
    request = cpb.BrokerHeartbeatRequest(
        broker_id=broker_id, broker_epoch=epoch_of(broker_id), metadata_offset=offset
    )
    for name, value in flags.items():
        setattr(request, name, value)
    return broker_heartbeat(
        image, request, sess or session(broker_id), committed, NOW_MS, unclean=unclean
    )


def flags(outcome: Outcome[cpb.BrokerHeartbeatResponse]) -> tuple[bool, bool, bool]:
    r = outcome.response
    return r.is_caught_up, r.is_fenced, r.should_shut_down


def test_a_heartbeat_from_an_unknown_broker_is_refused() -> None:
    with pytest.raises(DecisionError) as e:
        heartbeat(cluster(), 9)
    assert e.value.code == cpb.BROKER_ID_NOT_REGISTERED


def test_a_heartbeat_with_a_stale_broker_epoch_is_refused() -> None:
    with pytest.raises(DecisionError) as e:
        heartbeat(cluster(), 2, broker_epoch=epoch_of(2) - 1)
    assert e.value.code == cpb.STALE_BROKER_EPOCH


def test_an_ordinary_heartbeat_changes_nothing() -> None:
    outcome = heartbeat(cluster(), 2)
    assert outcome.records == ()
    assert flags(outcome) == (True, False, False)


def test_a_fenced_broker_stays_fenced_until_it_has_caught_up() -> None:
    image = cluster(fenced=[2])
    behind = heartbeat(image, 2, offset=REGISTERED_AT - 1)
    assert (behind.records, flags(behind)) == ((), (False, True, False))
    caught_up = heartbeat(image, 2, offset=REGISTERED_AT)
    assert flags(caught_up) == (True, False, False)
    assert not replay(image, caught_up.records).brokers[2].fenced


def test_without_a_session_the_broker_must_reach_the_committed_offset() -> None:
    image = cluster(fenced=[2])
    request = cpb.BrokerHeartbeatRequest(broker_id=2, broker_epoch=epoch_of(2), metadata_offset=60)
    assert broker_heartbeat(image, request, None, 61, NOW_MS).response.is_fenced
    assert not broker_heartbeat(image, request, None, 60, NOW_MS).response.is_fenced


def test_unfencing_elects_the_broker_where_it_is_the_last_isr_member() -> None:
    image = cluster(partitions={0: ([2, 1], [2], NO_LEADER)}, fenced=[2])
    after = replay(image, heartbeat(image, 2).records)
    assert part(after, 0).leader == 2


def test_want_fence_fences_the_broker_and_moves_its_leaders() -> None:
    image = cluster(partitions={0: ([2, 1], [2, 1], 2)})
    outcome = heartbeat(image, 2, want_fence=True)
    assert flags(outcome) == (True, True, False)
    after = replay(image, outcome.records)
    assert after.brokers[2].fenced
    assert (part(after, 0).leader, part(after, 0).isr) == (1, (1,))


def test_want_fence_keeps_a_caught_up_fenced_broker_fenced() -> None:
    outcome = heartbeat(cluster(fenced=[2]), 2, want_fence=True)
    assert (outcome.records, flags(outcome)) == ((), (True, True, False))


def test_a_controlled_shutdown_moves_leadership_away_before_the_broker_is_let_go() -> None:
    image = cluster(partitions={0: ([2, 1, 3], [2, 1, 3], 2), 1: ([1, 2], [1, 2], 1)})
    first = heartbeat(image, 2, want_shutdown=True)
    assert first.records[0] == rec.broker_registration_change(
        2, epoch_of(2), in_controlled_shutdown=True
    )
    assert flags(first) == (True, False, False)
    image = replay(image, first.records)
    assert image.brokers[2].in_controlled_shutdown and not image.brokers[2].fenced
    assert (part(image, 0).leader, part(image, 0).isr, part(image, 1).isr) == (1, (1, 3), (1,))

    second = heartbeat(image, 2, want_shutdown=True)
    assert flags(second) == (True, True, True)
    image = replay(image, second.records)
    assert image.brokers[2].fenced

    third = heartbeat(image, 2, want_shutdown=True)
    assert (third.records, flags(third)) == ((), (True, True, True))


def test_a_controlled_shutdown_is_not_called_off() -> None:
    image = cluster(partitions={0: ([2, 1], [2, 1], 2)}, shutting_down=[2])
    outcome = heartbeat(image, 2)
    assert flags(outcome) == (True, False, False)
    image = replay(image, outcome.records)
    assert part(image, 0).leader == 1
    assert flags(heartbeat(image, 2)) == (True, True, True)


def test_a_broker_that_leads_nothing_shuts_down_at_once() -> None:
    image = cluster(partitions={0: ([1, 2], [1, 2], 1)})
    outcome = heartbeat(image, 2, want_shutdown=True)
    assert flags(outcome) == (True, True, True)
    after = replay(image, outcome.records)
    assert after.brokers[2].fenced
    assert part(after, 0).isr == (1,)


def test_a_fenced_broker_asking_to_shut_down_may_go_at_once() -> None:
    outcome = heartbeat(cluster(fenced=[2]), 2, offset=0, want_shutdown=True)
    assert (outcome.records, flags(outcome)) == ((), (False, True, True))


# -- session expiry ----------------------------------------------------------------------------


def test_brokers_whose_session_expired_are_fenced() -> None:
    image = cluster([1, 2, 3, 4], {0: ([1, 2], [1, 2], 1)}, fenced=[4])
    live = sessions(
        session(1, NOW_MS - TIMEOUT_MS - 1),  # expired
        session(2, NOW_MS - TIMEOUT_MS),  # just within the timeout
        session(3, NOW_MS),
        session(4, 0),  # expired, but already fenced
    )
    outcome = fence_expired_brokers(image, live, NOW_MS, TIMEOUT_MS, unclean=False)
    assert outcome.response == [1]
    after = replay(image, outcome.records)
    assert after.brokers[1].fenced
    assert (part(after, 0).leader, part(after, 0).isr) == (2, (2,))


def test_brokers_without_a_session_for_their_registration_are_not_fenced() -> None:
    stale = sessions(session(1, 0, broker_epoch=epoch_of(1) - 1))
    outcome = fence_expired_brokers(cluster(), stale, NOW_MS, TIMEOUT_MS, unclean=False)
    assert outcome == Outcome((), [])


def test_a_leader_and_its_successor_expiring_together_leave_a_live_leader() -> None:
    image = cluster(partitions={0: ([1, 2, 3], [1, 2, 3], 1)})
    live = sessions(session(1, 0), session(2, 0), session(3, NOW_MS))
    outcome = fence_expired_brokers(image, live, NOW_MS, TIMEOUT_MS, unclean=False)
    assert outcome.response == [1, 2]
    p = part(replay(image, outcome.records), 0)
    assert (p.leader, p.isr) == (3, (3,))


def test_an_unfencing_heartbeat_elects_an_out_of_sync_replica_only_when_unclean() -> None:
    image = cluster(partitions={0: ([1, 2], [1], NO_LEADER)}, fenced=[1, 2])
    for unclean, leader in ((False, NO_LEADER), (True, 2)):
        outcome = heartbeat(image, 2, unclean=unclean)
        assert flags(outcome) == (True, False, False)
        assert part(replay(image, outcome.records), 0).leader == leader


def test_expiry_elects_unclean_only_when_enabled() -> None:
    image = cluster(partitions={0: ([1, 2], [1], 1)})
    live = sessions(session(1, 0), session(2, NOW_MS))
    for unclean, leader in ((False, NO_LEADER), (True, 2)):
        outcome = fence_expired_brokers(image, live, NOW_MS, TIMEOUT_MS, unclean=unclean)
        assert part(replay(image, outcome.records), 0).leader == leader
