"""A reply the listener cancels (its connection closed) in the very pass that made it: an
acks=-1 produce whose wait had not begun. The handler's coroutine must be run to its
cancellation, not dropped unawaited (Python then warns "coroutine '_committed' was never
awaited", as brokers of a nemesis run logged), and leave no wait behind.

The in-process leader of dispatch_leader.py; its follower never fetches, so an acks=-1
write waits until cancelled.
"""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from dispatch_leader import PRODUCE_V, DispatchLeader
from support import make_batch

from broker.protocol import ApiKey


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[DispatchLeader]:
    made = DispatchLeader(tmp_path / "data")
    yield made
    made.logs.shutdown()


def _acks_all() -> dict[str, object]:
    data = [{"index": 0, "records": make_batch([b"v"])}]
    return {
        "transactional_id": None,
        "acks": -1,
        "timeout_ms": 30_000,
        "topic_data": [{"name": "orders", "partition_data": data}],
    }


@pytest.mark.parametrize("cancel_at_once", [True, False])
def test_a_cancelled_acks_all_reply_is_closed_and_forgets_its_wait(
    leader: DispatchLeader, cancel_at_once: bool
) -> None:
    partition = leader.replicas.get("orders", 0)
    assert partition is not None

    async def main() -> None:
        reply = leader.handle(ApiKey.PRODUCE, PRODUCE_V, _acks_all())
        answer = asyncio.ensure_future(reply)  # as the listener holds it
        if not cancel_at_once:  # the wait has begun
            await asyncio.sleep(0.02)
            assert len(partition._waiting) == 1  # the append waits for the follower
        answer.cancel()
        await asyncio.sleep(0.02)
        assert answer.cancelled()

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asyncio.run(main())
        gc.collect()
    assert [str(w.message) for w in caught if "never awaited" in str(w.message)] == []
    assert not partition._waiting
    assert partition.log_end_offset == 1  # appended before the wait, as Kafka does
