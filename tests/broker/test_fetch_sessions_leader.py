"""Follower fetch sessions on the leader, in one process: an incremental follower fetch naming
nothing still reads from the session's positions, reports the follower's position (so an
idle follower stays caught up and in the ISR), and answers only partitions with news. A
partition found quiet is watched by the session and skipped by its later fetches until it
changes; the fetches skipped still count for the ISR.

The in-process leader of dispatch_leader.py with "orders" partitions 0 and 1, a settable
clock, and ISR proposals recorded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dispatch_leader import FETCH_V, FOLLOWER, ME, TOPIC_ID, DispatchLeader, values
from support import FakeClock

import broker.fetch_session
from broker.protocol import ApiKey, ErrorCode
from controller import records as rec
from controller.image import MetadataDelta
from replication.partition import Partition

LAG_MS = 30_000


class Leader(DispatchLeader):
    def __init__(self, data_dir: Path) -> None:
        super().__init__(data_dir, 2, clock=FakeClock(1_000_000), lag_ms=LAG_MS, propose=True)

    def fetch(
        self,
        session_id: int,
        epoch: int,
        offsets: dict[int, int],
        *,
        forgotten: list[int] | None = None,
        wait_ms: int = 0,
    ) -> Any:
        fields = {
            p: {"fetch_offset": offset, "last_fetched_epoch": 0 if offset else -1}
            for p, offset in offsets.items()
        }
        body = self.fetch_body(
            fields,
            wait_ms=wait_ms,
            session_id=session_id,
            session_epoch=epoch,
            forgotten=forgotten or [],
        )
        return self.send(ApiKey.FETCH, FETCH_V, body)


def answers(response: Any) -> dict[int, Any]:
    assert response.error_code == ErrorCode.NONE, response.error_code
    return {p.partition_index: p for t in response.responses for p in t.partitions}


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[Leader]:
    made = Leader(tmp_path / "data")
    yield made
    made.logs.shutdown()


def test_an_incremental_follower_fetch_reads_from_the_session_s_positions(leader: Leader) -> None:
    async def main() -> None:
        opened = leader.fetch(0, 0, {0: 0, 1: 0})
        session = opened.session_id
        assert session > 0 and sorted(answers(opened)) == [0, 1]
        produced = asyncio.ensure_future(leader.produce([b"a", b"b"], partition=0))
        await asyncio.sleep(0.05)
        got = answers(leader.fetch(session, 1, {}))  # names nothing: from offset 0
        assert list(got) == [0] and values(got[0].records) == [b"a", b"b"]
        assert not produced.done()
        moved = answers(leader.fetch(session, 2, {0: 2}))  # its position moved: the HW moves
        assert list(moved) == [0] and moved[0].high_watermark == 2
        assert values(moved[0].records) == []
        answer = (await produced).responses[0].partition_responses[0]
        assert answer.error_code == ErrorCode.NONE
        assert answers(leader.fetch(session, 3, {})) == {}  # no news anywhere

    asyncio.run(main())


def test_a_parked_incremental_fetch_answers_only_the_partition_appended_to(
    leader: Leader,
) -> None:
    async def main() -> None:
        session = leader.fetch(0, 0, {0: 0, 1: 0}).session_id
        parked = asyncio.ensure_future(leader.fetch(session, 1, {}, wait_ms=5000))
        await asyncio.sleep(0.05)
        assert not parked.done()
        leader.produce([b"x"], partition=1, acks=1)
        got = answers(await asyncio.wait_for(parked, 5))
        assert list(got) == [1] and values(got[1].records) == [b"x"]

    asyncio.run(main())


def test_forgotten_partitions_are_neither_fetched_nor_answered(leader: Leader) -> None:
    async def main() -> None:
        session = leader.fetch(0, 0, {0: 0, 1: 0}).session_id
        assert answers(leader.fetch(session, 1, {}, forgotten=[1])) == {}
        leader.produce([b"x"], partition=1, acks=1)
        assert answers(leader.fetch(session, 2, {})) == {}
        leader.produce([b"y"], partition=0, acks=1)
        assert list(answers(leader.fetch(session, 3, {}))) == [0]

    asyncio.run(main())


def test_an_idle_follower_fetching_incrementally_stays_in_the_isr(leader: Leader) -> None:
    async def main() -> None:
        session = leader.fetch(0, 0, {0: 0, 1: 0}).session_id
        for epoch in range(1, 5):  # four lag times, one fetch naming nothing every half
            leader.clock.advance(LAG_MS // 2)
            assert answers(leader.fetch(session, epoch, {})) == {}
            leader.replicas.shrink_isrs()
        assert leader.proposals == []
        # The same time without a fetch: the follower is out of sync on both partitions.
        leader.clock.advance(LAG_MS + 1)
        leader.replicas.shrink_isrs()
        assert sorted(leader.proposals) == [(("orders", 0), (ME,)), (("orders", 1), (ME,))]

    asyncio.run(main())


def test_a_parked_incremental_fetch_answers_a_partition_that_moved_while_it_waited(
    leader: Leader,
) -> None:
    """Quiet partitions are not read or answered; a leadership change wakes a parked fetch,
    which then looks at every partition again (not only the ones appended to) and answers
    the moved one's error."""

    async def main() -> None:
        session = leader.fetch(0, 0, {0: 0, 1: 0}).session_id
        parked = asyncio.ensure_future(leader.fetch(session, 1, {}, wait_ms=5000))
        await asyncio.sleep(0.05)
        assert not parked.done()
        delta = MetadataDelta(leader.image)
        delta.replay(rec.partition_change(TOPIC_ID, 1, leader=FOLLOWER), leader.image.offset + 1)
        leader.image = delta.apply()
        leader.replicas.apply(leader.image)
        got = answers(await asyncio.wait_for(parked, 5))
        # its epoch is the old leader's: fenced first (Kafka's order), a refetch learns more
        assert list(got) == [1] and got[1].error_code == ErrorCode.FENCED_LEADER_EPOCH

    asyncio.run(main())


def _count_quiet_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The partition id of every ``Partition.read_for_quiet_follower`` call from now on."""
    calls: list[int] = []
    real = Partition.read_for_quiet_follower

    def counted(self: Partition, *args: Any, **kwargs: Any) -> bool:
        calls.append(self.partition_id)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Partition, "read_for_quiet_follower", counted)
    return calls


def test_a_follower_fetch_skips_the_partitions_its_session_watches(
    leader: Leader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found quiet once, a partition is not looked at again until it changes: a fetch costs
    what changed, not the whole session."""
    checks = _count_quiet_checks(monkeypatch)

    async def main() -> None:
        session = leader.fetch(0, 0, {0: 0, 1: 0}).session_id
        assert answers(leader.fetch(session, 1, {})) == {}
        assert sorted(checks) == [0, 1]
        for epoch in range(2, 6):
            leader.clock.advance(100)
            assert answers(leader.fetch(session, epoch, {})) == {}
        assert sorted(checks) == [0, 1], "watched partitions were looked at again"
        leader.produce([b"z"], partition=0, acks=1)
        got = answers(leader.fetch(session, 6, {}))
        assert list(got) == [0] and values(got[0].records) == [b"z"]
        assert sorted(checks) == [0, 0, 1]  # partition 0 changed; 1 is still watched

    asyncio.run(main())


def test_watched_partitions_keep_a_fetching_follower_in_the_isr_and_a_silent_one_leaves(
    leader: Leader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fetches a watch skips are noted when the ISR is checked: as caught up at each
    fetch of the session. A partition the session forgets no longer counts them."""
    monkeypatch.setattr(broker.fetch_session, "QUIET_RECHECK_MS", 10**12)  # watches stay
    checks = _count_quiet_checks(monkeypatch)

    async def main() -> None:
        session = leader.fetch(0, 0, {0: 0, 1: 0}).session_id
        for epoch in range(1, 7):  # three lag times, a fetch naming nothing every half
            leader.clock.advance(LAG_MS // 2)
            forgotten = [1] if epoch == 3 else []
            assert answers(leader.fetch(session, epoch, {}, forgotten=forgotten)) == {}
            leader.replicas.shrink_isrs()
        assert sorted(checks) == [0, 1], "the fetches were not skipped"
        # Partition 1, forgotten at the third fetch, counts none after it; partition 0 all.
        assert leader.proposals == [(("orders", 1), (ME,))]
        leader.clock.advance(LAG_MS + 1)  # no fetch for a whole lag time
        leader.replicas.shrink_isrs()
        assert leader.proposals[1:] == [(("orders", 0), (ME,))]

    asyncio.run(main())


def test_a_watched_partition_s_new_log_start_reaches_the_follower_within_the_recheck(
    leader: Leader,
) -> None:
    """Retention moves a log start without the partition's knowing: a session looks at
    every partition afresh every QUIET_RECHECK_MS."""

    async def main() -> None:
        leader.produce([b"a", b"b", b"c"], partition=1, acks=1)
        session = leader.fetch(0, 0, {0: 0, 1: 3}).session_id  # the HW moves to 3 here
        assert answers(leader.fetch(session, 1, {})) == {}  # both watched from here on
        replica = leader.replicas.get("orders", 1)
        assert replica is not None
        replica.log.maybe_increment_log_start_offset(2)
        leader.clock.advance(10)
        assert answers(leader.fetch(session, 2, {})) == {}  # still watched
        leader.clock.advance(broker.fetch_session.QUIET_RECHECK_MS)
        got = answers(leader.fetch(session, 3, {}))
        assert list(got) == [1] and got[1].log_start_offset == 2

    asyncio.run(main())


def test_after_a_diverging_answer_the_session_tells_the_high_watermark_again(
    leader: Leader,
) -> None:
    """A follower that truncates on a diverging epoch does not take that answer's HW, so its
    next fetch must carry the HW even though it has not moved (found by the replication
    simulation with fetch sessions: an idle partition's follower kept a stale HW)."""
    leader.produce([b"a", b"b"], partition=0, acks=1)
    session = leader.fetch(0, 0, {0: 2, 1: 0}).session_id  # caught up: the HW moves to 2
    diverged = answers(leader.fetch(session, 1, {0: 5}))  # a log that went its own way
    assert diverged[0].diverging_epoch.end_offset == 2 and diverged[0].high_watermark == 2
    truncated = answers(leader.fetch(session, 2, {0: 2}))  # truncated to the leader's end
    assert list(truncated) == [0] and truncated[0].high_watermark == 2
    assert answers(leader.fetch(session, 3, {})) == {}  # heard now
