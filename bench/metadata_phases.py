"""bench.metadata's measurements on the running cluster: topic creation and a broker's cold
catch-up.

How this works.

  create    the run's CreateTopics requests go out through one ``ControllerClient`` with
            ``concurrency`` of them in flight (each worker sends its next as soon as its last
            is answered; the controller answers a request once its records are committed, and
            decides the next ones meanwhile against its speculative image). Wall time from the
            first send to the last answer; CPU seconds of every node process over the same
            span, from /proc. Then, polling DescribeCluster, the time until every broker has
            reported (in its heartbeat) the controller's metadata offset.
  catch-up  one broker is stopped (SIGTERM: a controlled shutdown, which moves its
            leaderships away), its data dir deleted, and the process started again. Target:
            the controller's metadata offset at that moment. Timed from the start: the
            process printing "ready node", a snapshot file appearing in its data dir (polled
            every 20 ms), DescribeCluster showing its reported metadata offset at or past the
            target (catch-up), and showing it unfenced. The controller's latest snapshot is
            checked to lie past offset 0 first, so the broker cannot catch up from the log
            alone: the leader answers its first fetch with the snapshot.
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
    FILE_POLL_S,
    SNAPSHOT_WAIT_S,
    STOP_TIMEOUT_S,
    CatchUp,
    CreatePhase,
    Distribution,
    Params,
    creation_requests,
)
from bench.metadata_snapshot import snapshot_end_offset
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
    """Until DescribeCluster shows every broker's reported metadata offset >= ``offset``."""
    async with asyncio.timeout(timeout_s):
        while True:
            cluster.check_alive()
            described = await cluster.describe()
            if all(b.metadata_offset >= offset for b in described.brokers):
                return
            await asyncio.sleep(DESCRIBE_INTERVAL_S)


async def bench_catch_up(cluster: BenchCluster, controller_id: int) -> CatchUp:
    broker = cluster.broker_ids[-1]
    stopping = time.monotonic()
    stop_exit = cluster.stop_node(broker, STOP_TIMEOUT_S)
    stop_s = time.monotonic() - stopping
    cluster.wipe(broker)
    target = (await cluster.describe()).metadata_offset
    log_start = await _snapshot_taken(cluster, controller_id)
    since = cluster.log_size(broker)
    started = time.monotonic()
    cluster.start()
    times = await _watch_catch_up(cluster, broker, target, since, started)
    fetched = cluster.snapshots(broker)
    return CatchUp(
        broker_id=broker,
        stop_s=stop_s,
        stop_exit=stop_exit,
        target_offset=target,
        controller_log_start=log_start,
        started_s=times["started"],
        snapshot_fetched_s=times.get("snapshot"),
        catch_up_s=times["caught_up"],
        unfenced_s=times["unfenced"],
        snapshot_end_offset=snapshot_end_offset(fetched[0]) if fetched else None,
    )


async def _snapshot_taken(cluster: BenchCluster, controller_id: int) -> int:
    """The end offset of the controller's latest snapshot, once it has one (bounded wait)."""
    deadline = time.monotonic() + SNAPSHOT_WAIT_S
    while not cluster.snapshots(controller_id):
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"controller {controller_id} has no snapshot: a restarted broker would replay "
                "the log instead of fetching one; lower --snapshot-bytes"
            )
        await asyncio.sleep(FILE_POLL_S)
    return snapshot_end_offset(cluster.snapshots(controller_id)[-1])


async def _watch_catch_up(
    cluster: BenchCluster, broker: int, target: int, since: int, started: float
) -> dict[str, float]:
    """Seconds from ``started`` to each event (module doc); the file checks every 20 ms,
    DescribeCluster every 0.5 s."""
    times: dict[str, float] = {}
    next_describe = started
    async with asyncio.timeout(CATCH_UP_TIMEOUT_S):
        while not {"caught_up", "unfenced", "started"} <= times.keys():
            now = time.monotonic()
            if "started" not in times and cluster.log_says(broker, "ready node", since):
                times["started"] = now - started
            if "snapshot" not in times and cluster.snapshots(broker):
                times["snapshot"] = now - started
            if now >= next_describe:
                cluster.check_alive()
                _note_broker(await cluster.describe(), broker, target, now - started, times)
                next_describe = now + DESCRIBE_INTERVAL_S
            await asyncio.sleep(FILE_POLL_S)
    return times


def _note_broker(
    described: cpb.DescribeClusterResponse,
    broker: int,
    target: int,
    elapsed: float,
    times: dict[str, float],
) -> None:
    found = [b for b in described.brokers if b.broker_id == broker]
    if not found:
        return
    if "caught_up" not in times and found[0].metadata_offset >= target:
        times["caught_up"] = elapsed
    if "unfenced" not in times and "caught_up" in times and not found[0].fenced:
        times["unfenced"] = elapsed
