"""bench.metadata's broker phases: the spare broker's cold catch-up, and a loaded broker's stop.

How this works.

  spare      before the creation the spare broker (holding nothing) is stopped (a controlled
             shutdown with nothing to move) and its data dir deleted (``prepare_spare``).
  catch-up   after the creation the spare's process is started again on its empty data dir.
             Target: the controller's metadata offset at that moment; the controller's latest
             snapshot must lie past offset 0 (checked first), so the leader answers the
             broker's first fetch with the snapshot, and the rest comes from the log. Timed
             from the start: the process printing "ready node", its Raft node logging that it
             observes a leader, a snapshot file appearing in its data dir, its Raft node
             logging the snapshot loaded (log and directory polled every 20 ms),
             DescribeCluster showing its reported metadata offset at or past the target
             (polled every 0.5 s: catch-up), and showing it unfenced.
  loaded     last, one of the brokers holding topics is stopped (SIGTERM: a controlled
  stop       shutdown, which must move every leadership it holds and take it out of every
             ISR), SIGKILL after ``STOP_TIMEOUT_S``: how long it took, how it ended, and how
             far the controller epoch moved by ``SETTLE_S`` later (more than 0: failovers).
             Nothing waits for the cluster to recover from it: the run ends there.
"""

from __future__ import annotations

import asyncio
import time

from bench.metadata_cluster import BenchCluster
from bench.metadata_figures import (
    CATCH_UP_TIMEOUT_S,
    DESCRIBE_INTERVAL_S,
    FILE_POLL_S,
    SETTLE_S,
    SNAPSHOT_WAIT_S,
    STOP_TIMEOUT_S,
    CatchUp,
    LoadedStop,
)
from bench.metadata_snapshot import snapshot_end_offset
from proto import controller_pb2 as cpb


def prepare_spare(cluster: BenchCluster) -> str:
    """Stop the spare (it holds nothing) and wipe its data dir; how its process ended."""
    ended = cluster.stop_node(cluster.spare, STOP_TIMEOUT_S)
    cluster.wipe(cluster.spare)
    return ended


async def bench_catch_up(cluster: BenchCluster, controller_id: int) -> CatchUp:
    broker = cluster.spare
    target = (await cluster.describe()).metadata_offset
    log_start = await _snapshot_taken(cluster, controller_id)
    since = cluster.log_size(broker)
    started = time.monotonic()
    cluster.start()
    times = await _watch_catch_up(cluster, broker, target, since, started)
    fetched = cluster.snapshots(broker)
    return CatchUp(
        broker_id=broker,
        target_offset=target,
        controller_log_start=log_start,
        started_s=times["started"],
        observer_s=times.get("observer"),
        snapshot_fetched_s=times.get("snapshot"),
        snapshot_loaded_s=times.get("loaded"),
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
    """Seconds from ``started`` to each event (module doc)."""
    times: dict[str, float] = {}
    next_describe = started
    marks = {
        "started": "ready node",
        "observer": f"raft {broker}: observer@",
        "loaded": "loaded the leader's snapshot",
    }
    async with asyncio.timeout(CATCH_UP_TIMEOUT_S):
        while not {"caught_up", "unfenced", "started"} <= times.keys():
            now = time.monotonic()
            for event, text in marks.items():
                if event not in times and cluster.log_says(broker, text, since):
                    times[event] = now - started
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


async def bench_loaded_stop(cluster: BenchCluster) -> LoadedStop:
    broker = cluster.broker_ids[-1]
    before = (await cluster.describe()).controller_epoch
    stopping = time.monotonic()
    ended = cluster.stop_node(broker, STOP_TIMEOUT_S)
    stop_s = time.monotonic() - stopping
    await asyncio.sleep(max(0.0, SETTLE_S - stop_s))
    try:
        after: int | None = (await cluster.describe()).controller_epoch
    except Exception:  # no active controller answered: say so rather than fail the run
        after = None
    return LoadedStop(broker, stop_s, ended, before, after)
