"""The producer-id manager against a fake controller client: blocks, the 90% prefetch, shared
requests, and the controller's errors as typed errors with Kafka codes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from broker.producer_ids import (
    BrokerIdNotRegistered,
    ProducerIdBlock,
    ProducerIdBlockError,
    ProducerIdManager,
    ProducerIdsExhausted,
    ProducerIdsUnavailable,
    StaleBrokerEpoch,
)
from controller.client import ControllerUnavailable
from proto import controller_pb2 as cpb
from replication.errors import ReplicationError

T = TypeVar("T")
Answer = tuple[int, int] | int | Exception  # a block, an error code, or a raise


def run(body: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(body(), 10)

    return asyncio.run(bounded())


class FakeController:
    """Answers AllocateProducerIds from a script; ``gate`` holds answers back when cleared."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.requests: list[cpb.AllocateProducerIdsRequest] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def call(self, method: str, request: Any) -> Any:
        assert method == "AllocateProducerIds"
        self.requests.append(request)
        await self.gate.wait()
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, int):
            header = cpb.ResponseHeader(error=answer, message="refused")  # type: ignore[arg-type]
            return cpb.AllocateProducerIdsResponse(header=header)
        start, length = answer
        return cpb.AllocateProducerIdsResponse(producer_id_start=start, producer_id_len=length)


def manager(controller: FakeController, epoch: list[int] | None = None) -> ProducerIdManager:
    epochs = epoch or [7]
    return ProducerIdManager(3, controller, lambda: epochs[0])


def test_ids_come_one_by_one_from_the_controller_s_block() -> None:
    async def body() -> None:
        controller = FakeController((1000, 10), (2000, 10))
        ids = manager(controller)
        assert [await ids.next_id() for _ in range(5)] == [1000, 1001, 1002, 1003, 1004]
        assert ids.current_block == ProducerIdBlock(1000, 10)
        request = controller.requests[0]
        assert (request.broker_id, request.broker_epoch) == (3, 7)

    run(body)


def test_the_next_block_is_fetched_at_90_percent_and_follows_seamlessly() -> None:
    async def body() -> None:
        controller = FakeController((1000, 10), (2000, 10))
        ids = manager(controller)
        handed = [await ids.next_id() for _ in range(8)]
        await asyncio.sleep(0)
        assert len(controller.requests) == 1  # 8 of 10 used: not yet
        handed.append(await ids.next_id())  # the 9th: 90%
        await asyncio.sleep(0)
        assert len(controller.requests) == 2
        handed += [await ids.next_id() for _ in range(3)]
        assert handed == [*range(1000, 1010), 2000, 2001]
        assert ids.blocks_requested == 2

    run(body)


def test_callers_waiting_for_a_block_share_one_request() -> None:
    async def body() -> None:
        controller = FakeController((0, 3))
        controller.gate.clear()
        ids = manager(controller)
        waiting = [asyncio.ensure_future(ids.next_id()) for _ in range(3)]
        for _ in range(3):
            await asyncio.sleep(0)
        assert len(controller.requests) == 1
        controller.gate.set()
        assert sorted(await asyncio.gather(*waiting)) == [0, 1, 2]

    run(body)


def test_a_caller_giving_up_does_not_cancel_the_shared_request() -> None:
    async def body() -> None:
        controller = FakeController((0, 5))
        controller.gate.clear()
        ids = manager(controller)
        impatient = asyncio.ensure_future(ids.next_id())
        patient = asyncio.ensure_future(ids.next_id())
        await asyncio.sleep(0)
        impatient.cancel()
        controller.gate.set()
        assert await patient == 0
        assert len(controller.requests) == 1

    run(body)


@pytest.mark.parametrize(
    ("answer", "error", "code", "retriable"),
    [
        (cpb.STALE_BROKER_EPOCH, StaleBrokerEpoch, 77, True),
        (cpb.BROKER_ID_NOT_REGISTERED, BrokerIdNotRegistered, 102, True),
        (cpb.REQUEST_TIMED_OUT, ProducerIdsUnavailable, 7, True),
        (cpb.UNKNOWN_SERVER_ERROR, ProducerIdBlockError, -1, False),
        (cpb.INVALID_REQUEST, ProducerIdBlockError, 42, False),
        (ControllerUnavailable("nobody answered"), ProducerIdsUnavailable, 7, True),
    ],
)
def test_controller_errors_surface_typed_with_their_kafka_code(
    answer: Answer, error: type[ReplicationError], code: int, retriable: bool
) -> None:
    async def body() -> None:
        ids = manager(FakeController(answer))
        with pytest.raises(error) as raised:
            await ids.next_id()
        assert isinstance(raised.value, ReplicationError)
        assert (raised.value.code, raised.value.retriable) == (code, retriable)

    run(body)


@pytest.mark.parametrize("block", [(0, 0), (-5, 10), (500, 10)], ids=["empty", "negative", "old"])
def test_a_block_that_makes_no_sense_is_refused(block: tuple[int, int]) -> None:
    async def body() -> None:
        ids = manager(FakeController((500, 2), block))
        assert [await ids.next_id(), await ids.next_id()] == [500, 501]
        with pytest.raises(ProducerIdsExhausted):
            await ids.next_id()

    run(body)


def test_a_failed_prefetch_is_retried_when_the_block_runs_out() -> None:
    async def body() -> None:
        epoch = [7]
        controller = FakeController((0, 2), cpb.STALE_BROKER_EPOCH, (10, 2))
        ids = manager(controller, epoch)
        assert await ids.next_id() == 0
        assert await ids.next_id() == 1  # 90%: the prefetch fails in the background
        await asyncio.sleep(0)
        epoch[0] = 8  # the broker registered again
        assert await ids.next_id() == 10
        assert [r.broker_epoch for r in controller.requests] == [7, 7, 8]

    run(body)


def test_an_error_does_not_stick() -> None:
    async def body() -> None:
        ids = manager(FakeController(ControllerUnavailable("down"), (40, 5)))
        with pytest.raises(ProducerIdsUnavailable):
            await ids.next_id()
        assert await ids.next_id() == 40

    run(body)


def test_close_cancels_a_request_in_flight() -> None:
    async def body() -> None:
        controller = FakeController((0, 5))
        controller.gate.clear()
        ids = manager(controller)
        waiter = asyncio.ensure_future(ids.next_id())
        await asyncio.sleep(0)
        await ids.close()
        with pytest.raises(asyncio.CancelledError):
            await waiter

    run(body)
