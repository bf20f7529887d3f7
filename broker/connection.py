"""The byte plumbing of one client connection: splitting the input into frames and writing
ordered responses to a non-blocking socket. No asyncio, no Kafka: ``broker/server.py`` drives
these from its event-loop callbacks.

How this works.

``FrameReader`` owns the receive memory. Input is read (``recv_into``) into a reusable chunk
of ``buffer_bytes``; every complete frame in it is handed out as a ``memoryview`` of that
chunk, without a copy. The reader writes nothing until it is asked for room again, so a frame
answered at once costs nothing more; a frame whose request stays in flight is ``retain``-ed,
pinning its chunk until ``release`` (when the response is produced): while a chunk is pinned the
reader never writes over memory already handed out; when it needs room it starts a fresh
chunk instead and the pinned one lives as long as the views into it. A frame too big for a
chunk gets a buffer of its own, made when its size prefix arrives and filled by ``recv_into``
directly. Above ``LAZY_FRAME_BYTES`` that buffer is an anonymous memory mapping, whose pages
the kernel supplies as the body arrives, so a peer that announces a 100 MiB frame and sends
nothing more holds address space, not memory (a zero-filled ``bytearray`` was 100 MiB at
once, per connection). Below it a ``bytearray``: glibc serves those from memory it has
freed before, while a fresh mapping faults in every page (measured here: 1 MiB written into
a new mapping 1.46 ms, into a new bytearray 52-116 us); at 32 MiB, glibc's largest mmap
threshold, a bytearray is a fresh mapping too, and the lazy one costs nothing more. It is lent and
released like a chunk, and with ``keep_large_bytes`` the reader keeps one such buffer (up to
that size) and reuses it for the next big frame unless a frame in it is still lent, instead
of allocating and faulting in fresh memory for every one (a follower's 1 MiB fetch answers).
The size prefix is checked against the limit before any of the body is read.

``ResponseQueue`` keeps responses in request order: a request answered later ``reserve``s a
slot, which ``complete`` fills (``None``: nothing to send), moving every completed slot at the
head to the output; a response ready at once (``respond``) goes straight to the output unless
slots wait before it. ``buffered_bytes`` counts every produced byte not yet sent, held ones
too. ``write`` sends the output: consecutive byte parts with one ``sendmsg`` (writev),
``FileSlice`` parts with ``os.sendfile`` (log bytes never pass through Python), until the
socket would block.

Not thread-safe: one event loop drives a connection's reader and queue.
"""

from __future__ import annotations

import mmap
import os
import socket
import struct
from collections import deque
from itertools import islice

from storage.errors import invariant
from storage.segment import FileSlice

__all__ = [
    "SIZE_PREFIX_BYTES",
    "Chunk",
    "FrameReader",
    "FrameSizeError",
    "ResponseQueue",
    "ShortFileError",
    "Slot",
]

SIZE_PREFIX_BYTES = 4
_SIZE = struct.Struct(">i")
_IOV_MAX = 1024  # Linux's limit on the buffers of one sendmsg
_SENDFILE_MAX_BYTES = 1 << 30
LAZY_FRAME_BYTES = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit (module doc)

_Part = bytes | bytearray | memoryview | FileSlice


class FrameSizeError(Exception):
    """A size prefix that is negative or above the limit: the stream cannot be trusted."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"request size {size} is outside [0, {limit}] (socket_request_max_bytes)")
        self.size = size
        self.limit = limit


class ShortFileError(Exception):
    """A FileSlice reached the end of its file early: the response cannot be completed."""


class Chunk:
    """A receive buffer and the count of frames lent out of it and not yet released."""

    __slots__ = ("data", "lent", "view")

    def __init__(self, size: int, *, lazy: bool = False) -> None:
        """``lazy``: memory mapped, taken page by page as it is written (big frames)."""
        self.data: bytearray | mmap.mmap = mmap.mmap(-1, size) if lazy else bytearray(size)
        self.view = memoryview(self.data)
        self.lent = 0


class FrameReader:
    """Splits a byte stream of size-prefixed frames. See the module docstring."""

    def __init__(self, max_frame_bytes: int, buffer_bytes: int, keep_large_bytes: int = 0) -> None:
        self._max_frame_bytes = max_frame_bytes
        self._buffer_bytes = buffer_bytes
        self._keep_large_bytes = keep_large_bytes
        self._chunk = Chunk(buffer_bytes)
        self._start = 0  # first byte not handed out
        self._end = 0  # end of the bytes received
        self._large: Chunk | None = None  # the buffer of a frame bigger than half a chunk
        self._large_size = 0  # that frame's size (its buffer may be bigger)
        self._large_filled = 0
        self._spare: Chunk | None = None  # a big frame's buffer kept for reuse

    @property
    def buffered_bytes(self) -> int:
        """Bytes received and not yet handed out as frames (a partial frame at EOF)."""
        large = self._large_filled + SIZE_PREFIX_BYTES if self._large is not None else 0
        return self._end - self._start + large

    def recv_target(self) -> memoryview:
        """Where the next ``recv_into`` should write; then call ``received``."""
        if self._large is not None:
            return self._large.view[self._large_filled : self._large_size]
        if self._start == self._end and self._chunk.lent == 0:
            self._start = self._end = 0
        elif self._buffer_bytes - self._end < self._buffer_bytes // 8:
            self._make_room()
        return self._chunk.view[self._end :]

    def received(self, count: int) -> None:
        if self._large is not None:
            self._large_filled += count
        else:
            self._end += count

    def next_frame(self) -> tuple[memoryview, Chunk | None] | None:
        """The next complete frame (without its prefix) and its chunk, for ``retain``."""
        large = self._large
        if large is not None:
            if self._large_filled < self._large_size:
                return None
            self._large = None
            return large.view[: self._large_size], large
        available = self._end - self._start
        if available < SIZE_PREFIX_BYTES:
            return None
        (size,) = _SIZE.unpack_from(self._chunk.data, self._start)
        if not 0 <= size <= self._max_frame_bytes:
            raise FrameSizeError(size, self._max_frame_bytes)
        begin = self._start + SIZE_PREFIX_BYTES
        if available - SIZE_PREFIX_BYTES >= size:
            self._start = begin + size
            return self._chunk.view[begin : self._start], self._chunk
        if size > self._buffer_bytes // 2:
            self._start_large(begin, size)
        return None

    @staticmethod
    def retain(chunk: Chunk | None) -> None:
        """Keep a frame's memory: its request is still in flight after ``next_frame``'s caller
        has returned (the reader never writes before that)."""
        if chunk is not None:
            chunk.lent += 1

    @staticmethod
    def release(chunk: Chunk | None) -> None:
        """The retained frame's request has its response: the memory may be reused."""
        if chunk is not None:
            chunk.lent -= 1
            invariant(chunk.lent >= 0, "a frame was released twice")

    def _start_large(self, begin: int, size: int) -> None:
        spare = self._spare
        if spare is not None and spare.lent == 0 and len(spare.data) >= size:
            large = spare
        else:
            large = Chunk(size, lazy=size > LAZY_FRAME_BYTES)
            if size <= self._keep_large_bytes:
                self._spare = large
        have = self._end - begin
        large.view[:have] = self._chunk.view[begin : self._end]
        self._large, self._large_size, self._large_filled = large, size, have
        self._start = self._end

    def _make_room(self) -> None:
        """Move the partial frame at the end to the front of a chunk no frame refers to."""
        pending = self._end - self._start
        if self._chunk.lent == 0:
            self._chunk.view[:pending] = self._chunk.view[self._start : self._end]
        else:
            fresh = Chunk(self._buffer_bytes)
            fresh.view[:pending] = self._chunk.view[self._start : self._end]
            self._chunk = fresh
        self._start, self._end = 0, pending


class Slot:
    """A request's place in the response order; ``parts`` once done (prepared for sending)."""

    __slots__ = ("done", "parts")

    def __init__(self) -> None:
        self.done = False
        self.parts: list[_Out] = []


class _FileRun:
    """A FileSlice being sent; keeps the slice (and so its descriptor) alive until done."""

    __slots__ = ("file", "position", "remaining")

    def __init__(self, file: FileSlice) -> None:
        self.file = file
        self.position = file.position
        self.remaining = file.length


_Out = bytes | bytearray | memoryview | _FileRun


class ResponseQueue:
    """Responses in request order and the bytes not yet sent. See the module docstring."""

    def __init__(self) -> None:
        self._slots: deque[Slot] = deque()  # from the oldest request still waiting
        self._out: deque[_Out] = deque()  # in order, ready to send
        self._out_bytes = 0
        self.buffered_bytes = 0  # produced, not yet accepted by the socket (held ones too)

    @property
    def empty(self) -> bool:
        return not self._out

    def reserve(self) -> Slot:
        slot = Slot()
        self._slots.append(slot)
        return slot

    def respond(self, parts: list[_Part] | None) -> None:
        """The response of the latest request, ready now: it goes after every earlier one."""
        if self._slots:
            self.complete(self.reserve(), parts)
        elif parts:
            out, size = _prepare(parts)
            self._out.extend(out)
            self._out_bytes += size
            self.buffered_bytes += size

    def complete(self, slot: Slot, parts: list[_Part] | None) -> None:
        """Fill ``slot``; raises TypeError (slot left pending) for a part of an unknown type."""
        invariant(not slot.done, "a response slot was completed twice")
        if parts:
            slot.parts, size = _prepare(parts)
            self.buffered_bytes += size
        slot.done = True
        while self._slots and self._slots[0].done:
            for part in self._slots.popleft().parts:
                self._out.append(part)
                self._out_bytes += _out_bytes(part)

    def write(self, sock: socket.socket) -> int:
        """Send as much as the socket takes now; the byte count sent. Raises OSError except
        for EAGAIN, and ShortFileError."""
        sent = 0
        try:
            while self._out:
                head = self._out[0]
                if isinstance(head, _FileRun):
                    count = self._send_file(sock, head)
                else:
                    count = self._send(sock)
                self._consume(count)
                sent += count
        except (BlockingIOError, InterruptedError):
            pass
        return sent

    def _send(self, sock: socket.socket) -> int:
        buffers: list[bytes | bytearray | memoryview] = []
        flags = 0
        for part in islice(self._out, _IOV_MAX):
            if isinstance(part, _FileRun):
                # Records follow at once (sendfile): let the kernel put them in the same
                # segments as these bytes, so the peer is not woken for a header alone.
                flags = socket.MSG_MORE
                break
            buffers.append(part)
        return sock.sendmsg(buffers, (), flags)

    @staticmethod
    def _send_file(sock: socket.socket, run: _FileRun) -> int:
        count = min(run.remaining, _SENDFILE_MAX_BYTES)
        sent = os.sendfile(sock.fileno(), run.file.fd, run.position, count)
        if sent == 0:
            raise ShortFileError(f"file ended {run.remaining} bytes before the slice's end")
        return sent

    def _consume(self, count: int) -> None:
        self.buffered_bytes -= count
        self._out_bytes -= count
        if self._out_bytes == 0:
            self._out.clear()
            return
        while count:
            head = self._out[0]
            size = _out_bytes(head)
            if count >= size:
                self._out.popleft()
                count -= size
            elif isinstance(head, _FileRun):
                head.position += count
                head.remaining -= count
                count = 0
            else:
                self._out[0] = memoryview(head)[count:]
                count = 0


def _out_bytes(part: _Out) -> int:
    if isinstance(part, _FileRun):
        return part.remaining
    return part.nbytes if isinstance(part, memoryview) else len(part)


def _prepare(parts: list[_Part]) -> tuple[list[_Out], int]:
    """The parts as sent (empty ones dropped, views as bytes) and their byte count."""
    out: list[_Out] = []
    total = 0
    for part in parts:
        if isinstance(part, bytes | bytearray):
            size = len(part)
            item: _Out = part
        elif isinstance(part, memoryview):
            item = part if part.ndim == 1 and part.itemsize == 1 else part.cast("B")
            size = item.nbytes
        elif isinstance(part, FileSlice):
            item, size = _FileRun(part), part.length
        else:
            raise TypeError(f"a response part must be bytes-like or a FileSlice: {part!r:.80}")
        if size:
            out.append(item)
            total += size
    return out, total
