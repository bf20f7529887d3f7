"""Starting, watching, restarting and stopping the node processes of a local cluster.

How this works. The ``Supervisor`` keeps one ``Managed`` record per node of a ``ClusterSpec``
(``runnel/local_cluster.py``), in one of three states:

    RUNNING  the process is alive: a child of this process, or adopted from the node's pid
             file (started by an earlier ``runnel cluster up --once``; watched by its pid)
    BACKOFF  it died unexpectedly and is restarted at ``restart_at``: after 1 s, doubling
             with each death up to 30 s, back to 1 s once a process has run for 60 s
    DOWN     it died with restarts off (``--no-restart``), or it was stopped

    RUNNING -> BACKOFF (death, restarts on) -> RUNNING (restarted)
    RUNNING -> DOWN (death, restarts off; or stop)       BACKOFF -> DOWN (stop)

``poll`` never blocks: the command's loop calls it a few times a second to notice deaths and
make the restarts that are due. ``stop`` stops the brokers first (a broker's controlled
shutdown needs the active controller), then the controllers: SIGTERM, up to
``STOP_TIMEOUT_S`` per group, then SIGKILL; every child is reaped. A node runs in its own
session, so a Ctrl-C in the terminal reaches the supervisor only, and the supervisor decides.
Not thread-safe: one thread drives it.
"""

from __future__ import annotations

import contextlib
import enum
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from runnel.commands import CommandError
from runnel.local_cluster import ClusterSpec, NodeSpec, ports_in_use, process_alive

__all__ = ["Managed", "NodeState", "Supervisor", "next_backoff_s"]

REPO = Path(__file__).resolve().parents[1]
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
BACKOFF_RESET_S = 60.0  # a process that ran this long starts the backoff afresh when it dies
STOP_TIMEOUT_S = 40.0  # per group (brokers, then controllers), after SIGTERM
KILL_WAIT_S = 10.0  # after SIGKILL
WAIT_STEP_S = 0.1


class NodeState(enum.Enum):
    RUNNING = "running"
    BACKOFF = "restarting"
    DOWN = "down"


def next_backoff_s(previous_s: float | None) -> float:
    """The wait before the next restart, given the one before (None: first death)."""
    if previous_s is None:
        return FIRST_BACKOFF_S
    return min(2 * previous_s, MAX_BACKOFF_S)


@dataclass(slots=True)
class Managed:
    """What the supervisor knows of one node's process."""

    node: NodeSpec
    state: NodeState = NodeState.DOWN
    popen: subprocess.Popen[bytes] | None = None  # set when this process started it
    pid: int | None = None
    started_at: float = 0.0
    restarts: int = 0
    deaths: int = 0  # unexpected deaths, ever
    backoff_s: float | None = None  # the last wait before a restart
    restart_at: float = 0.0
    last_exit: str = ""  # how the last process ended, as shown to people


class Supervisor:
    """Runs the nodes of ``cluster``; see the module docstring."""

    def __init__(
        self,
        cluster: ClusterSpec,
        *,
        restart: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cluster = cluster
        self.restart = restart
        self.clock = clock
        self.managed = {n.node_id: Managed(n) for n in cluster.nodes()}

    # -- start -----------------------------------------------------------------------------
    def adopt(self) -> list[int]:
        """Take over the nodes already running (by their pid files); returns their ids."""
        adopted = []
        for node_id, m in self.managed.items():
            pid = self.cluster.running_pid(node_id)
            if pid is not None and m.state is not NodeState.RUNNING:
                m.state, m.pid, m.popen, m.started_at = NodeState.RUNNING, pid, None, self.clock()
                adopted.append(node_id)
        return adopted

    def start(self) -> list[int]:
        """Adopt the running nodes and start the others; returns the ids started. Raises
        CommandError, starting nothing, if a port a missing node needs is taken."""
        self.adopt()
        missing = [m for m in self.managed.values() if m.state is not NodeState.RUNNING]
        owners = {port: (m.node, p) for m in missing for p, port in m.node.ports.items()}
        busy = ports_in_use(sorted(owners))
        if busy:
            taken = ", ".join(
                f"{p} ({owners[p][1].value} of node {owners[p][0].node_id})" for p in busy
            )
            raise CommandError(
                f"ports in use on 127.0.0.1: {taken}. Another cluster or program holds them; "
                f"stop it, or choose other ports with --base-port (new data dirs only)."
            )
        self.cluster.write_node_configs()
        for m in missing:
            self._spawn(m)
        return [m.node.node_id for m in missing]

    def _spawn(self, m: Managed) -> None:
        node_id = m.node.node_id
        command = [sys.executable, "-m", "runnel", "node"]
        command += ["--config", str(self.cluster.config_path(node_id))]
        with open(self.cluster.log_path(node_id), "ab") as log:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
            log.write(f"--- {stamp} runnel cluster up starts node {node_id}\n".encode())
            log.flush()
            m.popen = subprocess.Popen(
                command,
                cwd=self.cluster.node_dir(node_id),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=_node_env(),
                start_new_session=True,
            )
        m.pid = m.popen.pid
        m.state, m.started_at = NodeState.RUNNING, self.clock()
        self.cluster.pid_path(node_id).write_text(f"{m.pid}\n")

    # -- watch -----------------------------------------------------------------------------
    def poll(self) -> list[tuple[int, str]]:
        """Notice deaths and make the restarts that are due; returns what happened: (node
        id, a line for people)."""
        now, events = self.clock(), []
        for node_id, m in self.managed.items():
            if m.state is NodeState.RUNNING and not self._running(m):
                events.append((node_id, self._died(m, now)))
            elif m.state is NodeState.BACKOFF and now >= m.restart_at:
                try:
                    self._spawn(m)
                except OSError as e:  # no log file or no process (a full disk, no fds):
                    m.restarts += 1  # a death like any other, retried after a backoff
                    m.backoff_s = next_backoff_s(m.backoff_s)
                    m.restart_at = now + m.backoff_s
                    events.append(
                        (node_id, f"node {node_id} could not be started: {e}; again in "
                         f"{m.backoff_s:g} s")
                    )  # fmt: skip
                    continue
                m.restarts += 1
                events.append((node_id, f"node {node_id} restarted (pid {m.pid})"))
        return events

    def _died(self, m: Managed, now: float) -> str:
        m.last_exit = _exit_text(m)
        m.deaths += 1
        m.popen = None
        self.cluster.pid_path(m.node.node_id).unlink(missing_ok=True)
        what = f"node {m.node.node_id} (pid {m.pid}) {m.last_exit}"
        m.pid = None
        if not self.restart:
            m.state = NodeState.DOWN
            return f"{what}; not restarting (--no-restart)"
        ran_long = now - m.started_at >= BACKOFF_RESET_S
        m.backoff_s = next_backoff_s(None if ran_long else m.backoff_s)
        m.state, m.restart_at = NodeState.BACKOFF, now + m.backoff_s
        return f"{what}; restarting in {m.backoff_s:g} s"

    def _running(self, m: Managed) -> bool:
        if m.popen is not None:
            return m.popen.poll() is None
        marker = str(self.cluster.config_path(m.node.node_id))
        return m.pid is not None and process_alive(m.pid, marker)

    def note(self, node_id: int) -> str:
        """The node's supervision state for the status view ("" when nothing to say)."""
        m = self.managed[node_id]
        restarts = f"{m.restarts} restart{'s' * (m.restarts != 1)}" if m.restarts else ""
        if m.state is NodeState.BACKOFF:
            wait = math.ceil(max(0.0, m.restart_at - self.clock()))
            return f"{m.last_exit}; restarting in {wait} s" + (f", {restarts}" if restarts else "")
        if m.state is NodeState.DOWN:
            return m.last_exit or "down"
        return restarts

    def pid(self, node_id: int) -> int | None:
        return self.managed[node_id].pid

    # -- stop ------------------------------------------------------------------------------
    def stop(
        self,
        node_ids: Collection[int] | None = None,
        *,
        timeout_s: float = STOP_TIMEOUT_S,
        hurry: Callable[[], bool] = bool,
    ) -> None:
        """Stop the nodes ``node_ids`` (default: all): brokers, then controllers (see the
        module docstring). ``hurry()`` returning True (a second Ctrl-C) cuts the waits short:
        SIGKILL at once."""
        chosen = [m for i, m in self.managed.items() if node_ids is None or i in node_ids]
        for m in chosen:
            if m.state is NodeState.BACKOFF:
                m.state = NodeState.DOWN
        brokers = [m for m in chosen if not m.node.is_controller]
        controllers = [m for m in chosen if m.node.is_controller]
        for group in (brokers, controllers):
            running = [m for m in group if m.state is NodeState.RUNNING and self._running(m)]
            self._signal(running, signal.SIGTERM)
            left = self._wait_gone(running, timeout_s, hurry)
            self._signal(left, signal.SIGKILL)
            self._wait_gone(left, KILL_WAIT_S, lambda: False)
            for m in group:
                self._reap(m)

    def _signal(self, group: list[Managed], signum: int) -> None:
        for m in group:
            if m.pid is not None and self._running(m):
                with contextlib.suppress(ProcessLookupError):  # it just exited
                    os.kill(m.pid, signum)

    def _wait_gone(
        self, group: list[Managed], timeout_s: float, hurry: Callable[[], bool]
    ) -> list[Managed]:
        deadline = time.monotonic() + timeout_s
        left = [m for m in group if self._running(m)]
        while left and time.monotonic() < deadline and not hurry():
            time.sleep(WAIT_STEP_S)
            left = [m for m in left if self._running(m)]
        return left

    def _reap(self, m: Managed) -> None:
        """Collect a stopped process's exit status (if it is our child) and forget it."""
        if m.state is not NodeState.RUNNING:
            return
        if m.popen is not None:
            try:
                m.popen.wait(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:  # unkillable (D state): say so, do not hang
                m.last_exit = f"did not exit after SIGKILL (pid {m.pid})"
                return
        elif self._running(m):
            return  # adopted, and still there after SIGKILL
        m.last_exit = "stopped" if m.popen is None else _exit_text(m)
        self.cluster.pid_path(m.node.node_id).unlink(missing_ok=True)
        m.state, m.popen, m.pid = NodeState.DOWN, None, None


def _exit_text(m: Managed) -> str:
    code = m.popen.poll() if m.popen is not None else None
    if code is None:
        return "exited"  # adopted: not our child, its status is not ours to read
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _node_env() -> dict[str, str]:
    """The environment of a node: ours, with this source tree importable."""
    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = f"{REPO}{os.pathsep}{path}" if path else str(REPO)
    return env
