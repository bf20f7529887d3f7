"""Raft benchmark: three local voter processes running a replicated counter, against raw
baselines (loopback round trips, fdatasync) measured in the same run.

How this works. Three ``raft.testing.counter_node`` processes (real gRPC between them, real
files, default Raft timeouts) run on 127.0.0.1; this process is the client and speaks their
line protocol (``INCR n`` -> ``OK <offset>`` once committed, ``STATUS``). A baseline server
process answers the same line protocol with no Raft behind it (the node's own
readline/write/drain loop) and serves ``RaftService.Send`` with a bare acknowledgement.

  latency    ``INCR 1`` against the leader at 100 proposals/s, **open loop**: proposals are
             sent on a fixed schedule whatever the replies do, each on an idle connection of
             a pool (a new one when all are busy), so a slow commit does not hide the next
             one's wait. Latency is from the request's write to its reply. In alternating
             rounds with the same paced run against the echo server, a paced unary gRPC
             ``Send``, and ``os.write`` of 64 bytes + ``os.fdatasync`` on the nodes' disk.
             A durable replicated commit needs at least: client round trip + leader fsync +
             one leader <-> follower round trip + follower fsync, so the floor is
             2 x echo round trip + 2 x fdatasync; commit latency / floor is the ratio.
  throughput ``connections`` client connections each keeping ``pipeline_depth`` requests of
             ``INCR 1`` (then ``INCR 100``) outstanding; the node answers a connection's
             requests in order but works on them at once, so they share batches. Records/s
             and proposals/s over a timed window after a warm-up, with the CPU seconds each
             process used. Baseline: the same load against the echo server.
  failover   kill -9 of the leader at a random point of the followers' fetch cycle, then the
             time until an ``INCR 1`` is answered ``OK`` by a surviving node (STATUS polled
             every 20 ms to find the new leader); also the time until a survivor reports
             itself leader, and how far the epoch moved (more than 1: a split or failed
             vote). The killed node is restarted and caught up before the next trial.

Usage: ``python -m bench.raft [--quick] [--dir DIR] [--connections N] [--pipeline-depth D]``.
The last line printed is one JSON object with every figure and the parameters.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc
import grpc.aio

from proto import raft_pb2 as pb
from proto import raft_pb2_grpc
from raft.core import RaftConfig
from raft.testing.counter_node import serve_lines
from raft.testing.processes import free_ports, kill, spawn_counter_node, spawn_python

REPO = Path(__file__).resolve().parent.parent
NODE_IDS = (1, 2, 3)
RAFT_DEFAULTS = RaftConfig()
ELECTION_TIMEOUT_MS = RAFT_DEFAULTS.election_timeout_ms  # passed to the nodes explicitly
FETCH_TIMEOUT_MS = RAFT_DEFAULTS.fetch_timeout_ms
FETCH_MAX_WAIT_MS = min(500, FETCH_TIMEOUT_MS // 4)  # as counter_node sets it
SNAPSHOT_EVERY_RECORDS = 10_000  # counter_node's default
RATE_PER_S = 100
START_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 10.0
STATUS_TIMEOUT_S = 1.0
POLL_INTERVAL_S = 0.02
FAILOVER_TIMEOUT_S = 30.0
CATCH_UP_TIMEOUT_S = 60.0
FSYNC_WRITE_BYTES = 64
MAX_LATENCY_CONNECTIONS = 64
READ_BYTES = 64 * 1024
ROUNDS = 4  # latency: commit and baseline rounds alternate

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Params:
    quick: bool
    latency_proposals: int
    baseline_requests: int
    fsync_samples: int
    throughput_window_s: float
    throughput_warmup_s: float
    connections: int
    pipeline_depth: int
    failover_trials: int


# --- figures ------------------------------------------------------------------------------


def percentile(samples: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), round(fraction * len(ordered) + 0.5)))
    return ordered[rank - 1]


@dataclass(frozen=True, slots=True)
class Distribution:
    """Seconds, summarised in milliseconds."""

    samples: tuple[float, ...]

    def ms(self, fraction: float) -> float:
        return percentile(self.samples, fraction) * 1000

    @property
    def p50_ms(self) -> float:
        return self.ms(0.50)

    @property
    def p99_ms(self) -> float:
        return self.ms(0.99)

    @property
    def max_ms(self) -> float:
        return max(self.samples) * 1000

    def summary(self) -> dict[str, float]:
        return {
            "p50_ms": round(self.p50_ms, 3),
            "p90_ms": round(self.ms(0.90), 3),
            "p99_ms": round(self.p99_ms, 3),
            "max_ms": round(self.max_ms, 3),
            "count": len(self.samples),
        }


@dataclass(frozen=True, slots=True)
class PacedRun:
    latency: Distribution
    errors: int
    connections_used: int  # line protocol: connections the pool opened
    max_send_lag_ms: float  # how late the client sent against the schedule, at worst


@dataclass(frozen=True, slots=True)
class Load:
    """A pipelined run: each connection keeps ``pipeline_depth`` requests outstanding."""

    line: bytes
    connections: int
    pipeline_depth: int
    window_s: float
    requests: int  # answered OK inside the window
    errors: int
    latency: Distribution
    client_cpu_s: float
    server_cpu_s: dict[str, float]  # per server process, inside the window

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.window_s


@dataclass(frozen=True, slots=True)
class Throughput:
    records_per_proposal: int
    load: Load
    leader_id: int

    @property
    def proposals_per_s(self) -> float:
        return self.load.requests_per_s

    @property
    def records_per_s(self) -> float:
        return self.proposals_per_s * self.records_per_proposal


@dataclass(frozen=True, slots=True)
class Trial:
    killed: int
    new_leader: int
    elected_s: float  # kill -> a survivor reports itself leader
    commit_s: float  # kill -> first OK
    epochs: int  # how far the epoch moved: 1 = one election; more = split or failed votes


# --- the line protocol --------------------------------------------------------------------


class Connection:
    """One client connection speaking the counter node's line protocol."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int, timeout_s: float = REQUEST_TIMEOUT_S) -> Connection:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def ask(self, line: bytes, timeout_s: float = REQUEST_TIMEOUT_S) -> str:
        self.writer.write(line)
        async with asyncio.timeout(timeout_s):
            reply = await self.reader.readline()
        if not reply:
            raise ConnectionError("the node closed the connection")
        return reply.decode().strip()

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


async def ask_once(port: int, line: bytes, timeout_s: float) -> str | None:
    """One request on a fresh connection; None when the node does not answer in time."""
    try:
        async with asyncio.timeout(timeout_s):
            conn = await Connection.open(port, timeout_s)
            try:
                return await conn.ask(line, timeout_s)
            finally:
                await conn.close()
    except (OSError, TimeoutError):
        return None


# --- processes ----------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Node:
    node_id: int
    voters: str
    client_port: int
    data_dir: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = spawn_counter_node(
            self.node_id,
            self.voters,
            self.client_port,
            self.data_dir,
            election_timeout_ms=ELECTION_TIMEOUT_MS,
            fetch_timeout_ms=FETCH_TIMEOUT_MS,
            snapshot_every=SNAPSHOT_EVERY_RECORDS,
        )

    def kill(self) -> None:
        kill(self.proc)
        self.proc = None

    async def status(self) -> list[str] | None:
        """STATUS fields (role, epoch, leader, hw, counter) or None if it does not answer."""
        reply = await ask_once(self.client_port, b"STATUS\n", STATUS_TIMEOUT_S)
        if reply is None or not reply.startswith("STATUS "):
            return None
        return reply.split()[1:]


@dataclass
class Cluster:
    root: Path
    nodes: dict[int, Node] = field(default_factory=dict)

    def start(self) -> None:
        ports = free_ports(2 * len(NODE_IDS))
        voters = ",".join(f"{i}@127.0.0.1:{ports[k]}" for k, i in enumerate(NODE_IDS))
        for k, i in enumerate(NODE_IDS):
            self.nodes[i] = Node(i, voters, ports[len(NODE_IDS) + k], self.root / f"node-{i}")
        for node in self.nodes.values():
            node.start()

    def stop(self) -> None:
        for node in self.nodes.values():
            node.kill()

    async def leader_status(self, exclude: int | None = None) -> tuple[Node, int] | None:
        """The one node that says it is leader, and its epoch (None if none or several)."""
        candidates = [n for i, n in self.nodes.items() if i != exclude]
        statuses = await asyncio.gather(*(n.status() for n in candidates))
        leaders = [
            (n, int(s[1]))
            for n, s in zip(candidates, statuses, strict=True)
            if s and s[0] == "leader"
        ]
        return leaders[0] if len(leaders) == 1 else None

    async def leader(self, exclude: int | None = None) -> Node | None:
        found = await self.leader_status(exclude)
        return found[0] if found is not None else None

    async def wait_leader(self, timeout_s: float = START_TIMEOUT_S) -> Node:
        return await poll(self.leader, "a leader", timeout_s)

    async def wait_caught_up(self, timeout_s: float = CATCH_UP_TIMEOUT_S) -> None:
        """Every node up, one leader, and the same counter everywhere."""

        async def caught_up() -> bool:
            statuses = await asyncio.gather(*(n.status() for n in self.nodes.values()))
            if any(s is None for s in statuses):
                return False
            roles = sorted(s[0] for s in statuses if s is not None)
            counters = {s[4] for s in statuses if s is not None}
            return roles == ["follower", "follower", "leader"] and len(counters) == 1

        await poll(caught_up, "every node caught up", timeout_s)

    def log_tail(self, lines: int = 20) -> str:
        out = []
        for node_id in self.nodes:
            path = self.root / f"node-{node_id}.log"
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- node {node_id} ---\n" + "\n".join(tail))
        return "\n".join(out)


async def poll(check: Callable[[], Awaitable[T | None]], what: str, timeout_s: float) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = await check()
        if result:
            return result
        await asyncio.sleep(POLL_INTERVAL_S)
    raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")


# --- baseline -----------------------------------------------------------------------------


class _AckServicer(raft_pb2_grpc.RaftServiceServicer):
    """``RaftService.Send`` that only acknowledges: the transport's bare round trip."""

    async def Send(  # the name is the RPC's
        self, request: pb.Envelope, context: grpc.aio.ServicerContext[pb.Envelope, pb.Ack]
    ) -> pb.Ack:
        return pb.Ack()


async def baseline_server(line_port: int, grpc_port: int) -> None:
    """The trivial peer: the node's own pipelined line server (``serve_lines``) answering
    ``OK <n>`` at once on ``line_port``, and a gRPC ``RaftService`` that acknowledges on
    ``grpc_port``."""
    count = 0

    async def answer(words: list[str]) -> str:
        nonlocal count
        count += 1
        return f"OK {count}"

    async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await serve_lines(reader, writer, answer)

    rpc = grpc.aio.server()
    raft_pb2_grpc.add_RaftServiceServicer_to_server(_AckServicer(), rpc)
    rpc.add_insecure_port(f"127.0.0.1:{grpc_port}")
    await rpc.start()
    server = await asyncio.start_server(client, "127.0.0.1", line_port)
    async with server:
        await server.serve_forever()


async def wait_listening(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    async def listening() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            conn = await Connection.open(port, STATUS_TIMEOUT_S)
        except (OSError, TimeoutError):
            return False
        await conn.close()
        return True

    await poll(listening, what, START_TIMEOUT_S)


@dataclass(frozen=True, slots=True)
class Baseline:
    echo: PacedRun  # line protocol round trip, paced like the commit latency run
    grpc: PacedRun  # one unary RaftService.Send round trip, paced the same way
    fsync: Distribution  # small write + fdatasync
    echo_load: Load  # the line protocol at full speed, as many connections as throughput


@dataclass
class BaselineServer:
    """The ``--baseline-server`` process: line echo and gRPC acknowledgements."""

    root: Path
    line_port: int = 0
    grpc_port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        self.line_port, self.grpc_port = free_ports(2)
        self.proc = spawn_python(
            ["-m", "bench.raft", "--baseline-server", str(self.line_port), str(self.grpc_port)],
            self.root / "baseline-server.log",
        )
        await wait_listening(self.line_port, self.proc, "the baseline server")

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("the baseline server is not running")
        return self.proc.pid

    def stop(self) -> None:
        kill(self.proc)
        self.proc = None


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


@dataclass(frozen=True, slots=True)
class LatencyPhase:
    commit: PacedRun
    echo: PacedRun
    grpc: PacedRun
    fsync: Distribution
    rounds: dict[str, list[Distribution]]  # each side, round by round


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


# --- the run ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Results:
    baseline: Baseline
    latency: PacedRun
    rounds: dict[str, list[Distribution]]
    throughput: tuple[Throughput, ...]
    failover: tuple[Trial, ...]

    @property
    def floor_p50_ms(self) -> float:
        """The least a durable replicated commit costs: two round trips, two fsyncs."""
        b = self.baseline
        return 2 * b.echo.latency.p50_ms + 2 * b.fsync.p50_ms

    @property
    def floor_p99_ms(self) -> float:
        b = self.baseline
        return 2 * b.echo.latency.p99_ms + 2 * b.fsync.p99_ms

    @property
    def failover_s(self) -> list[float]:
        return [t.commit_s for t in self.failover]

    @property
    def elected_s(self) -> list[float]:
        return [t.elected_s for t in self.failover]


def load_json(load: Load) -> dict[str, Any]:
    return {
        "requests_per_s": round(load.requests_per_s),
        "latency": load.latency.summary(),
        "errors": load.errors,
        "connections": load.connections,
        "pipeline_depth": load.pipeline_depth,
        "window_s": round(load.window_s, 2),
        "client_cpu_s": load.client_cpu_s,
        "server_cpu_s": load.server_cpu_s,
    }


def paced_json(run: PacedRun) -> dict[str, Any]:
    return run.latency.summary() | {
        "errors": run.errors,
        "connections_used": run.connections_used,
        "max_send_lag_ms": round(run.max_send_lag_ms, 3),
    }


def report(params: Params, r: Results, load_at_start: float, elapsed_s: float) -> dict[str, Any]:
    single, *batched = r.throughput
    b, lat = r.baseline, r.latency.latency
    out: dict[str, Any] = {
        "commit_p50_ms": round(lat.p50_ms, 3),
        "commit_p99_ms": round(lat.p99_ms, 3),
        "records_per_s": round(single.records_per_s),
        "proposals_per_s": round(single.proposals_per_s),
        "failover_median_s": round(statistics.median(r.failover_s), 3),
        "failover_max_s": round(max(r.failover_s), 3),
        "election_median_s": round(statistics.median(r.elected_s), 3),
        "election_max_s": round(max(r.elected_s), 3),
        "failover_repeated_elections": sum(t.epochs > 1 for t in r.failover),
        "baseline_echo_rtt_p50_ms": round(b.echo.latency.p50_ms, 3),
        "baseline_echo_rtt_p99_ms": round(b.echo.latency.p99_ms, 3),
        "baseline_grpc_rtt_p50_ms": round(b.grpc.latency.p50_ms, 3),
        "baseline_grpc_rtt_p99_ms": round(b.grpc.latency.p99_ms, 3),
        "baseline_fdatasync_p50_ms": round(b.fsync.p50_ms, 3),
        "baseline_fdatasync_p99_ms": round(b.fsync.p99_ms, 3),
        "baseline_commit_floor_p50_ms": round(r.floor_p50_ms, 3),
        "baseline_commit_floor_p99_ms": round(r.floor_p99_ms, 3),
        "commit_ratio_p50": round(lat.p50_ms / r.floor_p50_ms, 2),
        "commit_ratio_p99": round(lat.p99_ms / r.floor_p99_ms, 2),
        "baseline_echo_requests_per_s": round(b.echo_load.requests_per_s),
        "throughput_ratio": round(single.proposals_per_s / b.echo_load.requests_per_s, 3),
    }
    for t in batched:
        out[f"records_per_s_incr{t.records_per_proposal}"] = round(t.records_per_s)
        out[f"proposals_per_s_incr{t.records_per_proposal}"] = round(t.proposals_per_s)
    out["commit_latency"] = paced_json(r.latency)
    out["latency_rounds"] = {
        name: [{"p50_ms": round(d.p50_ms, 3), "p99_ms": round(d.p99_ms, 3)} for d in side]
        for name, side in r.rounds.items()
    }
    out["echo_rtt"] = paced_json(b.echo)
    out["grpc_rtt"] = paced_json(b.grpc)
    out["fdatasync"] = b.fsync.summary() | {"write_bytes": FSYNC_WRITE_BYTES}
    out["echo_load"] = load_json(b.echo_load)
    out["throughput"] = {
        f"incr{t.records_per_proposal}": load_json(t.load)
        | {"records_per_s": round(t.records_per_s), "leader_id": t.leader_id}
        for t in r.throughput
    }
    out["failover_trials"] = [
        {
            "killed": t.killed,
            "new_leader": t.new_leader,
            "elected_s": round(t.elected_s, 3),
            "commit_s": round(t.commit_s, 3),
            "epochs": t.epochs,
        }
        for t in r.failover
    ]
    out |= {
        "quick": params.quick,
        "raft_timeouts": "defaults",
        "election_timeout_ms": ELECTION_TIMEOUT_MS,
        "fetch_timeout_ms": FETCH_TIMEOUT_MS,
        "fetch_max_wait_ms": FETCH_MAX_WAIT_MS,
        "append_linger_ms": RAFT_DEFAULTS.append_linger_ms,
        "snapshot_every_records": SNAPSHOT_EVERY_RECORDS,
        "latency_mode": "open loop, paced",
        "latency_rate_per_s": RATE_PER_S,
        "latency_proposals": params.latency_proposals,
        "baseline_requests": params.baseline_requests,
        "fsync_samples": params.fsync_samples,
        "throughput_mode": "pipelined",
        "throughput_connections": params.connections,
        "throughput_pipeline_depth": params.pipeline_depth,
        "throughput_window_s": params.throughput_window_s,
        "throughput_warmup_s": params.throughput_warmup_s,
        "failover_trials_count": len(r.failover),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "load_average_1m_at_start": round(load_at_start, 2),
        "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        "elapsed_s": round(elapsed_s, 1),
    }
    return out | source_version()


def source_version() -> dict[str, Any]:
    """The commit measured, and whether raft/ had uncommitted changes."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    dirty = bool(git("status", "--porcelain", "--", "raft", "storage", "proto"))
    return {"git_commit": commit or None, "raft_uncommitted_changes": dirty}


def verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def print_table(params: Params, r: Results) -> None:
    b, lat = r.baseline, r.latency.latency
    print(f"\n{'latency (ms)':<46}{'p50':>8}{'p90':>8}{'p99':>8}{'max':>8}  target")
    rows: list[tuple[str, Distribution, str]] = [
        (f"baseline: line echo round trip, {RATE_PER_S}/s", b.echo.latency, ""),
        (f"baseline: gRPC unary round trip, {RATE_PER_S}/s", b.grpc.latency, ""),
        (f"baseline: write {FSYNC_WRITE_BYTES} B + fdatasync", b.fsync, ""),
        (
            f"commit INCR 1, {RATE_PER_S}/s open loop",
            lat,
            f"p99 <= 10: {verdict(lat.p99_ms <= 10)}",
        ),
    ]
    for label, d, target in rows:
        figures = f"{d.p50_ms:>8.2f}{d.ms(0.9):>8.2f}{d.p99_ms:>8.2f}{d.max_ms:>8.2f}"
        print(f"{label:<46}{figures}  {target}")
    floor = f"{r.floor_p50_ms:>8.2f}{'':>8}{r.floor_p99_ms:>8.2f}"
    print(f"{'floor: 2 x echo + 2 x fdatasync':<46}{floor}")
    ratios = f"{lat.p50_ms / r.floor_p50_ms:>8.2f}{'':>8}{lat.p99_ms / r.floor_p99_ms:>8.2f}"
    print(f"{'ratio commit / floor':<46}{ratios}")
    by_round = "; ".join(
        f"{name} " + " / ".join(f"{d.p99_ms:.1f}" for d in side) for name, side in r.rounds.items()
    )
    print(f"p99 by round (ms): {by_round}")

    print(
        f"\n{'throughput, pipelined':<30}{'records/s':>10}{'requests/s':>11}{'p50 ms':>8}"
        f"{'p99 ms':>8}{'errors':>7}  CPU s in window  target"
    )
    loads: list[tuple[str, Load, float, str]] = [
        (f"baseline: line echo {params.connections}x{params.pipeline_depth}", b.echo_load, 0.0, ""),
    ]
    for t in r.throughput:
        label = f"INCR {t.records_per_proposal} {t.load.connections}x{t.load.pipeline_depth}"
        target = f">= 20000: {verdict(t.records_per_s >= 20_000)}"
        loads.append((label, t.load, t.records_per_s, target))
    for label, load, records, target in loads:
        cpu = ", ".join(f"{name} {c:.1f}" for name, c in load.server_cpu_s.items())
        records_text = f"{records:.0f}" if records else "-"
        print(
            f"{label:<30}{records_text:>10}{load.requests_per_s:>11.0f}"
            f"{load.latency.p50_ms:>8.1f}{load.latency.p99_ms:>8.1f}{load.errors:>7}"
            f"  client {load.client_cpu_s:.1f}, {cpu}  {target}"
        )
    single = r.throughput[0]
    print(
        f"{'ratio INCR 1 / echo':<30}{'':>10}"
        f"{single.proposals_per_s / b.echo_load.requests_per_s:>11.3f}"
    )

    fo, el = r.failover_s, r.elected_s
    print(f"\n{'failover (s), ' + str(len(fo)) + ' trials':<40}{'median':>8}{'max':>8}  target")
    print(
        f"{'kill -9 -> a survivor reports leader':<40}{statistics.median(el):>8.3f}{max(el):>8.3f}"
    )
    print(
        f"{'kill -9 -> first new commit':<40}{statistics.median(fo):>8.3f}{max(fo):>8.3f}"
        f"  median <= 1.5: {verdict(statistics.median(fo) <= 1.5)}"
    )
    repeated = sum(t.epochs > 1 for t in r.failover)
    print(f"trials that needed more than one election (epoch moved by 2 or more): {repeated}")
    print(
        f"\nRaft timeouts: defaults (election {ELECTION_TIMEOUT_MS} ms, fetch "
        f"{FETCH_TIMEOUT_MS} ms, fetch max wait {FETCH_MAX_WAIT_MS} ms, "
        f"linger {RAFT_DEFAULTS.append_linger_ms} ms); "
        f"snapshot every {SNAPSHOT_EVERY_RECORDS} records.\n"
        f"latency: {params.latency_proposals} proposals in {ROUNDS} rounds alternating with "
        f"the baselines, after a 1 s warm-up each, open loop (sent on "
        f"schedule on an idle connection; {r.latency.connections_used} connections used, worst "
        f"send lag {r.latency.max_send_lag_ms:.1f} ms); baselines: {params.baseline_requests} "
        f"requests the same way.\nthroughput: {params.throughput_window_s:.0f} s window after "
        f"{params.throughput_warmup_s:.0f} s warm-up; {params.connections} connections, each "
        f"keeping {params.pipeline_depth} requests outstanding; "
        f"CPU = user + system seconds of each process inside the window."
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.raft", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer samples, about a minute")
    parser.add_argument(
        "--dir",
        type=Path,
        default=REPO / "data",
        help="a directory on the disk to measure (a temporary subdirectory is used)",
    )
    parser.add_argument("--connections", type=int, default=8, help="throughput clients")
    parser.add_argument(
        "--pipeline-depth", type=int, default=128, help="outstanding requests per client"
    )
    parser.add_argument(
        "--baseline-server", type=int, nargs=2, metavar="PORT", help=argparse.SUPPRESS
    )
    return parser.parse_args(argv)


@contextmanager
def work_dir(parent: Path) -> Iterator[Path]:
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="bench-raft-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def run(root: Path, params: Params) -> Results:
    server = BaselineServer(root)
    cluster = Cluster(root)
    try:
        await server.start()
        cluster.start()
        await cluster.wait_caught_up(START_TIMEOUT_S)
        phase = await bench_latency(cluster, server, params)
        print(
            f"commit latency p50 {phase.commit.latency.p50_ms:.2f} ms; baselines: echo "
            f"{phase.echo.latency.p50_ms:.2f} ms, gRPC {phase.grpc.latency.p50_ms:.2f} ms, "
            f"fdatasync {phase.fsync.p50_ms:.2f} ms",
            flush=True,
        )
        pids = {"echo server": server.pid}
        echo_load = await pipelined_load(server.line_port, b"INCR 1\n", params, pids)
        server.stop()
        print(f"echo load: {echo_load.requests_per_s:.0f} requests/s", flush=True)
        throughput = []
        for records in (1, 100):
            throughput.append(await bench_throughput(cluster, params, records))
            print(f"INCR {records}: {throughput[-1].records_per_s:.0f} records/s", flush=True)
        failover = await bench_failover(cluster, params.failover_trials)
    except BaseException:
        print(cluster.log_tail(), file=sys.stderr)
        raise
    finally:
        server.stop()
        cluster.stop()
    baseline = Baseline(phase.echo, phase.grpc, phase.fsync, echo_load)
    return Results(baseline, phase.commit, phase.rounds, tuple(throughput), tuple(failover))


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.baseline_server is not None:
        asyncio.run(baseline_server(*args.baseline_server))
        return
    quick: bool = args.quick
    params = Params(
        quick=quick,
        latency_proposals=500 if quick else 2000,
        baseline_requests=300 if quick else 1000,
        fsync_samples=200 if quick else 1000,
        throughput_window_s=5.0 if quick else 10.0,
        throughput_warmup_s=1.0 if quick else 2.0,
        connections=args.connections,
        pipeline_depth=args.pipeline_depth,
        failover_trials=5 if quick else 20,
    )
    load_at_start = os.getloadavg()[0]
    started = time.perf_counter()
    with work_dir(args.dir) as root:
        print(
            f"runnel raft benchmark in {root} (quick={quick}, "
            f"load average {load_at_start:.2f} at start)",
            flush=True,
        )
        results = asyncio.run(run(root, params))
    elapsed = time.perf_counter() - started
    print_table(params, results)
    print(f"finished in {elapsed:.1f} s")
    print(json.dumps(report(params, results, load_at_start, elapsed)))


if __name__ == "__main__":
    main()
