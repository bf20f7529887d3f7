"""The three measurements of bench.raft: commit latency, throughput and failover.

How this works. Latency is open loop: ``paced`` starts requests on a fixed schedule whatever
the replies do, each through an ``Issuer`` (a pool of line-protocol connections, a unary gRPC
caller), in rounds that alternate with the baselines so machine noise hits both; fdatasync is
timed on the nodes' disk between rounds. Throughput keeps ``pipeline_depth`` requests
outstanding on each connection and counts the replies inside a timed window, with the CPU time
of each process. Failover kills the leader with SIGKILL and polls until a survivor commits.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import grpc
import grpc.aio

from bench.raft_cluster import BaselineServer, Cluster, Connection, ask_once, cpu_seconds, poll
from bench.raft_figures import (
    FAILOVER_TIMEOUT_S,
    FETCH_MAX_WAIT_MS,
    FSYNC_WRITE_BYTES,
    MAX_LATENCY_CONNECTIONS,
    POLL_INTERVAL_S,
    RATE_PER_S,
    READ_BYTES,
    REQUEST_TIMEOUT_S,
    ROUNDS,
    START_TIMEOUT_S,
    Distribution,
    LatencyPhase,
    Load,
    PacedRun,
    Params,
    Throughput,
    Trial,
)
from proto import raft_pb2 as pb
from proto import raft_pb2_grpc


def bench_fdatasync(directory: Path, samples: int) -> Distribution:
    """Seconds of one small appending write + fdatasync, on the nodes' disk."""
    path = directory / "fdatasync.bench"
    data = os.urandom(FSYNC_WRITE_BYTES)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    times: list[float] = []
    try:
        os.fdatasync(fd)
        for _ in range(samples):
            start = time.perf_counter()
            os.write(fd, data)
            os.fdatasync(fd)
            times.append(time.perf_counter() - start)
            time.sleep(1 / RATE_PER_S / 10)
    finally:
        os.close(fd)
        path.unlink()
    return Distribution(tuple(times))


# --- latency ------------------------------------------------------------------------------


class LinePool:
    """Issues one line-protocol request on an idle connection (opening another when all are
    busy); returns the seconds from the write to the reply, or None on a failure."""

    def __init__(self, port: int, line: bytes) -> None:
        self.port, self.line = port, line
        self.idle: list[Connection] = []
        self.opened = 0

    async def __call__(self) -> float | None:
        if self.idle:
            conn = self.idle.pop()
        elif self.opened < MAX_LATENCY_CONNECTIONS:
            conn = await Connection.open(self.port)
            self.opened += 1
        else:
            return None
        start = time.perf_counter()
        try:
            reply = await conn.ask(self.line)
        except (OSError, TimeoutError):
            await conn.close()
            return None
        elapsed = time.perf_counter() - start
        self.idle.append(conn)
        return elapsed if reply.startswith("OK ") else None

    async def close(self) -> None:
        for conn in self.idle:
            await conn.close()
        self.idle.clear()


class GrpcCaller:
    """Issues one unary ``RaftService.Send`` of an empty envelope; seconds or None."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.send = raft_pb2_grpc.RaftServiceStub(channel).Send
        self.opened = 1

    async def __call__(self) -> float | None:
        start = time.perf_counter()
        try:
            await self.send(pb.Envelope(source=1, destination=2), timeout=REQUEST_TIMEOUT_S)
        except grpc.aio.AioRpcError:
            return None
        return time.perf_counter() - start

    async def close(self) -> None:
        pass


class Issuer(Protocol):
    opened: int

    async def __call__(self) -> float | None: ...

    async def close(self) -> None: ...


async def paced(issue: Issuer, count: int, rate_per_s: float) -> PacedRun:
    """Open loop: ``count`` requests started on a fixed schedule, whatever the replies do."""
    latencies: list[float] = []
    errors = 0
    tasks: set[asyncio.Task[None]] = set()

    async def one() -> None:
        nonlocal errors
        elapsed = await issue()
        if elapsed is None:
            errors += 1
        else:
            latencies.append(elapsed)

    max_lag = 0.0
    begin = time.perf_counter() + 0.01
    try:
        for i in range(count):
            target = begin + i / rate_per_s
            if (delay := target - time.perf_counter()) > 0:
                await asyncio.sleep(delay)
            max_lag = max(max_lag, time.perf_counter() - target)
            task = asyncio.create_task(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)  # each bounded by REQUEST_TIMEOUT_S
    finally:
        await issue.close()
    if not latencies:
        raise RuntimeError(f"no request succeeded ({errors} errors)")
    return PacedRun(Distribution(tuple(latencies)), errors, issue.opened, max_lag * 1000)


def merge(runs: Sequence[PacedRun]) -> PacedRun:
    return PacedRun(
        Distribution(tuple(x for run in runs for x in run.latency.samples)),
        sum(run.errors for run in runs),
        max(run.connections_used for run in runs),
        max(run.max_send_lag_ms for run in runs),
    )


async def bench_latency(cluster: Cluster, server: BaselineServer, params: Params) -> LatencyPhase:
    """Commit latency and the baselines in alternating rounds, so machine noise hits both."""
    leader = await cluster.wait_leader()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        await channel.channel_ready()
        issuers: dict[str, Callable[[], Issuer]] = {
            "commit": lambda: LinePool(leader.client_port, b"INCR 1\n"),
            "echo": lambda: LinePool(server.line_port, b"INCR 1\n"),
            "grpc": lambda: GrpcCaller(channel),
        }
        counts = {
            "commit": params.latency_proposals // ROUNDS,
            "echo": params.baseline_requests // ROUNDS,
            "grpc": params.baseline_requests // ROUNDS,
        }
        for make in issuers.values():
            await paced(make(), RATE_PER_S, RATE_PER_S)  # warm-up, 1 s each
        runs: dict[str, list[PacedRun]] = {name: [] for name in issuers}
        fsyncs: list[Distribution] = []
        for r in range(ROUNDS):
            for name in list(issuers)[:: 1 if r % 2 == 0 else -1]:
                runs[name].append(await paced(issuers[name](), counts[name], RATE_PER_S))
            fsyncs.append(bench_fdatasync(cluster.root, params.fsync_samples // ROUNDS))
    rounds = {name: [run.latency for run in side] for name, side in runs.items()}
    return LatencyPhase(
        merge(runs["commit"]),
        merge(runs["echo"]),
        merge(runs["grpc"]),
        Distribution(tuple(x for d in fsyncs for x in d.samples)),
        rounds | {"fdatasync": fsyncs},
    )


# --- throughput ---------------------------------------------------------------------------


async def pipelined_load(port: int, line: bytes, params: Params, pids: dict[str, int]) -> Load:
    """``params.connections`` connections, each keeping ``params.pipeline_depth`` requests of
    ``line`` outstanding (a reply lets the next request go; requests freed by one read go in
    one write). Replies inside the timed window (after a warm-up) count. CPU time of this
    process and of ``pids`` is measured over the window."""
    conns = [await Connection.open(port) for _ in range(params.connections)]
    window: list[float] = [float("inf"), float("inf")]  # [start, end]
    latencies: list[float] = []
    errors = 0
    stop = False

    async def worker(conn: Connection) -> None:
        nonlocal errors
        sent: deque[float] = deque()  # send time of each outstanding request, in order

        def send(count: int) -> None:
            sent.extend([time.perf_counter()] * count)
            conn.writer.write(line * count)

        send(params.pipeline_depth)
        pending = b""
        while sent:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                data = await conn.reader.read(READ_BYTES)
            if not data:
                raise ConnectionError("the server closed the connection")
            *replies, pending = (pending + data).split(b"\n")
            done = time.perf_counter()
            for reply in replies:
                start = sent.popleft()
                if window[0] <= done < window[1]:
                    if reply.startswith(b"OK "):
                        latencies.append(done - start)
                    else:
                        errors += 1
            if not stop:
                send(len(replies))

    workers = [asyncio.create_task(worker(c)) for c in conns]
    try:
        await asyncio.sleep(params.throughput_warmup_s)
        cpu_before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        client_before = time.process_time()
        window[0] = time.perf_counter()
        await asyncio.sleep(params.throughput_window_s)
        window[1] = time.perf_counter()
        client_cpu = time.process_time() - client_before
        cpu = {name: round(cpu_seconds(pid) - cpu_before[name], 2) for name, pid in pids.items()}
        stop = True
        async with asyncio.timeout(REQUEST_TIMEOUT_S + 5):
            await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()
        for conn in conns:
            await conn.close()
    if not latencies:
        raise RuntimeError(f"no {line!r} answered OK in the window ({errors} errors)")
    return Load(
        line=line,
        connections=params.connections,
        pipeline_depth=params.pipeline_depth,
        window_s=window[1] - window[0],
        requests=len(latencies),
        errors=errors,
        latency=Distribution(tuple(latencies)),
        client_cpu_s=round(client_cpu, 2),
        server_cpu_s=cpu,
    )


async def bench_throughput(cluster: Cluster, params: Params, records: int) -> Throughput:
    leader = await cluster.wait_leader()
    pids = {
        f"node {i}{' (leader)' if n is leader else ''}": n.proc.pid
        for i, n in cluster.nodes.items()
        if n.proc is not None
    }
    load = await pipelined_load(leader.client_port, f"INCR {records}\n".encode(), params, pids)
    return Throughput(records, load, leader.node_id)


# --- failover -----------------------------------------------------------------------------


async def failover_trial(cluster: Cluster, trial: int) -> Trial:
    """kill -9 the leader; time until a survivor commits; restart the killed node."""
    await cluster.wait_caught_up()
    leader, epoch = await poll(cluster.leader_status, "a leader", START_TIMEOUT_S)
    # Land the kill at a random point of the followers' fetch cycle (idle long polls are
    # answered every fetch_max_wait_ms; a follower's fetch timeout runs from the last answer).
    await asyncio.sleep(random.Random(trial).uniform(0.0, FETCH_MAX_WAIT_MS / 1000))
    killed = leader.node_id
    start = time.perf_counter()
    leader.kill()
    elected_s: float | None = None
    try:
        while time.perf_counter() - start < FAILOVER_TIMEOUT_S:
            found = await cluster.leader_status(exclude=killed)
            if found is not None:
                new_leader, new_epoch = found
                if elected_s is None:
                    elected_s = time.perf_counter() - start
                reply = await ask_once(new_leader.client_port, b"INCR 1\n", REQUEST_TIMEOUT_S)
                if reply is not None and reply.startswith("OK "):
                    commit_s = time.perf_counter() - start
                    return Trial(killed, new_leader.node_id, elected_s, commit_s, new_epoch - epoch)
            await asyncio.sleep(POLL_INTERVAL_S)
        raise TimeoutError(f"no commit within {FAILOVER_TIMEOUT_S} s of killing node {killed}")
    finally:
        cluster.nodes[killed].start()


async def bench_failover(cluster: Cluster, trials: int) -> list[Trial]:
    results = []
    for trial in range(trials):
        results.append(await failover_trial(cluster, trial))
        print(
            f"  failover {trial + 1}/{trials}: killed {results[-1].killed}, "
            f"leader {results[-1].new_leader} after {results[-1].elected_s:.3f} s, "
            f"commit after {results[-1].commit_s:.3f} s (epoch +{results[-1].epochs})",
            flush=True,
        )
    await cluster.wait_caught_up()
    return results
