"""The controller client against stand-in controllers on real gRPC servers: a call's own
policy lets its attempts skip a controller that hangs (a paused process) within the call's
time limit, and a controller that was unreachable for a while is reached again soon after it
is back (the channels' reconnect backoff is bounded).

Found on real processes: after a controller failover the new active controller fenced every
live broker, because their heartbeats waited 5 s on the paused old controller, or gRPC held
off reconnecting to a restarted one, past the 3 s session timeout
(tests/replication/test_controller_failover_cluster.py under load).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import grpc
import grpc.aio

from broker.lifecycle import BrokerLifecycle
from controller.client import ControllerClient, ControllerUnavailable, RetryPolicy
from proto import controller_pb2 as cpb
from proto import controller_pb2_grpc

HANG_S = 60.0  # a hung controller's answer: never, as far as a test goes


class _Controller(controller_pb2_grpc.ControllerServiceServicer):
    def __init__(self, hang: bool) -> None:
        self.hang = hang
        self.heartbeats = 0

    async def BrokerHeartbeat(self, request: Any, context: Any) -> cpb.BrokerHeartbeatResponse:
        self.heartbeats += 1
        if self.hang:
            await asyncio.sleep(HANG_S)
        return cpb.BrokerHeartbeatResponse(is_fenced=False)


async def _serve(controller: _Controller, port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    controller_pb2_grpc.add_ControllerServiceServicer_to_server(controller, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, bound


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_short_attempts_move_past_a_hung_controller_within_the_call_s_limit() -> None:
    async def main() -> None:
        hung, live = _Controller(hang=True), _Controller(hang=False)
        servers = [await _serve(hung), await _serve(live)]
        addresses = {1: f"127.0.0.1:{servers[0][1]}", 2: f"127.0.0.1:{servers[1][1]}"}
        client = ControllerClient(addresses)  # node 1 is tried first
        request = cpb.BrokerHeartbeatRequest(broker_id=101, broker_epoch=1)
        try:
            # The client's own attempts (5 s) would spend the whole call on node 1.
            limit = RetryPolicy(timeout_ms=3_000)
            try:
                await client.call("BrokerHeartbeat", request, limit)
                raise AssertionError("a 5 s attempt on the hung controller did not hang")
            except ControllerUnavailable:
                pass
            short = RetryPolicy(timeout_ms=3_000, rpc_timeout_ms=500)
            response = await client.call("BrokerHeartbeat", request, short)
            assert not response.is_fenced and live.heartbeats == 1
        finally:
            await client.close()
            for server, _ in servers:
                await server.stop(None)

    asyncio.run(main())


def test_a_broker_s_heartbeat_attempts_last_two_intervals_and_one_second_at_least() -> None:
    """Short enough that a heartbeat sent to a paused controller reaches the next active
    one within the session timeout it counts from its start (3 intervals or more)."""

    async def main() -> None:
        client = ControllerClient({1: "127.0.0.1:1"})
        try:
            for interval_ms, attempt_ms in ((2_000, 4_000), (500, 1_000), (100, 1_000)):
                lifecycle = BrokerLifecycle(101, [], None, client, None, interval_ms)
                policy = lifecycle.heartbeat_policy
                assert policy.rpc_timeout_ms == attempt_ms, (interval_ms, policy)
                assert policy.timeout_ms == client.policy.timeout_ms
        finally:
            await client.close()

    asyncio.run(main())


def test_a_controller_back_after_an_outage_is_reached_within_the_backoff_bound() -> None:
    """gRPC backs off reconnecting up to two minutes by default: after twenty seconds of
    refused connections its next try is several seconds away. The client bounds it at its
    retry_backoff_max_ms (1 s), so a call retrying every 100 ms for 2.2 s reaches the
    controller (0.8 s here)."""

    async def main() -> None:
        port = _free_port()
        client = ControllerClient({1: f"127.0.0.1:{port}"})
        request = cpb.BrokerHeartbeatRequest(broker_id=101, broker_epoch=1)
        down = RetryPolicy(timeout_ms=20_000, rpc_timeout_ms=500)
        try:
            try:
                await client.call("BrokerHeartbeat", request, down)
                raise AssertionError("a controller that is not there answered")
            except ControllerUnavailable:
                pass
            back = _Controller(hang=False)
            server, _ = await _serve(back, port)
            try:
                soon = RetryPolicy(timeout_ms=2_200, rpc_timeout_ms=500, retry_backoff_max_ms=100)
                response = await client.call("BrokerHeartbeat", request, soon)
                assert not response.is_fenced and back.heartbeats == 1
            finally:
                await server.stop(None)
        finally:
            await client.close()

    asyncio.run(main())
