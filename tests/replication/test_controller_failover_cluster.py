"""Controller failover and a lost controller quorum under replication load, on real
processes: 3 controllers (a Raft quorum) and 3 brokers (``fault_cluster.py``), a topic with
replication factor 3 and min.insync.replicas 2, a confluent-kafka producer writing unique
values with acks=all and ``retries`` 0, and a consumer tailing the topic.

What a failover must not break: a new controller takes over the brokers' sessions (it gives
each a full session timeout from its start, so a live broker is not fenced for the gap with no
active controller), fences a broker that really went away, and elects a new leader from the
ISR. Without a quorum nothing changes and the brokers serve on. In every test no
acknowledged record is lost, and the replicas agree at the end (``check_outcome``).
"""

from __future__ import annotations

import time

import fault_cluster as rc
import pytest

replication_cluster = rc.replication_cluster
Cluster = rc.Cluster

PARTITIONS = 3
CONTROLLERS = (1, 2, 3)
ELECTION_S = 15.0  # a new active controller after the old one died (generous; ~2 s here)


def check_everything_kept(c: Cluster, topic: str, load: rc.Continuous, tail: rc.Tail) -> None:
    """Stop the load; every acknowledged record is in the log once, the replicas agree,
    and the consumer saw only what the log holds."""
    load.stop()
    tail.stop()
    c.note(f"stopped: {load.report.summary()}; consumer saw {len(tail.seen)} {dict(tail.errors)}")
    assert load.unflushed == 0, load.report.summary()
    rc.check_outcome(c, topic, PARTITIONS, [load.report], tail=tail)
    assert len(tail.seen) > 0 and len(load.report.acked) > 600, load.report.summary()


def assert_not_fenced_since(c: Cluster, log_sizes: dict[int, int]) -> None:
    """No broker of ``log_sizes`` (broker -> its log's size at the start) was fenced since:
    a fenced broker that is alive registers again at once, so the ISRs may look the same a
    moment later, but its log says so."""
    fenced = {
        b: [line for line in c.log_since(b, size) if "-> fenced" in line]
        for b, size in log_sizes.items()
    }
    assert not any(fenced.values()), (fenced, c.story())


def wait_other_controller(c: Cluster, old: int) -> int:
    """Until a controller other than ``old`` is active; returns its id."""
    new = rc.wait_for(
        f"a controller other than {old} to be active",
        lambda: next((n for n in [c.active_controller()] if n not in (None, old)), None),
        ELECTION_S,
        0.5,
    )
    c.note(f"controller {new} is active")
    return new


@pytest.mark.slow
@rc.with_controllers(3)
@rc.with_settings(controller={"leader_imbalance_check_interval_s": 3600})
def test_the_active_controller_and_a_leader_killed_together_lose_no_acknowledged_record(
    replication_cluster: Cluster,
) -> None:
    """Round 1: the active controller and the leader of partition 0 die at the same moment
    (one host going down). The new controller must fence the dead broker and move its
    partitions. Round 2: the active controller dies alone; round 3: it is stopped (SIGTERM).
    No broker is fenced, and the producer is acknowledged again at once."""
    c, topic = replication_cluster, "controller-failover"
    c.create_topic(topic, PARTITIONS)
    load = rc.Continuous(c.bootstrap, topic, PARTITIONS, "failover", rc.ONCE)
    with rc.Tail(c, topic, PARTITIONS) as tail, load:
        rc.wait_acks(c, load, 0, 0, 100, "acks before any fault")
        controller = c.active_controller()
        assert controller in CONTROLLERS, controller
        victim = c.partition(topic, 0).leader
        c.kill(controller, victim)
        killed_at = time.monotonic()
        wait_other_controller(c, controller)
        new_leader = rc.wait_new_leader(c, topic, 0, victim, c.session_s + ELECTION_S)
        rc.wait_acks(c, load, killed_at, 0, 100, f"acks from new leader {new_leader}")
        c.start(controller)
        c.start(victim)
        c.wait_full_isr(topic)
        rc.wait_acks(c, load, time.monotonic(), 0, 100, "acks after both came back")

        # Round 2: only the controller, killed; round 3: the next one, stopped (it resigns).
        # The brokers heartbeat to whichever is active; the next one must fence none of them
        # for the time nobody answered.
        for round_, stop in ((2, c.kill), (3, c.terminate)):
            active = c.active_controller()
            assert active in CONTROLLERS, active
            logs = {b: c.log_size(b) for b in rc.BROKERS}
            stop(active)
            stopped_at = time.monotonic()
            next_active = wait_other_controller(c, active)
            for p in range(PARTITIONS):
                rc.wait_acks(
                    c, load, stopped_at, p, 50, f"round {round_}: acks under {next_active}"
                )
            # Past a whole session timeout after the new controller took over: had it
            # started from the old deadlines, or missed the heartbeats, a broker would have
            # been fenced by now (and registered again: look in the brokers' logs).
            time.sleep(c.session_s + 1)
            assert_not_fenced_since(c, logs)
            assert c.unfenced(rc.BROKERS[0]) == list(rc.BROKERS), c.story()
            c.start(active)
    check_everything_kept(c, topic, load, tail)


@pytest.mark.slow
@rc.with_controllers(3)
@rc.with_settings(controller={"leader_imbalance_check_interval_s": 3600})
def test_a_paused_controller_and_broker_resume_into_a_cluster_that_moved_on(
    replication_cluster: Cluster,
) -> None:
    """The active controller and a broker are paused (SIGSTOP) together, longer than a
    session timeout. The other leaders must get their ISR shrinks through the new
    controller (their AlterPartition requests went to the paused one), the paused broker's
    partition must move, and once both resume the old controller must follow the new one
    and the broker rejoin every ISR, with nothing acknowledged lost."""
    c, topic = replication_cluster, "controller-paused"
    c.create_topic(topic, PARTITIONS)
    load = rc.Continuous(c.bootstrap, topic, PARTITIONS, "paused", rc.ONCE)
    with rc.Tail(c, topic, PARTITIONS) as tail, load:
        rc.wait_acks(c, load, 0, 0, 100, "acks before any fault")
        controller = c.active_controller()
        assert controller in CONTROLLERS, controller
        broker = c.partition(topic, 1).leader
        others = {b: c.log_size(b) for b in rc.BROKERS if b != broker}
        c.pause(controller)
        c.pause(broker)
        paused_at = time.monotonic()
        new_controller = wait_other_controller(c, controller)
        c.wait_partitions(
            f"{broker} out of every ISR and leading nothing",
            topic,
            lambda v: all(p.leader not in (broker, -1) and broker not in p.isr for p in v),
            c.session_s + c.lag_s + ELECTION_S,
        )
        for p in range(PARTITIONS):
            rc.wait_acks(c, load, paused_at, p, 50, f"partition {p}: acks without {broker}")
        assert_not_fenced_since(c, others)  # the new controller heard the live brokers
        c.resume(controller)
        c.resume(broker)
        c.wait_full_isr(topic)
        # The resumed controller finds a newer epoch and follows; its pre-vote is refused
        # by voters hearing from their leader, so it does not unseat the new controller.
        assert c.active_controller() == new_controller, c.story()
        rc.wait_acks(c, load, time.monotonic(), 1, 100, "acks after both resumed")
    check_everything_kept(c, topic, load, tail)


@pytest.mark.slow
@rc.with_controllers(3)
@rc.with_settings(controller={"leader_imbalance_check_interval_s": 3600})
def test_brokers_keep_serving_while_the_controller_quorum_is_lost(
    replication_cluster: Cluster,
) -> None:
    """Two of three controllers die: no metadata can change, but brokers keep their
    leaderships and ISRs and acknowledge acks=all writes. A broker that dies meanwhile cannot
    be fenced and its followers' ISR shrinks cannot commit, so writes that need it wait (and
    time out, retriably); once the quorum is back it is fenced, the ISRs shrink, and writes
    go on; nothing acknowledged is lost."""
    c, topic = replication_cluster, "quorum-lost"
    c.create_topic(topic, PARTITIONS)
    load = rc.Continuous(c.bootstrap, topic, PARTITIONS, "quorum", rc.ONCE)
    with rc.Tail(c, topic, PARTITIONS) as tail, load:
        rc.wait_acks(c, load, 0, 0, 100, "acks before any fault")
        views_before = c.partitions(topic, via=rc.BROKERS)
        active = c.active_controller()
        dead = [active, next(n for n in CONTROLLERS if n != active)]
        c.kill(*dead)
        lost_at = time.monotonic()
        # Longer than a session timeout: nobody may fence anybody.
        time.sleep(c.session_s * 2)
        assert c.active_controller() is None, c.story()
        for p in range(PARTITIONS):
            rc.wait_acks(c, load, lost_at, p, 100, f"partition {p}: acks without a quorum")
        assert c.partitions(topic, via=rc.BROKERS) == views_before, c.story()
        assert c.unfenced(rc.BROKERS[0]) == list(rc.BROKERS), c.story()

        victim = c.partition(topic, 0).leader
        c.kill(victim)
        survivors = {b: c.log_size(b) for b in rc.BROKERS if b != victim}
        for controller in dead:
            c.start(controller)
        restored_at = time.monotonic()
        rc.wait_new_leader(c, topic, 0, victim, c.session_s + ELECTION_S)
        for p in range(PARTITIONS):
            rc.wait_acks(c, load, restored_at, p, 50, f"partition {p}: acks after the quorum")
        # The brokers' heartbeats reach the restarted controllers in time: only the dead
        # broker is fenced (were all, it could stay its partitions' last ISR member).
        assert_not_fenced_since(c, survivors)
        c.start(victim)
        c.wait_full_isr(topic)
        rc.wait_acks(c, load, time.monotonic(), 0, 100, "acks with every broker back")
    check_everything_kept(c, topic, load, tail)
