"""bench.metadata's creation phase, and the pipelined sender the baselines share.

How this works. The run's CreateTopics requests go out through one ``ControllerClient`` with
``concurrency`` of them in flight (each worker sends its next as soon as its last is answered;
the controller answers a request once its records are committed, and decides the next ones
meanwhile against its speculative image). Wall time from the first send to the last answer;
CPU seconds of every node process over the same span, from /proc; the controller epoch before
and after (a change means a failover happened during the creation). Then, polling
DescribeCluster, the time until every broker holding topics has reported (in its heartbeat,
every ``heartbeat_interval_ms``) the controller's metadata offset.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.metadata_cluster import BenchCluster
from bench.metadata_figures import (
    CATCH_UP_TIMEOUT_S,
    CREATE_TIMEOUT_S,
    DESCRIBE_INTERVAL_S,
    CreatePhase,
    Distribution,
    Params,
    creation_requests,
)
from proto import controller_pb2 as cpb


@dataclass(frozen=True, slots=True)
class Pipelined:
    wall_s: float
    latencies: tuple[float, ...]
    responses: tuple[Any, ...]


async def pipelined(
    call: Callable[[Any], Awaitable[Any]], requests: Sequence[Any], concurrency: int
) -> Pipelined:
    """Send ``requests`` with ``concurrency`` in flight; answers in request order."""
    loop = asyncio.get_running_loop()
    responses: list[Any] = [None] * len(requests)
    latencies: list[float] = []
    todo = iter(range(len(requests)))

    async def worker() -> None:
        for i in todo:  # shared: each index goes to one worker
            sent = loop.time()
            responses[i] = await call(requests[i])
            latencies.append(loop.time() - sent)

    started = loop.time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return Pipelined(loop.time() - started, tuple(latencies), tuple(responses))


def refusals(responses: Sequence[cpb.CreateTopicsResponse]) -> dict[str, int]:
    """Error name -> count, over the responses' headers and topics."""
    errors: Counter[str] = Counter()
    for response in responses:
        if response.header.error != cpb.NONE:
            errors[cpb.ErrorCode.Name(response.header.error)] += len(response.topics) or 1
        errors.update(cpb.ErrorCode.Name(t.error) for t in response.topics if t.error)
    return dict(errors)


async def bench_create(cluster: BenchCluster, params: Params) -> CreatePhase:
    requests = creation_requests(params)
    active = await cluster.active_controller()
    epoch_before = (await cluster.describe()).controller_epoch
    cpu_before = cluster.cpu_by_node()
    started = time.monotonic()

    async def create(request: cpb.CreateTopicsRequest) -> cpb.CreateTopicsResponse:
        response: cpb.CreateTopicsResponse = await cluster.client.call("CreateTopics", request)
        return response

    async with asyncio.timeout(CREATE_TIMEOUT_S):
        run = await pipelined(create, requests, params.concurrency)
    cpu_after = cluster.cpu_by_node()
    described = await cluster.describe()
    await wait_brokers_at(cluster, described.metadata_offset, CATCH_UP_TIMEOUT_S)
    return CreatePhase(
        wall_s=run.wall_s,
        latency=Distribution(run.latencies),
        errors=refusals(run.responses),
        active_controller=active,
        cpu_s={i: cpu_after[i] - cpu_before.get(i, 0.0) for i in cpu_after},
        all_brokers_s=time.monotonic() - started,
        controller_epochs=(epoch_before, described.controller_epoch),
        metadata_offset=described.metadata_offset,
        topics=described.topics,
        partitions=described.partitions,
    )


async def wait_brokers_at(cluster: BenchCluster, offset: int, timeout_s: float) -> None:
    """Until DescribeCluster shows the reported metadata offset of every broker holding
    topics (not the spare) at or past ``offset``."""
    async with asyncio.timeout(timeout_s):
        while True:
            cluster.check_alive()
            described = await cluster.describe()
            offsets = {b.broker_id: b.metadata_offset for b in described.brokers}
            if all(offsets.get(b, -1) >= offset for b in cluster.broker_ids):
                return
            await asyncio.sleep(DESCRIBE_INTERVAL_S)
