"""Conversion between ``raft.messages`` values and their protobuf form (``proto/raft.proto``).

How this works: one pair of small pure functions per message type, field for field (the
schema mirrors ``messages.py`` one to one, and a test checks the field names match).
``envelope_to_proto`` picks the ``oneof payload`` member from the payload's type;
``envelope_from_proto`` dispatches on which member is set. ``envelope_from_proto`` of
``envelope_to_proto(e)`` equals ``e`` for every envelope whose integers fit the wire types
(ids and epochs int32, offsets int64); one that does not is a programmer error and raises
``ValueError`` from protobuf on the sending side.

Bytes from the network are untrusted: a message with no payload, or without a field that is
required here (a snapshot id), raises ``WireError`` (an operating error, mapped by the
transport to ``INVALID_ARGUMENT``).
"""

from __future__ import annotations

from collections.abc import Callable

from proto import raft_pb2 as pb
from raft.messages import (
    Batch,
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    DivergingEpoch,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    Envelope,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Payload,
    SnapshotId,
    VoteRequest,
    VoteResponse,
)

__all__ = ["WireError", "envelope_from_proto", "envelope_to_proto"]


class WireError(ValueError):
    """A message from the network that does not decode to a Raft message."""

    retriable = False


# -- to protobuf -----------------------------------------------------------------------------


def envelope_to_proto(envelope: Envelope) -> pb.Envelope:
    out = pb.Envelope(source=envelope.source, destination=envelope.destination)
    p = envelope.payload
    match p:
        case VoteRequest():
            out.vote_request.CopyFrom(_vote_request_to_proto(p))
        case VoteResponse():
            out.vote_response.CopyFrom(_vote_response_to_proto(p))
        case BeginQuorumEpochRequest():
            out.begin_quorum_epoch_request.CopyFrom(
                pb.BeginQuorumEpochRequest(epoch=p.epoch, leader_id=p.leader_id)
            )
        case BeginQuorumEpochResponse():
            out.begin_quorum_epoch_response.CopyFrom(pb.BeginQuorumEpochResponse(epoch=p.epoch))
        case EndQuorumEpochRequest():
            out.end_quorum_epoch_request.CopyFrom(
                pb.EndQuorumEpochRequest(
                    epoch=p.epoch,
                    leader_id=p.leader_id,
                    preferred_successors=p.preferred_successors,
                )
            )
        case EndQuorumEpochResponse():
            out.end_quorum_epoch_response.CopyFrom(pb.EndQuorumEpochResponse(epoch=p.epoch))
        case FetchRequest():
            out.fetch_request.CopyFrom(_fetch_request_to_proto(p))
        case FetchResponse():
            out.fetch_response.CopyFrom(_fetch_response_to_proto(p))
        case FetchSnapshotRequest():
            out.fetch_snapshot_request.CopyFrom(_fetch_snapshot_request_to_proto(p))
        case FetchSnapshotResponse():
            out.fetch_snapshot_response.CopyFrom(_fetch_snapshot_response_to_proto(p))
        case _:  # pragma: no cover - the Payload union is closed
            raise TypeError(f"not a Raft payload: {type(p).__name__}")
    return out


def _vote_request_to_proto(p: VoteRequest) -> pb.VoteRequest:
    return pb.VoteRequest(
        epoch=p.epoch,
        candidate_id=p.candidate_id,
        last_epoch=p.last_epoch,
        last_epoch_end_offset=p.last_epoch_end_offset,
        pre_vote=p.pre_vote,
    )


def _vote_response_to_proto(p: VoteResponse) -> pb.VoteResponse:
    return pb.VoteResponse(
        epoch=p.epoch, granted=p.granted, pre_vote=p.pre_vote, leader_id=p.leader_id
    )


def _fetch_request_to_proto(p: FetchRequest) -> pb.FetchRequest:
    return pb.FetchRequest(
        epoch=p.epoch,
        replica_id=p.replica_id,
        fetch_offset=p.fetch_offset,
        last_fetched_epoch=p.last_fetched_epoch,
        max_wait_ms=p.max_wait_ms,
    )


def _fetch_response_to_proto(p: FetchResponse) -> pb.FetchResponse:
    out = pb.FetchResponse(
        epoch=p.epoch,
        leader_id=p.leader_id,
        high_watermark=p.high_watermark,
        log_start_offset=p.log_start_offset,
        batches=[_batch_to_proto(b) for b in p.batches],
        read_max_bytes=p.read_max_bytes,
        fetch_offset=p.fetch_offset,
        last_fetched_epoch=p.last_fetched_epoch,
    )
    if p.diverging is not None:
        out.diverging.CopyFrom(
            pb.DivergingEpoch(epoch=p.diverging.epoch, end_offset=p.diverging.end_offset)
        )
    if p.snapshot_id is not None:
        out.snapshot_id.CopyFrom(_snapshot_id_to_proto(p.snapshot_id))
    if p.read_from is not None:
        out.read_from = p.read_from
    return out


def _fetch_snapshot_request_to_proto(p: FetchSnapshotRequest) -> pb.FetchSnapshotRequest:
    return pb.FetchSnapshotRequest(
        epoch=p.epoch,
        replica_id=p.replica_id,
        snapshot_id=_snapshot_id_to_proto(p.snapshot_id),
        position=p.position,
        max_bytes=p.max_bytes,
    )


def _fetch_snapshot_response_to_proto(p: FetchSnapshotResponse) -> pb.FetchSnapshotResponse:
    out = pb.FetchSnapshotResponse(
        epoch=p.epoch,
        leader_id=p.leader_id,
        snapshot_id=_snapshot_id_to_proto(p.snapshot_id),
        position=p.position,
        size=p.size,
        chunk=p.chunk,
        read_max_bytes=p.read_max_bytes,
        missing=p.missing,
    )
    if p.read_position is not None:
        out.read_position = p.read_position
    return out


def _batch_to_proto(b: Batch) -> pb.Batch:
    return pb.Batch(
        base_offset=b.base_offset,
        last_offset=b.last_offset,
        epoch=b.epoch,
        data=b.data,
        is_control=b.is_control,
    )


def _snapshot_id_to_proto(s: SnapshotId) -> pb.SnapshotId:
    return pb.SnapshotId(end_offset=s.end_offset, epoch=s.epoch)


# -- from protobuf ---------------------------------------------------------------------------


def envelope_from_proto(message: pb.Envelope) -> Envelope:
    kind = message.WhichOneof("payload")
    if kind is None:
        raise WireError("envelope without a payload")
    return Envelope(message.source, message.destination, _FROM_PROTO[kind](message))


def _vote_request(m: pb.Envelope) -> VoteRequest:
    p = m.vote_request
    return VoteRequest(p.epoch, p.candidate_id, p.last_epoch, p.last_epoch_end_offset, p.pre_vote)


def _vote_response(m: pb.Envelope) -> VoteResponse:
    p = m.vote_response
    return VoteResponse(p.epoch, p.granted, p.pre_vote, p.leader_id)


def _begin_quorum_epoch_request(m: pb.Envelope) -> BeginQuorumEpochRequest:
    p = m.begin_quorum_epoch_request
    return BeginQuorumEpochRequest(p.epoch, p.leader_id)


def _begin_quorum_epoch_response(m: pb.Envelope) -> BeginQuorumEpochResponse:
    return BeginQuorumEpochResponse(m.begin_quorum_epoch_response.epoch)


def _end_quorum_epoch_request(m: pb.Envelope) -> EndQuorumEpochRequest:
    p = m.end_quorum_epoch_request
    return EndQuorumEpochRequest(p.epoch, p.leader_id, tuple(p.preferred_successors))


def _end_quorum_epoch_response(m: pb.Envelope) -> EndQuorumEpochResponse:
    return EndQuorumEpochResponse(m.end_quorum_epoch_response.epoch)


def _fetch_request(m: pb.Envelope) -> FetchRequest:
    p = m.fetch_request
    return FetchRequest(p.epoch, p.replica_id, p.fetch_offset, p.last_fetched_epoch, p.max_wait_ms)


def _fetch_response(m: pb.Envelope) -> FetchResponse:
    p = m.fetch_response
    return FetchResponse(
        epoch=p.epoch,
        leader_id=p.leader_id,
        high_watermark=p.high_watermark,
        log_start_offset=p.log_start_offset,
        batches=tuple(_batch(b) for b in p.batches),
        diverging=(
            DivergingEpoch(p.diverging.epoch, p.diverging.end_offset)
            if p.HasField("diverging")
            else None
        ),
        snapshot_id=_snapshot_id(p.snapshot_id) if p.HasField("snapshot_id") else None,
        read_from=p.read_from if p.HasField("read_from") else None,
        read_max_bytes=p.read_max_bytes,
        fetch_offset=p.fetch_offset,
        last_fetched_epoch=p.last_fetched_epoch,
    )


def _fetch_snapshot_request(m: pb.Envelope) -> FetchSnapshotRequest:
    p = m.fetch_snapshot_request
    _require(p.HasField("snapshot_id"), "FetchSnapshotRequest without a snapshot_id")
    return FetchSnapshotRequest(
        p.epoch, p.replica_id, _snapshot_id(p.snapshot_id), p.position, p.max_bytes
    )


def _fetch_snapshot_response(m: pb.Envelope) -> FetchSnapshotResponse:
    p = m.fetch_snapshot_response
    _require(p.HasField("snapshot_id"), "FetchSnapshotResponse without a snapshot_id")
    return FetchSnapshotResponse(
        epoch=p.epoch,
        leader_id=p.leader_id,
        snapshot_id=_snapshot_id(p.snapshot_id),
        position=p.position,
        size=p.size,
        chunk=p.chunk,
        read_position=p.read_position if p.HasField("read_position") else None,
        read_max_bytes=p.read_max_bytes,
        missing=p.missing,
    )


def _batch(b: pb.Batch) -> Batch:
    return Batch(b.base_offset, b.last_offset, b.epoch, b.data, b.is_control)


def _snapshot_id(s: pb.SnapshotId) -> SnapshotId:
    return SnapshotId(s.end_offset, s.epoch)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise WireError(message)


# Keyed by the ``oneof payload`` member names in raft.proto.
_FROM_PROTO: dict[str, Callable[[pb.Envelope], Payload]] = {
    "vote_request": _vote_request,
    "vote_response": _vote_response,
    "begin_quorum_epoch_request": _begin_quorum_epoch_request,
    "begin_quorum_epoch_response": _begin_quorum_epoch_response,
    "end_quorum_epoch_request": _end_quorum_epoch_request,
    "end_quorum_epoch_response": _end_quorum_epoch_response,
    "fetch_request": _fetch_request,
    "fetch_response": _fetch_response,
    "fetch_snapshot_request": _fetch_snapshot_request,
    "fetch_snapshot_response": _fetch_snapshot_response,
}
