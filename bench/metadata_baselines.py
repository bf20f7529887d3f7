"""bench.metadata's raw baselines, measured in the same run as the cluster figures.

How this works.

  records  the metadata records the creation writes (one ``TopicRecord`` and ``partitions``
           ``PartitionRecord``s per topic, replicas striped over the brokers as placement
           does on an empty cluster), encoded and decoded once each in this process: the
           least any node does per record, without Raft, gRPC or an image. As a reference
           (runnel code, not a baseline) the same records are also replayed into a
           ``MetadataImage``, one ``apply`` per request's worth, as every node does.
  gRPC     a server process (``python -m bench.metadata --baseline-server PORT``) whose
           ``CreateTopics`` answers at once with one result per topic, as big as the real
           answer. Measured: sequential unary round trips of the run's first request, and
           the run's requests sent exactly as the creation sends them (``concurrency`` in
           flight through a ``ControllerClient``). So create_s / grpc_create_s is the
           cluster's cost over the transport alone.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from bench.metadata_figures import Baselines, Distribution, Params, creation_requests, topic_name
from bench.metadata_phases import pipelined
from controller import records as rec
from controller.client import ControllerClient, RetryPolicy
from controller.image import MetadataDelta, MetadataImage
from proto import controller_pb2 as cpb
from proto import controller_pb2_grpc
from raft.testing.processes import free_ports, kill, spawn_python

READY_TIMEOUT_S = 30.0
FIRST_BROKER_ID = 101


# -- records -----------------------------------------------------------------------------------


def creation_records(params: Params) -> list[rec.MetadataRecord]:
    brokers = [FIRST_BROKER_ID + i for i in range(params.brokers)]
    out = []
    for t in range(params.topics):
        topic_id = (t + 1).to_bytes(16, "big")
        out.append(rec.topic(topic_name(t), topic_id))
        for p in range(params.partitions):
            first = (t + p) % len(brokers)
            replicas = [
                brokers[(first + k) % len(brokers)] for k in range(params.replication_factor)
            ]
            out.append(rec.partition(topic_id, p, replicas, replicas, leader=replicas[0]))
    return out


def record_baselines(params: Params) -> tuple[int, int, float, float]:
    """(records, their bytes, encode + decode seconds, replay seconds)."""
    records = creation_records(params)
    started = time.perf_counter()
    encoded = [rec.encode(r) for r in records]
    decoded = [rec.decode(b) for b in encoded]
    encode_decode_s = time.perf_counter() - started
    per_request = params.topics_per_request * (1 + params.partitions)
    started = time.perf_counter()
    image = MetadataImage.EMPTY
    for first in range(0, len(decoded), per_request):
        delta = MetadataDelta(image)
        for offset in range(first, min(first + per_request, len(decoded))):
            delta.replay(decoded[offset], offset)
        image = delta.apply()
    replay_s = time.perf_counter() - started
    return len(records), sum(map(len, encoded)), encode_decode_s, replay_s


# -- gRPC --------------------------------------------------------------------------------------


class _AnswerAtOnce(controller_pb2_grpc.ControllerServiceServicer):
    async def CreateTopics(
        self, request: cpb.CreateTopicsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> cpb.CreateTopicsResponse:
        response = cpb.CreateTopicsResponse(header=cpb.ResponseHeader(error=cpb.NONE))
        for i, topic in enumerate(request.topics):
            response.topics.add(
                name=topic.name,
                topic_id=i.to_bytes(16, "big"),
                num_partitions=topic.num_partitions,
                replication_factor=topic.replication_factor,
            )
        return response


async def baseline_server(port: int) -> None:
    """Serve ``_AnswerAtOnce`` on 127.0.0.1:``port`` until killed."""
    server = grpc.aio.server()
    controller_pb2_grpc.add_ControllerServiceServicer_to_server(_AnswerAtOnce(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print(f"baseline server on {port}", flush=True)
    await server.wait_for_termination()


async def grpc_baselines(root: Path, params: Params) -> tuple[Distribution, float]:
    """(sequential round trips, seconds for the run's requests pipelined) against the
    answer-at-once server, started here and killed before returning."""
    (port,) = free_ports(1)
    proc = spawn_python(["-m", "bench.metadata", "--baseline-server", str(port)], root / "b.log")
    address = f"127.0.0.1:{port}"
    client = ControllerClient({0: address}, RetryPolicy(rpc_timeout_ms=10_000))
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            await asyncio.wait_for(channel.channel_ready(), READY_TIMEOUT_S)
        requests = creation_requests(params)

        async def call(request: cpb.CreateTopicsRequest) -> Any:
            return await client.call("CreateTopics", request)

        rtt = await pipelined(call, [requests[0]] * params.rtt_samples, 1)
        run = await pipelined(call, requests, params.concurrency)
    finally:
        await client.close()
        kill(proc)
    return Distribution(rtt.latencies), run.wall_s


async def measure_baselines(root: Path, params: Params) -> Baselines:
    records, record_bytes, encode_decode_s, replay_s = record_baselines(params)
    rtt, grpc_create_s = await grpc_baselines(root, params)
    return Baselines(records, record_bytes, encode_decode_s, replay_s, rtt, grpc_create_s)
