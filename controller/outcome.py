"""What the active controller's decisions return.

How this works. Every request the active controller serves is decided by a pure function of
the current (speculative) metadata image and the request: no clock, no randomness, no I/O
unless passed in. It returns an ``Outcome``: the records that carry out the decision and the
answer. The controller commits the records as one Raft batch (all or nothing) and sends the
answer only once they are committed; an outcome without records is answered at once. A
request that cannot be carried out at all raises ``DecisionError`` with a Kafka error code and
a message for the caller; per-item failures (one topic of several) are in the answer instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from controller.records import MetadataRecord
from proto import controller_pb2 as cpb

__all__ = ["DecisionError", "Outcome"]

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Outcome(Generic[R]):
    records: tuple[MetadataRecord, ...]
    response: R


class DecisionError(Exception):
    """The whole request is refused: ``code`` is a ``controller_pb2.ErrorCode`` value."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"DecisionError({cpb.ErrorCode.Name(self.code)}, {self.message!r})"
