"""Network partitions between running nodes: 1 controller and 3 brokers, each in a network
namespace of its own (``netns_cluster.py``), a topic of one partition with replication factor
3 and min.insync.replicas 2, a producer writing unique values with acks=all and a consumer
tailing it from the test's own namespace, which reaches every node throughout.

Unlike a paused process, a node cut off keeps running: a leader cut off from the controller
and its followers still takes produce requests from clients that reach it and tries to shrink
its ISR; a follower cut off from its leader still heartbeats to the controller; brokers cut
off from the controller still serve with the image they have while the controller fences
them. At the end of each test, as in ``test_cluster_replication.py``: the replicas agree batch
for batch below the high watermark, every acknowledged record is in the log once at its
offset, and the consumer saw nothing the log does not hold.

Needs root (network namespaces): skipped, saying so, elsewhere.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import fault_cluster as rc
import netns_cluster as nc
import pytest

CONTROLLER = 1
TOPIC = "cut"


def _networked(tmp_path: Path, controllers: int) -> Iterator[nc.NetnsCluster]:
    why = nc.available()
    if why is not None:
        pytest.skip(why)
    with nc.running(tmp_path / "cluster", controllers=controllers) as started:
        yield started


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[nc.NetnsCluster]:
    yield from _networked(tmp_path, 1)


@pytest.fixture
def quorum(tmp_path: Path) -> Iterator[nc.NetnsCluster]:
    """As ``cluster``, with three controllers (ids 1-3)."""
    yield from _networked(tmp_path, 3)


def network(c: nc.NetnsCluster) -> nc.Network:
    assert c.network is not None
    return c.network


def latest_epoch(c: nc.NetnsCluster) -> int:
    """The highest leader epoch of a batch any replica of partition 0 stores."""
    return max(max(c.epochs(b, TOPIC, 0), default=-1) for b in rc.BROKERS)


def finish_load(
    c: nc.NetnsCluster,
    load: rc.Continuous,
    tail: rc.Tail,
    extra: list[str],
    others: Sequence[rc.LoadReport] = (),
) -> None:
    """Stop the producer and the consumer; check the outcome with ``extra`` values that were
    sent but may not be acknowledged, and what ``others`` producers saw."""
    load.stop()
    tail.stop()
    c.note(f"stopped: {load.report.summary()}; consumer saw {len(tail.seen)}")
    assert load.unflushed == 0, load.report.summary()
    reports = [load.report, rc.LoadReport(sent=extra), *others]
    final = rc.check_outcome(c, TOPIC, 1, reports, tail=tail)
    in_log = [(o, v) for o, v in final[0] if v in extra]
    assert not in_log, f"records only the cut-off leader took are in the log: {in_log}"


@pytest.mark.slow
def test_a_leader_cut_off_acknowledges_nothing_and_its_tail_is_truncated(
    cluster: nc.NetnsCluster,
) -> None:
    """The leader loses the controller and both followers, not the clients. A request sent to
    it once cut off must not be acknowledged (its followers cannot fetch, and it cannot shrink
    its ISR without the controller); the controller fences it and a follower leads; healed, it
    follows and drops what only it took."""
    c = cluster
    [view] = c.create_topic(TOPIC, 1)
    old = view.leader
    others = [b for b in rc.BROKERS if b != old]
    load = rc.Continuous(c.bootstrap, TOPIC, 1, "cut-leader", rc.ONCE)
    with rc.Tail(c, TOPIC, 1) as tail, load:
        rc.wait_acks(c, load, 0, 0, 100, "acks before the cut")
        network(c).isolate(old, [CONTROLLER, *others])
        cut_at = time.monotonic()
        c.note(f"cut leader {old} off from the controller and brokers {others}")
        queued = rc.QueuedProduce(c.address(old), TOPIC, 0, "to-the-cut-off-leader")
        c.wait_partitions(
            f"a leader other than {old}, which is out of the ISR",
            TOPIC,
            lambda v: v[0].leader in others and old not in v[0].isr,
            c.session_s + 20,
            via=others,
        )
        # librdkafka keeps asking the cut-off leader, which names itself, until a Metadata
        # request happens to go to another broker: 11 s, 16 s, over 34 s in runs seen.
        rc.wait_acks(c, load, cut_at, 0, 50, "acks from the new leader", timeout_s=90)
        answer = queued.answer(timeout_s=30)
        c.note(f"the cut-off leader answered {answer}")
        assert answer[0] != 0, f"the cut-off leader acknowledged a write at {answer[1]}"
        network(c).heal_all()
        healed_at = time.monotonic()
        c.note("healed")
        c.wait_full_isr(TOPIC, 60)
        rc.wait_acks(c, load, healed_at, 0, 50, "acks once the old leader is back in the ISR")
    finish_load(c, load, tail, [queued.value])


@pytest.mark.slow
def test_a_follower_cut_off_from_its_leader_leaves_the_isr_and_rejoins(
    cluster: nc.NetnsCluster,
) -> None:
    """The follower still reaches the controller (it stays unfenced), only not its leader:
    the leader drops it from the ISR after replica_lag_time_max_ms, acks=all goes on with two
    replicas, and once healed it catches up and is back in the ISR."""
    c = cluster
    [view] = c.create_topic(TOPIC, 1)
    leader = view.leader
    follower = next(b for b in rc.BROKERS if b != leader)
    load = rc.Continuous(c.bootstrap, TOPIC, 1, "cut-follower", rc.ONCE)
    with rc.Tail(c, TOPIC, 1) as tail, load:
        rc.wait_acks(c, load, 0, 0, 100, "acks before the cut")
        network(c).cut(leader, follower)
        c.note(f"cut follower {follower} off from leader {leader}")
        c.wait_partitions(
            f"{follower} out of the ISR",
            TOPIC,
            lambda v: (
                v[0].leader == leader and v[0].isr == tuple(b for b in rc.BROKERS if b != follower)
            ),
            c.lag_s + 20,
            via=[leader],
        )
        assert follower in c.unfenced(leader), "the follower was fenced: it reaches the controller"
        rc.wait_acks(c, load, time.monotonic(), 0, 100, "acks with two replicas in sync")
        network(c).heal(leader, follower)
        healed_at = time.monotonic()
        c.note("healed")
        c.wait_full_isr(TOPIC, 60)
        rc.wait_acks(c, load, healed_at, 0, 50, "acks once the follower is back in the ISR")
    finish_load(c, load, tail, [])


@pytest.mark.slow
def test_brokers_cut_off_from_the_controller_lose_nothing_when_it_comes_back(
    cluster: nc.NetnsCluster,
) -> None:
    """The controller loses every broker for twice the session timeout. The brokers still
    reach each other and go on with the image they have (acks=all goes on: the ISR needs no
    change); the controller fences them all. Healed, their next heartbeats unfence them and
    the partition has a leader from its ISR again, with nothing acknowledged lost."""
    c = cluster
    c.create_topic(TOPIC, 1)
    load = rc.Continuous(c.bootstrap, TOPIC, 1, "cut-controller", rc.ONCE)
    with rc.Tail(c, TOPIC, 1) as tail, load:
        rc.wait_acks(c, load, 0, 0, 100, "acks before the cut")
        before = latest_epoch(c)
        network(c).isolate(CONTROLLER, rc.BROKERS)
        cut_at = time.monotonic()
        c.note("cut the controller off from every broker")
        rc.wait_acks(c, load, cut_at, 0, 100, "acks while the controller is cut off")
        rc.wait_for(
            "twice the session timeout",
            lambda: True if time.monotonic() - cut_at > 2 * c.session_s else None,
            3 * c.session_s,
        )
        rc.wait_acks(c, load, time.monotonic(), 0, 50, "acks after the controller fenced all")
        network(c).heal_all()
        c.note("healed")
        # The brokers' views may still be those from before the cut: what shows that they
        # learned of the fencing and recovered is an acks=all write taken since by a leader
        # elected since (a new producer's, one record at a time, to see its epoch).
        fresh = rc.LoadReport()

        def written_at_a_new_epoch() -> bool | None:
            value = f"fresh-{len(fresh.sent)}"
            fresh.sent.append(value)
            code, offset = rc.produce_one(c, TOPIC, value)
            if code is not None:
                fresh.failed[value] = (0, code, rc.error_name(code), time.monotonic())
                return None
            fresh.acked[value] = (0, offset, time.monotonic())
            return True if latest_epoch(c) > before else None

        what = f"an acks=all write at a leader epoch above {before}"
        rc.wait_for(what, written_at_a_new_epoch, 60, 0.5)
        c.note(f"records at leader epoch {latest_epoch(c)}")
        c.wait_full_isr(TOPIC, 60)
        # The running producer carries on too: no broker answered Metadata with no broker
        # while all were fenced (librdkafka would have dropped every broker for good).
        rc.wait_acks(c, load, time.monotonic(), 0, 50, "the running producer after the heal")
    finish_load(c, load, tail, [], [fresh])


CONTROLLERS = (1, 2, 3)


def active_controller(c: nc.NetnsCluster, among: Sequence[int]) -> tuple[int, int] | None:
    """(id, epoch) of the controller of ``among`` that leads the metadata quorum at the
    highest epoch, as their metrics say; None if none does."""
    leaders = []
    for node in among:
        try:
            state = c.raft_state(node, timeout_s=2.0)
        except OSError:
            continue
        if state["role"] == "leader":
            leaders.append((int(float(state["raft_epoch"])), node))
    return None if not leaders else (max(leaders)[1], max(leaders)[0])


@pytest.mark.slow
def test_the_active_controller_cut_off_is_replaced_and_follows_when_healed(
    quorum: nc.NetnsCluster,
) -> None:
    """Three controllers. The active one is cut off from the other two and from every
    broker: it must stop leading (it hears from no majority) and the other two elect one of
    themselves, which the brokers find and which serves a new topic meanwhile. Healed, the
    old one follows the new epoch and its metadata image comes to equal the others'; the
    producer's acknowledged records are all there."""
    c = quorum
    c.create_topic(TOPIC, 1)
    old = rc.wait_for("an active controller", lambda: active_controller(c, CONTROLLERS), 30)
    others = [n for n in CONTROLLERS if n != old[0]]
    load = rc.Continuous(c.bootstrap, TOPIC, 1, "cut-active", rc.ONCE)
    with rc.Tail(c, TOPIC, 1) as tail, load:
        rc.wait_acks(c, load, 0, 0, 100, "acks before the cut")
        network(c).isolate(old[0], [*others, *rc.BROKERS])
        cut_at = time.monotonic()
        c.note(f"cut the active controller {old} (id, epoch) off from {others} and the brokers")
        new = rc.wait_for(
            f"a controller other than {old[0]} active at an epoch above {old[1]}",
            lambda: (found := active_controller(c, others)) and found[1] > old[1] and found,
            30,
        )
        c.note(f"active now: {new} (id, epoch)")
        rc.wait_for(
            f"controller {old[0]} to stop leading",
            lambda: True if c.raft_state(old[0])["role"] != "leader" else None,
            30,
        )
        c.create_topic("made-during-the-cut", 1)  # through a broker, to the new controller
        rc.wait_acks(c, load, cut_at, 0, 50, "acks while cut")
        network(c).heal_all()
        c.note("healed")

        def caught_up() -> bool | None:
            following = c.raft_state(old[0])["role"] == "follower"
            return True if following and c.same_metadata_image(CONTROLLERS) else None

        rc.wait_for(f"controller {old[0]} to follow {new[0]} with the same image", caught_up, 30)
        c.note(f"controller {old[0]} after the heal: {c.metadata_state(old[0])}")
        rc.wait_acks(c, load, time.monotonic(), 0, 50, "acks after the heal")
    finish_load(c, load, tail, [])
