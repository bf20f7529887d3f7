"""Replication under faults, on real processes: 1 controller and 3 brokers per test
(``fault_cluster.py``), topics with replication factor 3 and min.insync.replicas 2,
confluent-kafka clients producing unique values with acks=all.

Unless a test says otherwise the producer has ``retries`` 0 and no idempotence, so every
error the brokers answer reaches a delivery report, except NOT_LEADER_OR_FOLLOWER, which
librdkafka resends without counting a retry. At the end of each test, once every replica has
caught up: the three replicas' stored batches (offsets, leader epoch, CRC) are equal below
the high watermark, and the whole log read from offset 0 keeps every promise made to the
producers (``check_log``: each acknowledged value at its acknowledged offset, nothing
unknown, no value twice except a resend across a leader change).
"""

from __future__ import annotations

import itertools
import time
from collections import Counter

import fault_cluster as rc
import pytest
from confluent_kafka import KafkaError

replication_cluster = rc.replication_cluster
Cluster = rc.Cluster

PARTITIONS = 3


def wait_preferred_leaders(c: Cluster, topic: str) -> None:
    """Auto leader rebalancing (every 5 s here) gives each partition back to its first
    replica, one partition per broker."""
    views = c.wait_partitions(
        f"{topic}: every partition led by its preferred replica",
        topic,
        lambda v: all(p.leader == p.replicas[0] for p in v),
        30,
        via=rc.BROKERS,
    )
    assert Counter(v.leader for v in views) == dict.fromkeys(rc.BROKERS, 1), views


# -- 1. SIGKILL the leader, restart it, SIGKILL the new leader ---------------------------------


@pytest.mark.slow
@rc.with_settings(controller={"leader_imbalance_check_interval_s": 3600})
def test_leaders_killed_in_turn_lose_no_acknowledged_record(replication_cluster: Cluster) -> None:
    """No leader rebalancing here: partition 0 stays with the leader elected after the first
    kill, so the second kill hits that new leader."""
    c, topic = replication_cluster, "killed-leaders"
    c.create_topic(topic, PARTITIONS)
    load = rc.Continuous(c.bootstrap, topic, PARTITIONS, "kill", rc.ONCE)
    with rc.Tail(c, topic, PARTITIONS) as tail, load:
        rc.wait_acks(c, load, 0, 0, 100, "acks before any fault")
        victim = c.partition(topic, 0).leader
        leaders = [victim]
        for round_ in (1, 2):
            c.kill(victim)
            killed_at = time.monotonic()
            new = rc.wait_new_leader(c, topic, 0, victim, c.session_s + 15)
            leaders.append(new)
            rc.wait_acks(c, load, killed_at, 0, 100, f"round {round_}: acks from new leader {new}")
            c.start(victim)
            views = c.wait_full_isr(topic)
            assert views[0].leader == new, f"partition 0 moved on from {new}: {views}"
            rc.wait_acks(c, load, time.monotonic(), 0, 100, f"round {round_}: acks after restart")
            victim = new
    load.stop()
    tail.stop()
    c.note(f"stopped: {load.report.summary()}; consumer saw {len(tail.seen)} {dict(tail.errors)}")
    assert load.unflushed == 0, load.report.summary()
    # Each kill hit the partition's current leader and moved leadership (the third leader
    # may be the first one again, restarted and back in the ISR).
    assert all(a != b for a, b in itertools.pairwise(leaders)), leaders
    rc.check_outcome(c, topic, PARTITIONS, [load.report], tail=tail)
    assert len(tail.seen) > 0 and len(load.report.acked) > 600, load.report.summary()
    # Partition 0 had three leaders, each of which had records acknowledged: its log holds
    # at least three leader epochs, in increasing order, on every replica.
    for broker in rc.BROKERS:
        epochs = c.epochs(broker, topic, 0)
        assert len(epochs) >= 3 and epochs == sorted(epochs), (broker, epochs, c.story())


# -- 2. SIGSTOP the leader beyond the session timeout, then SIGCONT -----------------------------


@pytest.mark.slow
def test_a_paused_leader_acknowledges_nothing_after_losing_leadership_and_is_truncated(
    replication_cluster: Cluster,
) -> None:
    """The leader of partition 0 is stopped (SIGSTOP) for twice the session timeout while a
    producer keeps writing; two Produce requests are left waiting in its socket, one sent
    before and one after the new leader was elected. After SIGCONT it must answer both with
    an error, and its log must come to equal the new leader's."""
    c, topic = replication_cluster, "paused-leader"
    c.create_topic(topic, PARTITIONS)
    load = rc.Continuous(c.bootstrap, topic, PARTITIONS, "pause", rc.ONCE)
    queued = []
    with rc.Tail(c, topic, PARTITIONS) as tail, load:
        rc.wait_acks(c, load, 0, 0, 100, "acks before the pause")
        old = c.partition(topic, 0).leader
        c.pause(old)
        paused_at = time.monotonic()
        queued.append(rc.QueuedProduce(c.address(old), topic, 0, "stale-before-election"))
        new = rc.wait_new_leader(c, topic, 0, old, c.session_s + 15)
        queued.append(rc.QueuedProduce(c.address(old), topic, 0, "stale-after-election"))
        rc.wait_acks(c, load, paused_at, 0, 50, f"acks from the new leader {new}")
        rc.wait_for(
            "a pause twice the session timeout",
            lambda: True if time.monotonic() - paused_at > 2 * c.session_s else None,
            3 * c.session_s,
        )
        log_mark = c.log_size(old)
        c.resume(old)
        resumed_at = time.monotonic()
        answers = {q.value: q.answer(timeout_s=30) for q in queued}
        c.note(f"the old leader {old} answered its queued requests: {answers}")
        c.wait_full_isr(topic)
        rc.wait_acks(c, load, resumed_at, 0, 100, "acks after the old leader rejoined")
    load.stop()
    tail.stop()
    c.note(f"stopped: {load.report.summary()}; consumer saw {len(tail.seen)} {dict(tail.errors)}")
    assert load.unflushed == 0, load.report.summary()
    stale = rc.LoadReport(sent=[q.value for q in queued])
    final = rc.check_outcome(c, topic, PARTITIONS, [load.report, stale], tail=tail)
    acknowledged = {v: a for v, a in answers.items() if a[0] == 0}
    assert not acknowledged, f"the deposed leader acknowledged {acknowledged}\n{c.story()}"
    in_log = [(o, v) for o, v in final[0] if v.startswith("stale-")]
    assert not in_log, f"records sent only to the deposed leader are in the log: {in_log}"
    truncations = [line for line in c.log_since(old, log_mark) if "truncated" in line]
    c.note(f"the old leader's truncations after SIGCONT: {truncations}")
    wait_preferred_leaders(c, topic)


# -- 3. ISR shrink and expand; NOT_ENOUGH_REPLICAS with two replicas down ----------------------


@pytest.mark.slow
@rc.with_settings(
    controller={"broker_session_timeout_ms": 10_000}, broker={"replica_lag_time_max_ms": 2000}
)
def test_isr_shrinks_and_expands_and_acks_all_needs_min_insync_replicas(
    replication_cluster: Cluster,
) -> None:
    """The session timeout (10 s) is well above the lag time (2 s): the ISR shrinks because
    the leader proposes it, while the controller still counts the paused follower alive."""
    c, topic = replication_cluster, "isr-changes"
    [view] = c.create_topic(topic, 1)
    leader, f1, f2 = view.replicas
    report = rc.LoadReport()

    def ok(value: str) -> None:
        report.sent.append(value)
        code, offset = rc.produce_one(c, topic, value)
        assert code is None, f"{value}: {rc.error_name(code or 0)}\n{c.story()}"
        report.acked[value] = (0, offset, time.monotonic())

    ok("isr-0")
    c.pause(f1)
    # Not before the lag time: test_leader.py's
    # test_a_caught_up_follower_that_stops_fetching_leaves_the_isr_only_after_the_lag_time
    # checks that rule with a fake clock; here, that it happens and why (not a fencing).
    c.wait_partitions(
        f"the ISR without the paused {f1}",
        topic,
        lambda v: v[0].isr == tuple(sorted((leader, f2))),
        c.lag_s + c.lag_s / 2 + 8,
        via=[leader, f2],
    )
    listed = c.unfenced(leader)
    assert f1 in listed, f"{f1} was fenced ({listed}) before the leader shrank the ISR"
    ok("isr-1")  # two in sync: min.insync.replicas holds
    c.resume(f1)
    c.wait_partitions(
        f"{f1} back in the ISR", topic, lambda v: v[0].isr == rc.BROKERS, 15, via=rc.BROKERS
    )
    ok("isr-2")

    c.kill(f1)
    c.kill(f2)
    c.wait_partitions(
        f"the ISR down to the leader {leader}",
        topic,
        lambda v: v[0].isr == (leader,) and v[0].leader == leader,
        c.lag_s + c.lag_s / 2 + 10,
        via=[leader],
    )
    end_before = c.log_ends(topic, 0)[leader]
    report.sent.append("isr-refused")
    code, _ = rc.produce_one(c, topic, "isr-refused")
    assert code == KafkaError.NOT_ENOUGH_REPLICAS, (
        f"acks=all with the ISR {leader} alone: {rc.error_name(code) if code else 'acknowledged'}"
        f"\n{c.story()}"
    )
    assert c.log_ends(topic, 0)[leader] == end_before, "the refused record was appended"

    c.start(f1)
    c.wait_partitions(
        f"{f1} back in the ISR", topic, lambda v: set(v[0].isr) == {leader, f1}, 40, via=[leader]
    )
    ok("isr-3")
    c.start(f2)
    final = rc.check_outcome(c, topic, 1, [report])
    assert final[0] == [(0, "isr-0"), (1, "isr-1"), (2, "isr-2"), (3, "isr-3")], final


# -- 4. controlled shutdown and a rolling restart under load -----------------------------------


@pytest.mark.slow
def test_a_rolling_restart_under_load_loses_nothing_and_answers_only_retriable_errors(
    replication_cluster: Cluster,
) -> None:
    """Two producers: one sending each value once (every error it sees must be retriable),
    and one idempotent producer that retries (every record must be acknowledged, once)."""
    c, topic = replication_cluster, "rolling"
    c.create_topic(topic, PARTITIONS)
    once = rc.Continuous(c.bootstrap, topic, PARTITIONS, "once", rc.ONCE)
    idempotent = rc.Continuous(
        c.bootstrap,
        topic,
        PARTITIONS,
        "idem",
        {
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 60_000,
            "topic.metadata.refresh.interval.ms": 1000,
        },
    )
    with once, idempotent:
        rc.wait_acks(c, once, 0, 0, 100, "acks before the restarts")
        for broker in rc.BROKERS:
            led = [v.partition for v in c.partitions(topic) if v.leader == broker]
            took = c.terminate(broker)
            c.note(f"{broker} (leader of {led}) shut down in {took:.1f} s")
            others = [b for b in rc.BROKERS if b != broker]
            views = c.wait_partitions(
                f"no partition led by the stopped {broker}",
                topic,
                lambda v, b=broker: all(p.leader not in (b, -1) for p in v),
                5,
                via=others,
            )
            assert all(broker not in v.isr for v in views), views
            stopped_at = time.monotonic()
            rc.wait_acks(
                c, once, stopped_at, led[0] if led else 0, 30, f"acks while {broker} is down"
            )
            c.start(broker)
            c.wait_full_isr(topic)
            wait_preferred_leaders(c, topic)
            rc.wait_acks(c, once, time.monotonic(), 0, 30, f"acks after {broker} returned")
    for load in (once, idempotent):
        load.stop()
        c.note(f"stopped {load.tag}: {load.report.summary()}")
        assert load.unflushed == 0, load.report.summary()
    final = rc.check_outcome(c, topic, PARTITIONS, [once.report, idempotent.report])
    fatal = {
        rc.error_name(code): text
        for _, code, text, _ in once.report.failed.values()
        if code not in rc.RETRIABLE
    }
    assert not fatal, f"non-retriable errors: {fatal}; {once.report.summary()}\n{c.story()}"
    report = idempotent.report
    assert not report.failed and len(report.acked) == len(report.sent), report.summary()
    # The idempotent producer's records are in the order it sent them, per partition.
    for partition, records in final.items():
        mine = [v for _, v in records if v.startswith("idem-")]
        assert mine == sorted(mine), f"partition {partition}: idempotent records out of order"
