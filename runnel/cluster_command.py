"""``runnel cluster up|down|status``: a local cluster of separate processes on 127.0.0.1.

    runnel cluster up [--controllers 3] [--brokers 3] [--data-dir DIR] [--base-port P]
                      [--no-restart] [--once] [--start-timeout-s S]
    runnel cluster down [--data-dir DIR]
    runnel cluster status [--json] [--data-dir DIR | --bootstrap HOST:PORT[,..]]

How ``up`` works: it resolves the cluster (``local_cluster.ClusterSpec``: the one saved in
the data dir, or a new one), adopts the nodes still running from an earlier ``up --once``,
starts the others under a ``Supervisor``, and waits (at most ``--start-timeout-s``) until the
cluster is healthy: an active controller answers DescribeCluster and every broker is
registered and unfenced. Then it prints the bootstrap address and a live status view every
2 s until Ctrl-C or SIGTERM, and stops every node. With ``--once`` it returns once healthy,
leaving the nodes running (``cluster down`` stops them); a reader of its output that goes
away (``up --once | head -1``) does not change that. While ``up`` runs, its pid is in
``<data dir>/supervisor.pid``, so ``down`` can ask it to stop the nodes itself (otherwise it
would restart them) and a second ``up`` on the same data dir is refused.

``status`` exits 0 when the cluster is healthy (as ``up`` waits for, and every partition has
a leader), 1 when it is not, saying why (``healthy`` and ``problems`` in ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections import deque
from pathlib import Path
from types import FrameType

from runnel.admin import DEFAULT_DATA_DIR, Controllers, add_target_options, resolve_controllers
from runnel.cluster_status import ClusterStatus, gather, render
from runnel.commands import (
    EXIT_OK,
    EXIT_PROBLEM,
    CommandError,
    Subparsers,
    discard_stdout,
    int_at_least,
    positive_int,
    set_handler,
)
from runnel.kafka_probe import listed_brokers
from runnel.local_cluster import (
    DEFAULT_BASE_PORT,
    DEFAULT_BROKERS,
    DEFAULT_CONTROLLERS,
    HOST,
    ClusterSpec,
    Port,
    process_alive,
    read_pid,
)
from runnel.supervisor import STOP_TIMEOUT_S, NodeState, Supervisor

__all__ = ["register"]

DEFAULT_START_TIMEOUT_S = 60
VIEW_INTERVAL_S = 2.0
POLL_INTERVAL_S = 0.25
STATUS_TIMEOUT_S = 5.0  # `cluster status` waits this long for an active controller
CRASH_LOOP_DEATHS = 5  # deaths of one node while starting that end the wait at once
LOG_TAIL_LINES = 15
SUPERVISOR_MARKER = "cluster\0up"  # in the command line of `[python -m] runnel cluster up`
SUPERVISOR_EXIT_TIMEOUT_S = 2 * STOP_TIMEOUT_S + 30  # it stops brokers, then controllers


def register(groups: Subparsers) -> None:
    """Add the ``cluster`` command group to the top-level parser."""
    cluster = groups.add_parser(
        "cluster",
        help="run a local cluster (separate processes on 127.0.0.1)",
        description="Start, stop and inspect a local cluster of controllers and brokers.",
    )
    commands = cluster.add_subparsers(dest="cluster_command", metavar="COMMAND", required=True)
    _register_up(commands)
    down = commands.add_parser("down", help="stop a local cluster left running")
    _add_data_dir(down)
    set_handler(down, _down)
    status = commands.add_parser(
        "status",
        help="the controller leader and every node; exit 1 when unhealthy",
        description="Show the active controller and every node. Exit 0 when the cluster is "
        "healthy (an active controller answers, every broker is registered and unfenced, "
        "every partition has a leader), 1 when it is not, with the reasons.",
    )
    status.add_argument("--json", action="store_true", help="print one JSON object")
    add_target_options(status)
    set_handler(status, _status)


def _add_data_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        metavar="DIR",
        help=f"where the cluster lives (default: ./{DEFAULT_DATA_DIR})",
    )


def _register_up(commands: Subparsers) -> None:
    up = commands.add_parser(
        "up",
        help="start (or resume) a local cluster and watch it",
        description=(
            "Start a local cluster, or resume the one in --data-dir, wait until it is healthy, "
            "print its bootstrap addresses and a live status view until Ctrl-C, then stop it. "
            "Kafka clients (and `runnel produce|consume`) dial the brokers' bootstrap; "
            "`runnel topics` and `runnel cluster status` dial the controllers."
        ),
    )
    up.add_argument(
        "--controllers", type=positive_int, metavar="N", help=f"default {DEFAULT_CONTROLLERS}"
    )
    up.add_argument("--brokers", type=positive_int, metavar="N", help=f"default {DEFAULT_BROKERS}")
    _add_data_dir(up)
    up.add_argument(
        "--base-port",
        type=int_at_least(1024),
        metavar="PORT",
        help=f"the first of 4 ports per node (default {DEFAULT_BASE_PORT})",
    )
    up.add_argument("--no-restart", action="store_true", help="do not restart a node that dies")
    up.add_argument(
        "--once",
        action="store_true",
        help="exit once healthy and leave the cluster running (stop it with `cluster down`)",
    )
    up.add_argument(
        "--start-timeout-s",
        type=positive_int,
        metavar="S",
        default=DEFAULT_START_TIMEOUT_S,
        help=f"how long to wait for a healthy cluster (default {DEFAULT_START_TIMEOUT_S})",
    )
    set_handler(up, _up)


# -- up ----------------------------------------------------------------------------------------


class Signals:
    """SIGINT/SIGTERM while ``up`` runs: the first asks to stop, a second to hurry."""

    def __init__(self) -> None:
        self.count = 0
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1

    @property
    def stopping(self) -> bool:
        return self.count > 0

    def hurry(self) -> bool:
        return self.count > 1


def _up(args: argparse.Namespace) -> int:
    cluster = ClusterSpec.resolve(args.data_dir, args.controllers, args.brokers, args.base_port)
    cluster.data_dir.mkdir(parents=True, exist_ok=True)
    _claim_supervision(cluster)
    signals = Signals()
    supervisor = Supervisor(cluster, restart=not args.no_restart)
    started: list[int] = []
    keep_running = False
    try:
        started = supervisor.start()
        cluster.save()
        _say_started(cluster, supervisor, started, args.once)
        _wait_healthy(cluster, supervisor, args.start_timeout_s, signals)
        if args.once:
            keep_running = True  # whatever happens to the output from here on
            pids = " ".join(f"{i}={supervisor.pid(i)}" for i in supervisor.managed)
            _say_ready(cluster, args.once, f"pids: {pids}")
            return EXIT_OK
        _say_ready(cluster, args.once)
        started = list(supervisor.managed)  # from here on, stopping stops every node
        _watch(cluster, supervisor, signals)
        return EXIT_OK
    finally:
        if started and not keep_running:
            print(f"stopping nodes {_ids(started)} ...", file=sys.stderr, flush=True)
            supervisor.stop(started, hurry=signals.hurry)
        cluster.supervisor_pid_path.unlink(missing_ok=True)


def _claim_supervision(cluster: ClusterSpec) -> None:
    path = cluster.supervisor_pid_path
    pid = read_pid(path)
    if pid is not None and pid != os.getpid() and process_alive(pid, SUPERVISOR_MARKER):
        raise CommandError(
            f"`runnel cluster up` (pid {pid}) already runs the cluster in {cluster.data_dir}; "
            "stop it first (Ctrl-C there, or `runnel cluster down`)"
        )
    path.write_text(f"{os.getpid()}\n")


def _say(text: str, once: bool) -> None:
    """Print to standard output. For ``up --once`` a reader that went away (``| head -1``)
    must not stop the cluster it starts: the rest of the output goes nowhere instead."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        if not once:
            raise
        discard_stdout()


def _say_ready(cluster: ClusterSpec, once: bool, *more: str) -> None:
    lines = [
        f"bootstrap: {cluster.kafka_bootstrap}  (Kafka clients)",
        f"controllers: {cluster.bootstrap}  (runnel topics, runnel cluster status)",
        *more,
    ]
    _say("\n".join(lines), once)


def _say_started(
    cluster: ClusterSpec, supervisor: Supervisor, started: list[int], once: bool
) -> None:
    adopted = [i for i in supervisor.managed if i not in started]
    _say(
        f"cluster in {cluster.data_dir}: {_count(cluster.controllers, 'controller')}, "
        f"{_count(cluster.brokers, 'broker')}; started nodes {_ids(started)}"
        + (f", already running {_ids(adopted)}" if adopted else ""),
        once,
    )


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' * (n != 1)}"


def _ids(ids: list[int]) -> str:
    return ",".join(map(str, ids)) or "none"


def _wait_healthy(
    cluster: ClusterSpec, supervisor: Supervisor, timeout_s: int, signals: Signals
) -> None:
    """Wait until healthy; raise CommandError (with the failing nodes' log tails) when the
    time is up, a node is down for good or keeps dying, or a signal asks to stop."""
    controllers = Controllers(cluster.controller_addresses(), cluster)
    deadline = time.monotonic() + timeout_s
    while True:
        for _, event in supervisor.poll():
            print(event, file=sys.stderr, flush=True)
        failing = _crashing(supervisor)
        if failing:
            raise CommandError(_failure(cluster, "; ".join(failing.values()), list(failing)))
        if signals.stopping:
            raise CommandError("interrupted before the cluster was healthy")
        status = gather(controllers, timeout_s=0)
        problems = status.unhealthy() or _kafka_problems(cluster)
        if not problems:
            return
        if time.monotonic() >= deadline:
            why = f"not healthy after {timeout_s} s: {'; '.join(problems)}"
            raise CommandError(_failure(cluster, why, _suspects(cluster, status, supervisor)))
        time.sleep(POLL_INTERVAL_S)


def _kafka_problems(cluster: ClusterSpec) -> list[str]:
    """Brokers whose Kafka listener is not up yet or does not list every broker."""
    brokers = [n for n in cluster.nodes() if not n.is_controller]
    everyone = sorted(n.node_id for n in brokers)
    problems = []
    for node in brokers:
        listed = listed_brokers(HOST, node.ports[Port.CLIENT])
        if listed != everyone:
            seen = "does not answer" if listed is None else f"lists brokers {listed}"
            problems.append(f"broker {node.node_id}'s Kafka listener {seen}")
    return problems


def _crashing(supervisor: Supervisor) -> dict[int, str]:
    """Nodes that died for good, or again and again, while the cluster started: why."""
    failing = {}
    for node_id, m in supervisor.managed.items():
        if m.state is NodeState.DOWN:
            failing[node_id] = f"node {node_id} {m.last_exit} (restarts are off)"
        elif m.deaths >= CRASH_LOOP_DEATHS:
            failing[node_id] = f"node {node_id} died {m.deaths} times, last {m.last_exit}"
    return failing


def _suspects(cluster: ClusterSpec, status: ClusterStatus, supervisor: Supervisor) -> list[int]:
    """Whose log to show: the controllers when none is active, else the unhealthy brokers;
    and any node that died meanwhile."""
    if status.controller_address is None:
        ids = set(cluster.controller_addresses())
    else:
        ids = {n.node_id for n in status.brokers if n.node_id is not None and n.fenced is not False}
    return sorted(ids | {i for i, m in supervisor.managed.items() if m.deaths})


def _failure(cluster: ClusterSpec, why: str, node_ids: list[int]) -> str:
    parts = [why]
    for node_id in node_ids:
        path = cluster.log_path(node_id)
        parts.append(f"--- last lines of {path}:\n{_tail(path)}")
    return "\n".join(parts)


def _tail(path: Path) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(deque(f, maxlen=LOG_TAIL_LINES)).rstrip() or "(empty)"
    except OSError as e:
        return f"(unreadable: {e.strerror})"


def _watch(cluster: ClusterSpec, supervisor: Supervisor, signals: Signals) -> None:
    """The live status view, every VIEW_INTERVAL_S, until a signal asks to stop."""
    controllers = Controllers(cluster.controller_addresses(), cluster)
    tty = sys.stdout.isatty()
    next_view, last_key = 0.0, None
    while not signals.stopping:
        for _, event in supervisor.poll():
            print(event, file=sys.stderr, flush=True)
        if time.monotonic() >= next_view:
            status = gather(controllers, timeout_s=0, notes=supervisor.note)
            key = _view_key(status)
            if tty:
                print(
                    "\x1b[H\x1b[2J" + render(status) + "\n\nCtrl-C stops the cluster.", flush=True
                )
            elif key != last_key:  # a log, not a screen: print changes only
                print(render(status) + "\n", flush=True)
            last_key, next_view = key, time.monotonic() + VIEW_INTERVAL_S
        time.sleep(POLL_INTERVAL_S)


def _view_key(status: ClusterStatus) -> tuple[object, ...]:
    """What a change worth printing to a log changes (not offsets, lags or countdowns)."""
    nodes = tuple(
        (n.node_id, n.pid, n.alive, n.registered, n.fenced, n.broker_epoch, n.partitions, n.leaders)
        for n in status.nodes
    )
    return status.controller_id, status.controller_epoch, status.topics, nodes


# -- down and status ---------------------------------------------------------------------------


def _down(args: argparse.Namespace) -> int:
    cluster = ClusterSpec.load(args.data_dir)
    if cluster is None:
        raise CommandError(f"no local cluster in {args.data_dir.absolute()} (no cluster.json)")
    supervisor_pid = _stop_supervisor(cluster)
    if supervisor_pid is not None:
        print(f"`runnel cluster up` (pid {supervisor_pid}) stopped its nodes")
    supervisor = Supervisor(cluster, restart=False)
    adopted = supervisor.adopt()
    supervisor.stop()
    left = [i for i in supervisor.managed if cluster.running_pid(i) is not None]
    if left:
        raise CommandError(f"nodes {_ids(left)} are still running after SIGKILL")
    if adopted:
        print(f"stopped nodes {_ids(adopted)}")
    elif supervisor_pid is None:
        print("no node was running")
    return EXIT_OK


def _stop_supervisor(cluster: ClusterSpec) -> int | None:
    """Ask a running ``cluster up`` to stop its nodes (it would restart them otherwise) and
    wait for it; returns its pid, or None if none was running."""
    pid = read_pid(cluster.supervisor_pid_path)
    if pid is None or not process_alive(pid, SUPERVISOR_MARKER):
        return None
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + SUPERVISOR_EXIT_TIMEOUT_S
    while process_alive(pid, SUPERVISOR_MARKER) and time.monotonic() < deadline:
        time.sleep(0.1)
    if process_alive(pid, SUPERVISOR_MARKER):
        message = f"`runnel cluster up` (pid {pid}) did not exit; stopping the nodes here"
        print(message, file=sys.stderr)
    return pid


def _status(args: argparse.Namespace) -> int:
    controllers = resolve_controllers(args)
    status = gather(controllers, timeout_s=STATUS_TIMEOUT_S)
    problems = _health_problems(status)
    if args.json:
        print(
            json.dumps(
                {**status.to_json(), "healthy": not problems, "problems": problems}, indent=2
            )
        )
    else:
        health = f"UNHEALTHY: {'; '.join(problems)}" if problems else "healthy"
        print(f"{render(status)}\n\nhealth: {health}")
    if status.controller_address is None:
        print(
            f"runnel: no active controller answered at {controllers.described}",
            file=sys.stderr,
        )
    elif problems:
        print(f"runnel: the cluster is unhealthy: {'; '.join(problems)}", file=sys.stderr)
    return EXIT_PROBLEM if problems else EXIT_OK


def _health_problems(status: ClusterStatus) -> list[str]:
    """Why the cluster is unhealthy: what ``up`` waits for, and partitions without a leader
    (the active controller counts the partitions, and each registered broker's leaderships)."""
    problems = status.unhealthy()
    if status.controller_address is None or status.partitions is None:
        return problems
    led = sum(b.leaders or 0 for b in status.brokers if b.registered)
    if led < status.partitions:
        n = status.partitions - led
        problems.append(f"{n} partition{'s' * (n != 1)} without a leader")
    return problems
