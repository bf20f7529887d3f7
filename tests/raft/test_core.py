"""Unit tests of the sans-I/O core, named after the Raft paper's sections and KRaft's rules.
No sockets and no sleeps: a synchronous harness (cluster.py) moves virtual time."""

from __future__ import annotations

import pytest
from cluster import Cluster
from support import assert_imports_none_of

from raft.core import (
    IllegalTransition,
    LogMeta,
    NotLeader,
    RaftConfig,
    RaftCore,
    RecordTooLarge,
    decode_records,
    record_bytes,
)
from raft.messages import (
    Batch,
    EndQuorumEpochRequest,
    Envelope,
    FetchRequest,
    FetchResponse,
    QuorumState,
    Ready,
    VoteRequest,
    VoteResponse,
)


def elect(cluster: Cluster, until_ms: int = 10_000) -> int:
    cluster.run(until_ms)
    leaders = cluster.leaders()
    assert len(leaders) == 1, leaders
    return leaders[0]


def test_the_core_imports_no_io_modules() -> None:
    banned = {"asyncio", "grpc", "time", "random", "os", "socket", "threading", "select"}
    core = ("core.py", "_base.py", "_roles.py", "_election.py", "_leader.py", "_follower.py")
    assert_imports_none_of((f"raft/{m}" for m in (*core, "messages.py")), banned)


def test_5_2_one_leader_is_elected_and_everyone_follows_it() -> None:
    cluster = Cluster(voters=3)
    leader = elect(cluster)
    epoch = cluster.nodes[leader].core.epoch
    for node_id, node in cluster.nodes.items():
        assert node.core.epoch == epoch
        assert node.core.leader_id == leader
        assert node.core.role == ("leader" if node_id == leader else "follower")
        assert node.state == QuorumState(epoch, node.state.voted_for, leader)  # persisted


def test_5_2_a_single_voter_elects_itself() -> None:
    cluster = Cluster(voters=1)
    assert elect(cluster) == 1
    last = cluster.propose(1, [b"x"])
    cluster.run(cluster.now + 100)
    assert cluster.nodes[1].core.high_watermark == last + 1
    assert cluster.nodes[1].applied == [b"x"]


def test_5_3_records_commit_once_a_majority_has_fetched_them() -> None:
    cluster = Cluster(voters=3)
    leader = elect(cluster)
    followers = [n for n in cluster.nodes if n != leader]
    cluster.cut |= {(leader, followers[0]), (followers[0], leader)}
    last = cluster.propose(leader, [b"a", b"b", b"c"])
    cluster.run(cluster.now + 200)
    assert cluster.nodes[leader].core.high_watermark == last + 1  # leader + one follower
    assert cluster.nodes[followers[1]].applied == [b"a", b"b", b"c"]
    assert cluster.nodes[followers[0]].applied == []


def test_5_4_2_the_high_watermark_waits_for_a_record_of_the_leaders_epoch() -> None:
    cluster = Cluster(voters=3)
    leader = elect(cluster)
    node = cluster.nodes[leader]
    assert node.log[0].is_control and node.log[0].epoch == node.core.epoch
    # The leader-change record itself is what lets the HW move in a new epoch.
    assert node.core.high_watermark == 1


def test_5_4_1_a_candidate_with_a_stale_log_gets_no_vote() -> None:
    config = RaftConfig()
    voter = RaftCore(
        config,
        2,
        frozenset({1, 2, 3}),
        state=QuorumState(3),
        log=LogMeta(0, 10, ((1, 0), (3, 5))),
        seed=1,
        now_ms=0,
    )
    stale = VoteRequest(4, 1, last_epoch=2, last_epoch_end_offset=20, pre_vote=False)
    ready = voter.step(Envelope(1, 2, stale), 0)
    (reply,) = ready.messages
    assert isinstance(reply.payload, VoteResponse) and not reply.payload.granted
    assert voter.epoch == 4  # the higher epoch is still adopted
    fresh = VoteRequest(4, 3, last_epoch=3, last_epoch_end_offset=10, pre_vote=False)
    ready = voter.step(Envelope(3, 2, fresh), 1)
    assert ready.quorum_state == QuorumState(4, 3, -1)  # the vote is persisted before the reply
    assert isinstance(ready.messages[0].payload, VoteResponse) and ready.messages[0].payload.granted


def test_pre_vote_does_not_move_epochs_of_an_isolated_voter() -> None:
    cluster = Cluster(voters=3)
    leader = elect(cluster)
    loner = next(n for n in cluster.nodes if n != leader)
    epoch = cluster.nodes[leader].core.epoch
    for other in cluster.nodes:
        if other != loner:
            cluster.cut |= {(loner, other), (other, loner)}
    cluster.run(cluster.now + 20_000)
    assert cluster.nodes[loner].core.role in ("prospective", "unattached")
    assert cluster.nodes[loner].core.epoch == epoch  # pre-votes only, no epoch inflation
    cluster.cut.clear()
    cluster.run(cluster.now + 10_000)
    assert cluster.leaders() == [leader]
    assert cluster.nodes[leader].core.epoch == epoch


def test_kraft_a_diverged_follower_truncates_to_the_leader() -> None:
    cluster = Cluster(voters=3)
    old = elect(cluster)
    others = [n for n in cluster.nodes if n != old]
    for other in others:
        cluster.cut |= {(old, other), (other, old)}
    cluster.propose(old, [b"lost-1", b"lost-2"])  # written only on the isolated leader
    cluster.run(cluster.now + 100)
    diverged_end = cluster.nodes[old].core.log_end_offset
    cluster.run(cluster.now + 10_000)
    new = [n for n in cluster.leaders() if n != old]
    assert len(new) == 1
    cluster.propose(new[0], [b"kept"])
    cluster.run(cluster.now + 500)
    cluster.cut.clear()
    cluster.run(cluster.now + 10_000)
    node = cluster.nodes[old]
    assert node.core.role == "follower" and node.core.leader_id == new[0]
    assert node.log == cluster.nodes[new[0]].log  # the uncommitted tail was replaced
    assert b"lost-1" not in node.applied and b"kept" in node.applied
    assert diverged_end > 1


def test_check_quorum_a_partitioned_leader_resigns() -> None:
    cluster = Cluster(voters=3)
    leader = elect(cluster)
    for other in cluster.nodes:
        if other != leader:
            cluster.cut |= {(leader, other), (other, leader)}
    cluster.run(cluster.now + 4_000)  # 1.5 x fetch timeout is 3 s
    assert cluster.nodes[leader].core.role != "leader"
    others = [n for n in cluster.nodes if n != leader]
    assert len([n for n in others if cluster.nodes[n].core.role == "leader"]) == 1


def test_end_quorum_epoch_lets_the_others_elect_at_once() -> None:
    cluster = Cluster(voters=3)
    leader = elect(cluster)
    start = cluster.now
    cluster.apply(leader, cluster.nodes[leader].core.resign(cluster.now))
    cluster.run(start + 1_500)  # well before a fetch timeout (2 s) would notice
    new = [n for n in cluster.leaders() if n != leader]
    assert len(new) == 1


def test_an_observer_replicates_but_never_votes() -> None:
    cluster = Cluster(voters=3, observers=1)
    leader = elect(cluster)
    cluster.propose(leader, [b"m"])
    cluster.run(cluster.now + 2_000)
    observer = cluster.nodes[4]
    assert observer.core.role == "observer" and observer.applied == [b"m"]
    assert observer.state.voted_for == -1
    request = VoteRequest(observer.core.epoch + 1, 2, 99, 99, pre_vote=False)
    ready = observer.core.step(Envelope(2, 4, request), cluster.now)
    assert isinstance(ready.messages[0].payload, VoteResponse)
    assert not ready.messages[0].payload.granted


def test_a_commit_reaches_a_fetcher_at_once_not_after_its_long_poll() -> None:
    # The observer's fetch gets "m" with the old HW; the HW moves before its next fetch,
    # which finds nothing new. Parking that fetch would hide the commit for the whole fetch
    # wait (500 ms): the leader answers a fetcher not yet told its HW at once.
    cluster = Cluster(voters=1, observers=1)
    leader = elect(cluster)
    cluster.run(cluster.now + 1_000)  # quiet: the observer's fetch is parked
    cluster.propose(leader, [b"m"])
    cluster.run(cluster.now + 50)
    assert cluster.nodes[2].applied == [b"m"]


def test_proposals_on_a_follower_raise_not_leader_naming_the_leader() -> None:
    cluster = Cluster(voters=3)
    leader = elect(cluster)
    follower = next(n for n in cluster.nodes if n != leader)
    with pytest.raises(NotLeader) as err:
        cluster.nodes[follower].core.propose([b"x"], cluster.now)
    assert err.value.leader_id == leader


def test_an_illegal_role_transition_raises() -> None:
    core = RaftCore(
        RaftConfig(), 1, frozenset({1, 2, 3}), state=QuorumState(), log=LogMeta(), seed=1, now_ms=0
    )
    from raft.core import _Role

    with pytest.raises(IllegalTransition):
        core._transition("leader", _Role("leader"))  # unattached -> leader skips the vote


def _isolate(cluster: Cluster, node: int) -> None:
    for other in cluster.nodes:
        if other != node:
            cluster.cut |= {(node, other), (other, node)}


def test_a_leader_reported_down_is_replaced_within_one_election_timeout() -> None:
    cluster = Cluster(voters=3)
    leader = elect(cluster)
    _isolate(cluster, leader)  # it died: nothing reaches it or comes from it
    killed_at = cluster.now
    for node in cluster.nodes:
        if node != leader:
            cluster.apply(node, cluster.nodes[node].core.peer_unreachable(leader, cluster.now))
    probes = [e.payload for e in cluster.queue if e.destination == leader]
    assert probes and all(isinstance(p, FetchRequest) and p.max_wait_ms == 0 for p in probes)
    cluster.run(killed_at + 1_100)  # within one election timeout (1 s) and its round trips
    new = [n for n in cluster.leaders() if n != leader]
    assert len(new) == 1  # without the report the followers wait out the 2 s fetch timeout


def test_a_wrong_unreachable_report_is_cancelled_by_the_leaders_answer() -> None:
    cluster = Cluster(voters=3)
    leader = elect(cluster)
    epoch = cluster.nodes[leader].core.epoch
    follower = next(n for n in cluster.nodes if n != leader)
    cluster.apply(follower, cluster.nodes[follower].core.peer_unreachable(leader, cluster.now))
    cluster.run(cluster.now + 5_000)
    assert cluster.leaders() == [leader] and cluster.nodes[follower].core.role == "follower"
    assert all(n.core.epoch == epoch for n in cluster.nodes.values())


def test_a_lone_wrong_report_cannot_win_a_pre_vote_while_the_leader_is_heard() -> None:
    cluster = Cluster(voters=3)
    leader = elect(cluster)
    epoch = cluster.nodes[leader].core.epoch
    follower = next(n for n in cluster.nodes if n != leader)
    cluster.cut |= {(leader, follower)}  # its answers are lost: the probe cannot cancel it
    cluster.apply(follower, cluster.nodes[follower].core.peer_unreachable(leader, cluster.now))
    cluster.run(cluster.now + 1_500)  # it campaigns; the other follower still fetches
    assert cluster.nodes[follower].core.role == "prospective"
    assert cluster.leaders() == [leader]
    assert all(n.core.epoch == epoch for n in cluster.nodes.values())


def test_an_unreachable_report_about_a_non_leader_changes_nothing() -> None:
    cluster = Cluster(voters=3)
    leader = elect(cluster)
    follower, other = (n for n in cluster.nodes if n != leader)
    core = cluster.nodes[follower].core
    deadline = core.next_deadline_ms
    ready = core.peer_unreachable(other, cluster.now)
    assert ready.messages == () and core.next_deadline_ms == deadline
    ready = cluster.nodes[leader].core.peer_unreachable(follower, cluster.now)
    assert ready.messages == () and cluster.nodes[leader].core.role == "leader"


# -- batches within max_batch_bytes ------------------------------------------------------------


def _counted_bytes(batch: Batch) -> int:
    return sum(record_bytes(r) for r in decode_records(batch.data))


def test_a_burst_beyond_max_batch_bytes_is_written_in_batches_within_it_and_all_commit() -> None:
    # Once every pending record went into one batch, however large: a burst over the log's
    # max_message_bytes (16 MiB) was refused by every node's log, which stopped the node.
    cluster = Cluster(voters=3, config=RaftConfig(max_batch_bytes=300))
    leader = elect(cluster)
    records = [b"r%02d" % i + b"." * 27 for i in range(40)]  # 30 bytes, counted 50: 6 a batch
    lasts, ready = cluster.nodes[leader].core.propose_all([[r] for r in records], cluster.now)
    cluster.apply(leader, ready)
    last = lasts[-1]
    cluster.run(cluster.now + 1_000)
    batches = [b for b in cluster.nodes[leader].log if not b.is_control]
    assert [len(decode_records(b.data)) for b in batches] == [6] * 6 + [4]
    assert all(_counted_bytes(b) <= 300 for b in batches)
    answers = [e.payload for e in cluster.sent if isinstance(e.payload, FetchResponse)]
    assert any(len(a.batches) > 1 for a in answers)  # followers append several per answer
    for node in cluster.nodes.values():
        assert node.log == cluster.nodes[leader].log
        assert node.core.high_watermark == last + 1
        assert node.applied == records


def test_a_proposal_that_fits_a_batch_is_never_split_and_a_larger_record_is_alone() -> None:
    cluster = Cluster(voters=1, config=RaftConfig(max_batch_bytes=300))
    elect(cluster)
    core = cluster.nodes[1].core
    small = [[b"a%d" % i + b"." * 78, b"b%d" % i + b"." * 78] for i in range(3)]  # 200 each
    large = [b"L" * 400]  # counted 420: over max_batch_bytes, so alone
    lasts, ready = core.propose_all([small[0], small[1], large, small[2]], cluster.now)
    cluster.apply(1, ready)
    assert ready.log_write is not None
    written = [decode_records(b.data) for b in ready.log_write.batches]
    # small[1] would fit beside small[0] only split: it starts the next batch instead.
    assert written == [small[0], small[1], large, small[2]]
    assert lasts == [2, 4, 5, 7]  # each proposal's last offset, after the leader-change record
    cluster.run(cluster.now + 100)
    assert cluster.nodes[1].applied == [*small[0], *small[1], *large, *small[2]]


def test_a_proposal_beyond_max_batch_bytes_that_the_log_stores_stays_whole() -> None:
    # A controller decision is one proposal: split over batches, a leader failing midway
    # could commit part of it. Only what no batch of the log could hold is split.
    cluster = Cluster(voters=1, config=RaftConfig(max_batch_bytes=300), log_max_batch_bytes=1_000)
    elect(cluster)
    core = cluster.nodes[1].core
    decision = [b"d%02d" % i + b"." * 27 for i in range(10)]  # counted 500: over 300, under 1,000
    beyond = [b"e%02d" % i + b"." * 27 for i in range(30)]  # counted 1,500: no batch holds it
    _, ready = core.propose_all([decision, beyond], cluster.now)
    cluster.apply(1, ready)
    assert ready.log_write is not None
    written = [decode_records(b.data) for b in ready.log_write.batches]
    assert written[0] == decision
    assert [len(b) for b in written[1:]] == [6] * 5  # split within max_batch_bytes
    assert [r for b in written[1:] for r in b] == beyond


def test_a_record_the_log_cannot_store_is_refused_and_nothing_of_its_proposal_queued() -> None:
    cluster = Cluster(voters=1, log_max_batch_bytes=1_000)
    elect(cluster)
    core = cluster.nodes[1].core
    assert core.max_record_bytes == 980  # alone in a batch, counted 1,000
    fits = b"f" * 980
    with pytest.raises(RecordTooLarge) as err:
        core.propose([b"small", fits + b"!"], cluster.now)
    assert err.value.size_bytes == 981 and "981 bytes" in str(err.value)
    with pytest.raises(ValueError, match="at least one record"):
        core.propose([], cluster.now)
    last = cluster.propose(1, [b"small", fits])
    cluster.run(cluster.now + 100)
    assert last == 2  # the refused proposal took no offsets
    assert cluster.nodes[1].applied == [b"small", fits]
    assert core.role == "leader"


def test_batches_stay_within_what_the_log_stores_whatever_max_batch_bytes_says() -> None:
    cluster = Cluster(voters=1, config=RaftConfig(max_batch_bytes=10_000), log_max_batch_bytes=500)
    elect(cluster)
    cluster.propose(1, [b"r%02d" % i + b"." * 77 for i in range(20)])  # counted 100 each
    batches = [b for b in cluster.nodes[1].log if not b.is_control]
    assert [len(decode_records(b.data)) for b in batches] == [5] * 4


# -- resignation: EndQuorumEpoch names the successors -------------------------------------------


def _resign_with_one_voter_behind(voters: int) -> tuple[Cluster, int, int, Ready]:
    """Elect, let one follower miss a record, then resign: (cluster, leader, behind, Ready)."""
    cluster = Cluster(voters=voters)
    leader = elect(cluster)
    behind = min(n for n in cluster.nodes if n != leader)
    cluster.cut |= {(leader, behind), (behind, leader)}
    cluster.propose(leader, [b"m"])
    cluster.run(cluster.now + 100)
    cluster.cut.clear()
    return cluster, leader, behind, cluster.nodes[leader].core.resign(cluster.now)


def test_a_resigning_leader_names_the_other_voters_most_caught_up_first() -> None:
    cluster, leader, behind, ready = _resign_with_one_voter_behind(voters=5)
    (request,) = {envelope.payload for envelope in ready.messages}  # one, sent to each voter
    assert isinstance(request, EndQuorumEpochRequest) and len(ready.messages) == 4
    caught_up = sorted(n for n in cluster.nodes if n not in (leader, behind))  # ties by id
    assert request.preferred_successors == (*caught_up, behind)


def test_the_most_caught_up_voter_campaigns_at_once_and_the_next_50_ms_later() -> None:
    cluster, leader, behind, ready = _resign_with_one_voter_behind(voters=3)
    ahead = next(n for n in cluster.nodes if n not in (leader, behind))
    now = cluster.now
    for envelope in ready.messages:
        cluster.apply(
            envelope.destination, cluster.nodes[envelope.destination].core.step(envelope, now)
        )
    # Named nobody, each voter waited 3 x 50 ms plus a random backoff.
    assert cluster.nodes[ahead].core.next_deadline_ms == now
    assert cluster.nodes[behind].core.next_deadline_ms == now + 50
    cluster.run(now + 20)
    assert cluster.leaders() == [ahead]


def test_five_voters_elect_the_first_successor_at_once_after_a_resignation() -> None:
    # The other followers once refused its pre-vote: they had heard from the leader within
    # the fetch timeout, so the new leader came only once that had run out (about 2 s).
    cluster, leader, _, ready = _resign_with_one_voter_behind(voters=5)
    request = ready.messages[0].payload
    assert isinstance(request, EndQuorumEpochRequest)
    start = cluster.now
    cluster.apply(leader, ready)
    cluster.run(start + 100)
    assert cluster.leaders() == [request.preferred_successors[0]]
