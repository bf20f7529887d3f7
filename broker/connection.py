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

A reader given a ``MemoryPool`` (the broker's listeners share one: ``queued_max_request_bytes``)
takes from it every byte it holds beyond its own chunk: a big frame's buffer (its size, taken
when the size prefix arrives, before the buffer is made) and a chunk pinned by frames in flight
when the reader moves on to a fresh one. A frame's bytes go back when nothing needs them: a
pinned chunk at its last ``release``, a big frame's buffer at ``release`` or, for a frame
answered at once, ``Chunk.settle`` after the handler returned; a closed reader's at ``close``.
When the pool cannot give what the next read needs, ``try_recv_target`` and ``next_frame`` say
so (``waiting_bytes``) instead of allocating: the caller stops reading its socket until the
pool calls ``on_memory``. The pool serves waiters in order and never lends more than its
limit; every take is at most the frame limit, which the limit is at least, so the first waiter
fits once the bytes taken before it are given back: no frame waits forever while requests
complete. Each connection's own chunk (``buffer_bytes``) is not taken from the pool.

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
from collections.abc import Callable
from itertools import islice

from storage.errors import InvariantViolation, invariant
from storage.segment import FileSlice

__all__ = [
    "SIZE_PREFIX_BYTES",
    "Chunk",
    "FrameReader",
    "FrameSizeError",
    "MemoryPool",
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


class MemoryPool:
    """Request memory shared by readers: at most ``limit_bytes`` taken at once.

    Kafka's queued.max.request.bytes pool (SimpleMemoryPool), but strict and in order where
    Kafka's lends while anything is left (overshooting by up to one request) and shuffles its
    sockets against starvation: ``take`` succeeds if the bytes fit and nobody waits; otherwise
    the taker joins a queue, and ``give`` takes freed bytes for the waiters in order, then calls
    each one's ``granted``. A take must not exceed the limit (it would wait for ever).
    ``used_bytes`` is taken now; ``waits`` counts takes that had to wait (reads paused).
    Not thread-safe; ``granted`` is called inside ``give``, so it should only schedule work."""

    __slots__ = ("_waiters", "limit_bytes", "used_bytes", "waits")

    def __init__(self, limit_bytes: int) -> None:
        invariant(limit_bytes > 0, "a memory pool needs a positive limit")
        self.limit_bytes = limit_bytes
        self.used_bytes = 0
        self.waits = 0
        self._waiters: deque[tuple[int, Callable[[], None]]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def take(self, size: int, granted: Callable[[], None]) -> bool:
        """Take ``size`` bytes now (True), or queue for them: ``granted`` is called once they
        have been taken for the caller (False)."""
        invariant(0 < size <= self.limit_bytes, f"a take of {size} bytes can never be served")
        if not self._waiters and self.used_bytes + size <= self.limit_bytes:
            self.used_bytes += size
            return True
        self._waiters.append((size, granted))
        self.waits += 1
        return False

    def give(self, size: int) -> None:
        self.used_bytes -= size
        invariant(self.used_bytes >= 0, "a memory pool got back more than it lent")
        while self._waiters and self.used_bytes + self._waiters[0][0] <= self.limit_bytes:
            wanted, granted = self._waiters.popleft()
            self.used_bytes += wanted
            granted()

    def cancel(self, granted: Callable[[], None]) -> None:
        """Leave the queue (the taker is gone); the waiters behind may fit now."""
        self._waiters = deque(w for w in self._waiters if w[1] != granted)
        self.give(0)


class Chunk:
    """A receive buffer, the count of frames lent out of it and not yet released, and the
    bytes it holds of a ``MemoryPool`` (``charged``)."""

    __slots__ = ("charged", "data", "lent", "pool", "view")

    def __init__(self, size: int, *, lazy: bool = False) -> None:
        """``lazy``: memory mapped, taken page by page as it is written (big frames)."""
        self.data: bytearray | mmap.mmap = mmap.mmap(-1, size) if lazy else bytearray(size)
        self.view = memoryview(self.data)
        self.lent = 0
        self.charged = 0
        self.pool: MemoryPool | None = None

    def settle(self) -> None:
        """Give the chunk's bytes back to its pool if no frame in it is lent: call it when a
        frame of it was handled and not retained (its reader no longer writes into it)."""
        pool = self.pool
        if self.lent == 0 and pool is not None and self.charged:
            pool.give(self.charged)
            self.charged = 0


class FrameReader:
    """Splits a byte stream of size-prefixed frames. See the module docstring."""

    def __init__(
        self,
        max_frame_bytes: int,
        buffer_bytes: int,
        keep_large_bytes: int = 0,
        *,
        pool: MemoryPool | None = None,
        on_memory: Callable[[], None] | None = None,
    ) -> None:
        """With a ``pool``, ``on_memory`` is called (inside ``MemoryPool.give``) once memory
        the reader waited for is granted."""
        invariant(pool is None or keep_large_bytes == 0, "a kept buffer would hold pool bytes")
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
        self._pool = pool
        self._on_memory = on_memory
        self.waiting_bytes = 0  # asked of the pool, not granted yet: do not read
        self._granted = 0  # granted by the pool, not used yet
        self._for_chunk = False  # what was asked: a fresh chunk, or a big frame's buffer

    @property
    def buffered_bytes(self) -> int:
        """Bytes received and not yet handed out as frames (a partial frame at EOF)."""
        large = self._large_filled + SIZE_PREFIX_BYTES if self._large is not None else 0
        return self._end - self._start + large

    def recv_target(self) -> memoryview:
        """Where the next ``recv_into`` should write; then call ``received``. A reader with a
        pool uses ``try_recv_target``."""
        target = self.try_recv_target()
        if target is None:
            raise InvariantViolation("recv_target while waiting for memory: try_recv_target")
        return target

    def try_recv_target(self) -> memoryview | None:
        """``recv_target``, or None while the memory it needs is asked of the pool."""
        if self._large is not None:
            return self._large.view[self._large_filled : self._large_size]
        return self._chunk.view[self._end :] if self.make_room() else None

    def make_room(self) -> bool:
        """Get what the next read needs; False while it is asked of the pool (``on_memory``
        follows). Asking again is harmless; a fresh chunk asked for and no longer needed (the
        pinned one was released) is given back."""
        if self._large is not None:
            return True
        if self.waiting_bytes or self._granted:
            if not self._for_chunk:
                return False  # a big frame's buffer: next_frame takes it when granted
            if self._chunk.lent == 0:
                self._forgo()  # the chunk is free again: no fresh one needed
        if self._start == self._end and self._chunk.lent == 0:
            self._start = self._end = 0
        elif self._buffer_bytes - self._end < self._buffer_bytes // 8:
            return self._make_room()
        return True

    def received(self, count: int) -> None:
        if self._large is not None:
            self._large_filled += count
        else:
            self._end += count

    def next_frame(self) -> tuple[memoryview, Chunk] | None:
        """The next complete frame (without its prefix) and its chunk, for ``retain`` (or
        ``Chunk.settle`` once handled, if not retained)."""
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
        if size > self._buffer_bytes // 2 and self._take(size, for_chunk=False):
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
        """The retained frame's request has its response: the memory may be reused (and goes
        back to its pool once no frame in it is lent)."""
        if chunk is not None:
            chunk.lent -= 1
            invariant(chunk.lent >= 0, "a frame was released twice")
            if chunk.charged:
                chunk.settle()

    def close(self) -> None:
        """The stream is gone: give back what the reader holds of its pool (frames handed out
        give theirs back at ``release`` or ``Chunk.settle``). Not used after this."""
        self._forgo()
        large, self._large = self._large, None
        if large is not None:
            large.settle()

    def _take(self, size: int, *, for_chunk: bool) -> bool:
        """Charge ``size`` bytes to the pool; False while they are asked and not granted."""
        pool = self._pool
        if pool is None:
            return True
        if self._granted:
            invariant(self._granted == size and self._for_chunk == for_chunk, "grant mismatch")
            self._granted = 0
            return True
        if self.waiting_bytes:
            invariant(self.waiting_bytes == size and self._for_chunk == for_chunk, "two asks")
            return False
        if pool.take(size, self._on_grant):
            return True
        self.waiting_bytes, self._for_chunk = size, for_chunk
        return False

    def _on_grant(self) -> None:
        self._granted, self.waiting_bytes = self.waiting_bytes, 0
        if self._on_memory is not None:
            self._on_memory()

    def _forgo(self) -> None:
        """Drop an ask or a grant not needed any more."""
        pool = self._pool
        if pool is None:
            return
        if self.waiting_bytes:
            self.waiting_bytes = 0
            pool.cancel(self._on_grant)
        if self._granted:
            granted, self._granted = self._granted, 0
            pool.give(granted)

    def _start_large(self, begin: int, size: int) -> None:
        spare = self._spare
        if spare is not None and spare.lent == 0 and len(spare.data) >= size:
            large = spare
        else:
            large = Chunk(size, lazy=size > LAZY_FRAME_BYTES)
            if self._pool is not None:
                large.pool, large.charged = self._pool, size
            elif size <= self._keep_large_bytes:
                self._spare = large
        have = self._end - begin
        large.view[:have] = self._chunk.view[begin : self._end]
        self._large, self._large_size, self._large_filled = large, size, have
        self._start = self._end

    def _make_room(self) -> bool:
        """Move the partial frame at the end to the front of a chunk no frame refers to: this
        one, or a fresh one if frames in this one are lent (False: asked of the pool)."""
        pending = self._end - self._start
        old = self._chunk
        if old.lent == 0:
            old.view[:pending] = old.view[self._start : self._end]
        elif self._take(self._buffer_bytes, for_chunk=True):
            fresh = Chunk(self._buffer_bytes)
            fresh.view[:pending] = old.view[self._start : self._end]
            self._chunk = fresh
            if self._pool is not None:  # the pinned chunk is what this reader holds extra
                old.pool, old.charged = self._pool, self._buffer_bytes
        else:
            return False
        self._start, self._end = 0, pending
        return True


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
