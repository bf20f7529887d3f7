"""The measurements of bench.produce_consume's replication runs, on a cluster of 1 controller
and 3 brokers (``produce_consume_cluster.RunnelCluster``), one function per kind of run.

How this works. Every load goes to the partitions' leaders, found with
a Metadata request. Nothing is pinned: the three brokers, the controller and the load share
the machine's CPUs as the scheduler places them (pinned, the three brokers would share one
core). A broker is stopped, killed and started again through the cluster's supervisor, so
the end of the run stops every process whatever happened. Every wait is bounded.

  produce_run  ``kafka_load produce --route`` (acks 1 or -1) into the partitions' leaders
               (the "leader" column: partition 0's); the CPU of each
               broker is read from /proc around the run.
  catch_up     a follower is stopped (SIGTERM: a controlled shutdown), ``catch_up_bytes`` of
               records are produced with acks=1, the other follower is let catch up, then the
               stopped one is started again. Its progress is read from the partition's ``.log``
               files on disk every ``POLL_S`` (a follower appends the leader's batches
               verbatim, so its log is caught up exactly when its files hold as many bytes as
               the leader's): MB/s = the bytes it lacked / (the time its files held them all -
               the time they first grew). The raw baseline sends the very same bytes of the
               leader's files with ``os.sendfile`` to a process writing them into a file.
  failover     a paced acks=all probe (``produce_consume_replication_load probe``) writes to
               the leader; after a second of acknowledged writes the leader gets SIGKILL; the
               unavailability is from the kill to the probe's first write acknowledged by the
               new leader. The controller's "fenced brokers" log line (wall clock, ms) and
               the probe's first Metadata answer naming the new leader split it into
               detection, election and its propagation, and the new leader's first commit.
               The killed broker is started again and the next kill waits until it is back
               in the ISR.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from bench.kafka_load import VALUE_BYTES, Connection, LoadError
from bench.produce_consume_cluster import PartitionState, RunnelCluster, partition_states
from bench.produce_consume_figures import Run
from bench.produce_consume_procs import Proc, cpu_seconds, cpu_times, machine_busy_s
from bench.produce_consume_replication_figures import (
    CatchUp,
    Failover,
    RawCopy,
    ReplicatedRun,
    ReplicationParams,
)

__all__ = ["Brokers", "catch_up", "failover", "produce_run"]

LOAD = "bench.kafka_load"
REPLICATION_LOAD = "bench.produce_consume_replication_load"
READY_TIMEOUT_S = 60.0
GRACE_S = 30.0
ISR_TIMEOUT_S = 120.0  # a restarted broker back in the ISR; a follower caught up
STOP_TIMEOUT_S = 60.0  # a broker's controlled shutdown
EXIT_TIMEOUT_S = 10.0  # a killed broker gone
CATCH_UP_PRODUCE_MAX_S = 300.0
CATCH_UP_TIMEOUT_S = 300.0
RAW_TIMEOUT_S = 120.0
POLL_S = 0.01  # the catch-up's log sizes are read this often
STATE_POLL_S = 0.1
WARM_S = 1.0  # acknowledged writes before the kill
FAILOVER_BOUND_S = 60.0  # over the session timeout: the probe's own limit
CONTROLLER_ID = 1
# controller/service.py's line, with logging's default time format (local time, ms)
FENCED_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*fenced brokers \[([\d, ]*)\]")
T = TypeVar("T")


def step(text: str) -> None:
    print(text, flush=True)


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float, every_s: float) -> T:
    deadline = time.monotonic() + timeout_s
    while (found := probe()) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:g} s")
        time.sleep(every_s)
    return found


class Brokers:
    """The 3-broker cluster's brokers: where they are, their partitions' state and logs, and
    stopping and starting them. Use from one thread."""

    def __init__(self, cluster: RunnelCluster) -> None:
        self.cluster = cluster
        self.ids = cluster.broker_ids

    def pids(self) -> dict[int, int]:
        out = {}
        for broker in self.ids:
            pid = self.cluster.supervisor.pid(broker)
            if pid is not None:
                out[broker] = pid
        return out

    def state(self, topic: str) -> PartitionState | None:
        """Partition 0 as the first running broker that answers sees it (the others are
        ready too by then: topics are created with every ISR full)."""
        for broker in self.pids():
            try:
                conn = Connection.connect(self.cluster.address(broker))
            except OSError:
                continue
            try:
                return min(partition_states(conn, topic))
            except (OSError, LoadError, ValueError):
                continue
            finally:
                conn.close()
        return None

    def listed_everywhere(self, topic: str, partitions: int) -> None:
        """Until every running broker's Metadata lists ``topic``'s partitions with leaders (a
        broker applies a new topic's record a moment after the one that created it)."""

        def everywhere() -> bool | None:
            for broker in self.pids():
                try:
                    conn = Connection.connect(self.cluster.address(broker))
                except OSError:
                    return None
                try:
                    states = partition_states(conn, topic)
                except (OSError, LoadError, ValueError):
                    return None
                finally:
                    conn.close()
                if len(states) != partitions or any(s.leader < 0 for s in states):
                    return None
            return True

        wait_for(f"every broker to list {topic}", everywhere, ISR_TIMEOUT_S, STATE_POLL_S)

    def led(self, topic: str, isr_size: int) -> PartitionState:
        """Once the partition has a leader and ``isr_size`` replicas in its ISR."""

        def ready() -> PartitionState | None:
            found = self.state(topic)
            ok = found is not None and found.leader >= 0 and len(found.isr) >= isr_size
            return found if ok else None

        what = f"{topic}: a leader and {isr_size} replica(s) in the ISR"
        return wait_for(what, ready, ISR_TIMEOUT_S, STATE_POLL_S)

    def log_files(self, broker: int, topic: str) -> list[Path]:
        directory = self.cluster.spec.node_dir(broker) / "data" / f"{topic}-0"
        return sorted(directory.glob("*.log"))

    def log_bytes(self, broker: int, topic: str) -> int:
        total = 0
        for path in self.log_files(broker, topic):
            try:
                total += path.stat().st_size
            except FileNotFoundError:  # a segment deleted meanwhile
                continue
        return total

    def stop(self, broker: int) -> None:
        """SIGTERM (a controlled shutdown), SIGKILL after ``STOP_TIMEOUT_S``."""
        self.cluster.supervisor.stop([broker], timeout_s=STOP_TIMEOUT_S)

    def kill(self, broker: int) -> int:
        """SIGKILL; returns when it was sent (CLOCK_MONOTONIC ns), once the process is gone."""
        pid = self.pids()[broker]
        killed_ns = time.monotonic_ns()
        os.kill(pid, signal.SIGKILL)

        def gone() -> bool | None:
            events = self.cluster.supervisor.poll()
            others = [line for b, line in events if b != broker]
            if others:
                raise RuntimeError("; ".join(others))
            return True if events else None

        wait_for(f"broker {broker} gone after SIGKILL", gone, EXIT_TIMEOUT_S, 0.05)
        return killed_ns

    def start(self, broker: int) -> float:
        """Start the broker again (the supervisor starts whatever node is not running);
        returns when (``time.monotonic``)."""
        started = time.monotonic()
        if self.cluster.supervisor.start() != [broker]:
            raise RuntimeError(f"starting broker {broker} started other nodes too")
        return started

    def fenced_at(self, broker: int, since: float) -> float | None:
        """When (``time.time``, ms resolution) the controller's log says it fenced
        ``broker``, at ``since`` or later; None if it does not."""
        try:
            text = self.cluster.spec.log_path(CONTROLLER_ID).read_text(errors="replace")
        except OSError:
            return None
        for line in text.splitlines():
            found = FENCED_LINE.match(line)
            if found is None or str(broker) not in found[2].replace(" ", "").split(","):
                continue
            when = datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            if when >= since - 0.001:
                return when
        return None

    def wait_in_isr(self, topic: str, broker: int) -> float:
        """Until Metadata shows ``broker`` in the ISR; returns when."""

        def joined() -> float | None:
            found = self.state(topic)
            return time.monotonic() if found is not None and broker in found.isr else None

        return wait_for(f"broker {broker} in the ISR of {topic}", joined, ISR_TIMEOUT_S, 0.05)


# --- produce ------------------------------------------------------------------------------


def produce_run(
    label: str,
    brokers: Brokers,
    topic: str,
    replication_factor: int,
    acks: int,
    rp: ReplicationParams,
    *,
    records: int | None = None,
    max_s: float | None = None,
    isr_size: int | None = None,
) -> ReplicatedRun:
    """The raw generator into ``topic``'s leader until ``records`` or ``max_s``, once the
    ISR has ``isr_size`` replicas (default: all of them)."""
    records = rp.records if records is None else records
    max_s = rp.max_s if max_s is None else max_s
    state = brokers.led(topic, replication_factor if isr_size is None else isr_size)
    args = ["produce", "--bootstrap", brokers.cluster.address(state.leader), "--topic", topic]
    args += ["--route"]  # each partition's batches to its leader
    args += ["--records", str(records), "--max-s", str(max_s), "--acks", str(acks)]
    args += ["--in-flight", str(rp.in_flight), "--batch-bytes", str(rp.batch_bytes)]
    proc = Proc(label, LOAD, args, None)
    try:
        proc.ready(READY_TIMEOUT_S)
        pids = brokers.pids()
        times0 = {b: cpu_times(pid) for b, pid in pids.items()}
        busy0, start = machine_busy_s(), time.monotonic()
        result = proc.result(max_s + GRACE_S)
        times = {b: cpu_times(pid) for b, pid in pids.items()}
        busy, wall = machine_busy_s() - busy0, time.monotonic() - start
    finally:
        proc.stop()
    cpu = {b: sum(times[b]) - sum(times0[b]) for b in pids}
    servers = sum(cpu.values())
    kernel = sum(times[b][1] - times0[b][1] for b in pids)
    run = Run(
        label,
        "produce",
        result["partitions"],
        "raw protocol",
        "runnel",
        result["records"],
        result["wire_bytes"],
        result["seconds"],
        result["cpu_s"],
        servers,
        max(0.0, busy - servers - float(result["cpu_s"])) / wall,
        result["batch_bytes"],
        kernel,
    )
    return ReplicatedRun(run, topic, replication_factor, acks, state.leader, cpu)


# --- catch-up -------------------------------------------------------------------------------


def catch_up(brokers: Brokers, topic: str, rp: ReplicationParams, root: Path) -> CatchUp:
    state = brokers.led(topic, len(brokers.ids))
    leader = state.leader
    other, follower = (r for r in state.replicas if r != leader)
    step(f"catch-up: stopping follower {follower} (SIGTERM); leader {leader}")
    brokers.stop(follower)
    records = rp.catch_up_bytes // VALUE_BYTES
    label = f"produce while follower {follower} is down"
    produce = produce_run(
        label, brokers, topic, 3, 1, rp, records=records, max_s=CATCH_UP_PRODUCE_MAX_S, isr_size=1
    )
    target = brokers.log_bytes(leader, topic)

    def other_done() -> bool | None:
        return True if brokers.log_bytes(other, topic) >= target else None

    wait_for(f"follower {other} caught up", other_done, CATCH_UP_TIMEOUT_S, STATE_POLL_S)
    lacked = target - brokers.log_bytes(follower, topic)
    step(f"catch-up: {produce.run.records:,} records produced; starting follower {follower}")
    started = brokers.start(follower)
    first, done, cpu, busy = _watch_catch_up(brokers, topic, leader, follower, target)
    in_isr = brokers.wait_in_isr(topic, follower)
    raw = raw_copy(brokers.log_files(leader, topic), target - lacked, root)
    if raw.bytes != lacked:
        raise RuntimeError(f"raw catch-up copy moved {raw.bytes} bytes, expected {lacked}")
    return CatchUp(
        follower,
        leader,
        produce,
        lacked,
        first - started,
        done - first,
        in_isr - started,
        cpu[leader],
        cpu[follower],
        max(0.0, busy - cpu[leader] - cpu[follower]) / (done - first),
        POLL_S,
        raw,
    )


def _watch_catch_up(
    brokers: Brokers, topic: str, leader: int, follower: int, target: int
) -> tuple[float, float, dict[int, float], float]:
    """(first growth, caught up) of the follower's log files, and each side's CPU seconds
    and the machine's busy CPU seconds between the two."""
    initial = brokers.log_bytes(follower, topic)
    deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
    first: float | None = None
    cpu0: dict[int, float] = {}
    busy0 = 0.0
    while True:
        size, now = brokers.log_bytes(follower, topic), time.monotonic()
        if first is None and size > initial:
            first, busy0 = now, machine_busy_s()
            pids = brokers.pids()
            cpu0 = {b: cpu_seconds(pids[b]) for b in (leader, follower)}
        if size >= target and first is not None:
            pids = brokers.pids()
            cpu = {b: cpu_seconds(pids[b]) - cpu0[b] for b in (leader, follower)}
            return first, now, cpu, machine_busy_s() - busy0
        if now > deadline:
            raise TimeoutError(
                f"follower {follower}: {size:,} of {target:,} log bytes after "
                f"{CATCH_UP_TIMEOUT_S:g} s"
            )
        brokers.cluster.check_alive()
        time.sleep(POLL_S)


def raw_copy(files: list[Path], skip_bytes: int, root: Path) -> RawCopy:
    """The leader's log bytes after ``skip_bytes``, sendfile'd to a process that writes them
    into a file under ``root``."""
    receiver = Proc(
        "raw catch-up receiver", REPLICATION_LOAD, ["raw-receive", "--dir", str(root)], None
    )
    sender = None
    try:
        port = receiver.ready(READY_TIMEOUT_S)
        args = ["raw-send", "--address", f"127.0.0.1:{port}", "--skip-bytes", str(skip_bytes)]
        args += ["--files", *map(str, files)]
        sender = Proc("raw catch-up sender", REPLICATION_LOAD, args, None)
        sent = sender.result(RAW_TIMEOUT_S)
        received = receiver.result(RAW_TIMEOUT_S)
    finally:
        receiver.stop()
        if sender is not None:
            sender.stop()
    return RawCopy(received["bytes"], received["seconds"], sent["cpu_s"], received["cpu_s"])


# --- failover ---------------------------------------------------------------------------------


def failover(
    brokers: Brokers, topic: str, rp: ReplicationParams, session_timeout_ms: int
) -> Failover:
    killed = brokers.led(topic, len(brokers.ids)).leader
    max_s = WARM_S + session_timeout_ms / 1000 + FAILOVER_BOUND_S
    args = ["probe", "--topic", topic, "--max-s", str(max_s), "--stop-after-s", "1"]
    args += ["--brokers", ",".join(brokers.cluster.address(b) for b in brokers.ids)]
    args += ["--interval-ms", str(rp.probe_interval_ms), "--backoff-ms", str(rp.probe_backoff_ms)]
    probe = Proc("failover probe", REPLICATION_LOAD, args, None)
    try:
        probe.ready(READY_TIMEOUT_S)
        time.sleep(WARM_S)
        killed_wall = time.time()
        killed_ns = brokers.kill(killed)
        step(f"failover: leader {killed} killed (SIGKILL)")
        result = probe.result(max_s + GRACE_S)
    finally:
        probe.stop()
    fenced = brokers.fenced_at(killed, killed_wall)
    fenced_after_s = None if fenced is None else fenced - killed_wall
    started = brokers.start(killed)
    in_isr = brokers.wait_in_isr(topic, killed)
    return _failover_figures(killed, killed_ns, result, fenced_after_s, in_isr - started)


def _failover_figures(
    killed: int,
    killed_ns: int,
    result: dict[str, Any],
    fenced_after_s: float | None,
    restart_to_isr_s: float,
) -> Failover:
    acks = [(int(t), int(leader), int(offset)) for t, leader, offset in result["acks"]]
    before = [a for a in acks if a[0] < killed_ns and a[1] == killed]
    after = [a for a in acks if a[0] >= killed_ns and a[1] != killed]
    if not before or not after:
        raise RuntimeError(
            f"failover of leader {killed}: {len(before)} writes acknowledged before the kill, "
            f"{len(after)} by a new leader after it; errors: {_error_counts(result, 0, 2**63)}"
        )
    first_after = after[0][0]
    named = min(int(t) for t, leader in result["lookups"] if t >= killed_ns and leader != killed)
    return Failover(
        killed,
        after[0][1],
        (first_after - killed_ns) / 1e9,
        fenced_after_s,
        (named - killed_ns) / 1e9,
        (killed_ns - before[-1][0]) / 1e9,
        len(before),
        len(after),
        _error_counts(result, killed_ns, first_after),
        max(a[2] for a in before) < min(a[2] for a in after),
        restart_to_isr_s,
    )


def _error_counts(result: dict[str, Any], start_ns: int, end_ns: int) -> dict[str, int]:
    return dict(Counter(what for t, _, what in result["errors"] if start_ns <= t <= end_ns))
