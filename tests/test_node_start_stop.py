"""``runnel node`` processes that cannot start, and one stopped twice: a failed start says
"cannot start: <reason>" once (no traceback), stops what it had started (a broker already
unfenced leaves under control, its logs close with a clean-shutdown marker) and exits 1; a
second SIGTERM during a controlled shutdown that the controller never ends skips the rest of
it. Every wait is bounded; nothing asserts how long anything took."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc.aio
from test_node import write_config

from controller.client import ControllerClient
from proto import controller_pb2 as cpb
from proto import controller_pb2_grpc
from raft.testing.processes import EXIT_TIMEOUT_S, free_ports, kill, spawn_python
from runnel.config import load_config
from storage.dir_lock import DirLock
from storage.log_manager import CLEAN_SHUTDOWN_FILE

WAIT_S = 60  # a node's start, or its stop (well past its 30 s controlled shutdown)


def spawn_node(config: Path, log: Path) -> subprocess.Popen[bytes]:
    return spawn_python(["-m", "runnel", "node", "--config", str(config)], log)


def until(what: str, done: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    """Poll ``done`` (blocking; for the synchronous tests) until true, at most ``timeout_s``."""

    async def poll() -> None:
        await async_until(what, done, timeout_s)

    asyncio.run(poll())


async def async_until(what: str, done: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    try:
        async with asyncio.timeout(timeout_s):
            while not done():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"waited {timeout_s} s for {what}") from None


def says(log: Path, text: str) -> Callable[[], bool]:
    return lambda: log.exists() and text in log.read_text(errors="replace")


def exit_code(proc: subprocess.Popen[bytes]) -> int:
    """Wait (bounded) for ``proc`` to exit; kill it if it does not."""
    try:
        return proc.wait(timeout=WAIT_S)
    finally:
        kill(proc)


@contextmanager
def taken(port: int) -> Iterator[None]:
    """Something else listens on 127.0.0.1:``port`` for the block."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        yield


def failed_start(log: Path) -> str:
    """The one "cannot start" line of a node's log, checked to be an ERROR without a
    traceback anywhere, after the node stopped its parts."""
    text = log.read_text(errors="replace")
    said = [line for line in text.splitlines() if "cannot start" in line]
    assert len(said) == 1, text[-3000:]
    assert "level=ERROR" in said[0], said[0]
    assert "Traceback" not in text, text[-3000:]
    return said[0]


def test_a_node_whose_client_port_is_taken_leaves_under_control_and_exits_1(
    tmp_path: Path,
) -> None:
    """The broker is unfenced (maybe a leader) when its client listener fails to bind: it
    must leave by controlled shutdown and close the partition logs it loaded cleanly."""
    path, controller_port, _ = write_config(tmp_path)
    listener = load_config(path, {}).listener("CLIENT")
    assert listener is not None
    data = tmp_path / "data"
    first_log = tmp_path / "first.log"
    first = spawn_node(path, first_log)
    try:  # a first run leaves a partition log (and a clean-shutdown marker) behind
        until("the first run to be ready", says(first_log, "ready node 1"))
        asyncio.run(create_topic(controller_port, "t"))
        until("the partition's log", (data / "t-0").is_dir)
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=WAIT_S) == 0, first_log.read_text()[-3000:]
    finally:
        kill(first)
    assert (data / CLEAN_SHUTDOWN_FILE).exists()

    log = tmp_path / "second.log"
    with taken(listener.port):
        code = exit_code(spawn_node(path, log))
    text = log.read_text(errors="replace")
    assert code == 1, text[-3000:]
    assert (data / CLEAN_SHUTDOWN_FILE).exists(), "the loaded logs were not closed cleanly"
    assert "broker 1: running -> shutting-down" in text, text[-3000:]  # it had been unfenced
    assert "node 1 stopped" in text, text[-3000:]
    said = failed_start(log)
    assert f"CLIENT 127.0.0.1:{listener.port}" in said and "in use" in said, said


async def create_topic(controller_port: int, name: str) -> None:
    client = ControllerClient({1: f"127.0.0.1:{controller_port}"})
    try:
        topic = cpb.CreatableTopic(name=name, num_partitions=1, replication_factor=1)
        response = await client.call("CreateTopics", cpb.CreateTopicsRequest(topics=[topic]))
        assert [t.error for t in response.topics] == [cpb.NONE]
    finally:
        await client.close()


def test_a_node_whose_data_dir_is_a_file_says_so_and_exits_1(tmp_path: Path) -> None:
    path, _, _ = write_config(tmp_path)
    (tmp_path / "data").write_text("not a directory")
    log = tmp_path / "node.log"
    code = exit_code(spawn_node(path, log))
    assert code == 1, log.read_text()[-3000:]
    said = failed_start(log)
    assert str(tmp_path / "data") in said and "not a directory" in said, said


def test_a_node_on_a_data_dir_another_process_holds_says_so_and_exits_1(tmp_path: Path) -> None:
    """Two nodes on one data directory would each recover, cut and append to the other's
    logs: the data directory's lock (storage.dir_lock) refuses the second before it opens
    anything, and the first keeps running. The lock goes with its process: once the first
    is killed (no clean shutdown), the data directory can be used again."""
    path, _, _ = write_config(tmp_path)
    first_log = tmp_path / "first.log"
    first = spawn_node(path, first_log)
    try:
        until("the first run to be ready", says(first_log, "ready node 1"))
        second_log = tmp_path / "second.log"
        code = exit_code(spawn_node(path, second_log))
        assert code == 1, second_log.read_text()[-3000:]
        said = failed_start(second_log)
        assert str(tmp_path / "data") in said, said
        assert f"in use by another process (pid {first.pid})" in said, said
        assert first.poll() is None, "the first node stopped"
    finally:
        kill(first)
    lock = DirLock(tmp_path / "data")
    lock.acquire()  # SIGKILL left no stale lock
    lock.release()


def test_a_node_whose_metrics_port_is_taken_closes_its_metadata_log_and_exits_1(
    tmp_path: Path,
) -> None:
    path, _, metrics_port = write_config(tmp_path)
    log = tmp_path / "node.log"
    with taken(metrics_port):
        code = exit_code(spawn_node(path, log))
    text = log.read_text(errors="replace")
    assert code == 1, text[-3000:]
    assert f"metrics endpoint 127.0.0.1:{metrics_port}: " in failed_start(log)
    assert "node 1 stopped" in text, text[-3000:]  # the metadata log opened, then closed


# -- a second SIGTERM --------------------------------------------------------------------------


class NeverReleasing(controller_pb2_grpc.ControllerServiceServicer):
    """A controller that registers a broker and answers its heartbeats, but never lets it
    go: a controlled shutdown would last its whole time limit (30 s)."""

    def __init__(self) -> None:
        self.heartbeats: list[cpb.BrokerHeartbeatRequest] = []

    async def RegisterBroker(
        self, request: cpb.RegisterBrokerRequest, context: Any
    ) -> cpb.RegisterBrokerResponse:
        return cpb.RegisterBrokerResponse(broker_epoch=1)

    async def BrokerHeartbeat(
        self, request: cpb.BrokerHeartbeatRequest, context: Any
    ) -> cpb.BrokerHeartbeatResponse:
        self.heartbeats.append(request)
        return cpb.BrokerHeartbeatResponse(is_fenced=True, should_shut_down=False)


def broker_config(tmp_path: Path, controller_port: int) -> Path:
    client, replication = free_ports(2)
    path = tmp_path / "broker.toml"
    path.write_text(
        f"""node_id = 101
process_roles = ["broker"]
listeners = ["CLIENT://127.0.0.1:{client}", "REPLICATION://127.0.0.1:{replication}"]
data_dirs = ["{tmp_path / "data"}"]
controller_quorum_voters = "1@127.0.0.1:{controller_port}"
[broker]
heartbeat_interval_ms = 100
"""
    )
    return path


def test_a_second_sigterm_skips_the_rest_of_the_controlled_shutdown(tmp_path: Path) -> None:
    (controller_port,) = free_ports(1)
    controller = NeverReleasing()
    log = tmp_path / "broker.log"

    async def main() -> int:
        server = grpc.aio.server()
        controller_pb2_grpc.add_ControllerServiceServicer_to_server(controller, server)
        server.add_insecure_port(f"127.0.0.1:{controller_port}")
        await server.start()
        proc = spawn_node(broker_config(tmp_path, controller_port), log)
        try:
            await async_until("the broker to register", says(log, "registered with epoch 1"))
            proc.send_signal(signal.SIGTERM)
            await async_until("the controlled shutdown", says(log, "-> shutting-down"))
            await async_until(
                "a shutdown heartbeat", lambda: any(h.want_shutdown for h in controller.heartbeats)
            )
            proc.send_signal(signal.SIGTERM)
            await async_until("the broker to exit", lambda: proc.poll() is not None)
            return proc.wait(timeout=EXIT_TIMEOUT_S)
        finally:
            kill(proc)
            await server.stop(None)

    code = asyncio.run(main())
    text = log.read_text(errors="replace")
    assert code == 0, text[-3000:]
    second = [line for line in text.splitlines() if "skipping the rest of the controlled" in line]
    assert len(second) == 1 and "level=WARNING" in second[0], text[-3000:]
    assert "controlled shutdown skipped" in text, text[-3000:]
    assert "controlled shutdown timed out" not in text, text[-3000:]
    assert "node 101 stopped" in text, text[-3000:]
