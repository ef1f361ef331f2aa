"""Split a byte stream into Kafka frames (4-byte big-endian size, then that many bytes).

Sans-IO: the caller feeds whatever the socket gave and takes complete frames out. The size is
checked against the limit *before* any buffer for the body is reserved, so a hostile or corrupt
length prefix costs nothing (the broker's ``socket.request.max.bytes`` does the same).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024
_SIZE = struct.Struct(">i")


class FrameError(Exception):
    """The stream cannot be split into frames any more; the connection must be closed."""


def check_frame_size(size: int, max_frame_bytes: int) -> None:
    if size < 0:
        raise FrameError(f"negative frame size {size}")
    if size > max_frame_bytes:
        raise FrameError(f"frame of {size} bytes exceeds the maximum of {max_frame_bytes} bytes")


def frame_size(prefix: bytes, max_frame_bytes: int) -> int:
    """Size announced by a 4-byte prefix, validated; for readers that read the prefix themselves."""
    (size,) = _SIZE.unpack(prefix)
    check_frame_size(size, max_frame_bytes)
    return size


def encode_frame(payload: bytes) -> bytes:
    return _SIZE.pack(len(payload)) + payload


class FrameReader:
    """Incremental splitter that hands out whole frames *with* their size prefix, without copying
    when it can: a frame that lies wholly inside one received chunk is returned as a memoryview of
    that chunk; only a frame spread over several chunks is assembled, into a buffer allocated once
    at its announced (and already checked) size.

    Why: a proxy forwards most frames unchanged, so the cheapest frame is one passed on as the very
    bytes that arrived. Returned views stay valid (the chunks are immutable ``bytes``).
    """

    __slots__ = ("_max", "_head", "_partial", "_filled")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._max = max_frame_bytes
        self._head = b""  # < 4 bytes of a size prefix
        self._partial: bytearray | None = None
        self._filled = 0

    def feed(self, data: bytes) -> list[memoryview | bytearray]:
        out: list[memoryview | bytearray] = []
        view = memoryview(data)
        pos = 0
        end = len(data)
        partial = self._partial
        if partial is not None:
            take = min(len(partial) - self._filled, end)
            partial[self._filled : self._filled + take] = view[:take]
            self._filled += take
            pos = take
            if self._filled < len(partial):
                return out
            out.append(partial)
            self._partial = None
        if self._head:
            need = 4 - len(self._head)
            if end - pos < need:
                self._head += bytes(view[pos:end])
                return out
            prefix = self._head + bytes(view[pos : pos + need])
            self._head = b""
            pos += need
            size = _SIZE.unpack(prefix)[0]
            check_frame_size(size, self._max)
            frame = bytearray(4 + size)
            frame[:4] = prefix
            take = min(size, end - pos)
            frame[4 : 4 + take] = view[pos : pos + take]
            pos += take
            if take < size:
                self._partial, self._filled = frame, 4 + take
                return out
            out.append(frame)
        while end - pos >= 4:
            (size,) = _SIZE.unpack_from(data, pos)
            check_frame_size(size, self._max)
            if end - pos - 4 >= size:
                out.append(view[pos : pos + 4 + size])
                pos += 4 + size
                continue
            frame = bytearray(4 + size)
            avail = end - pos
            frame[:avail] = view[pos:end]
            self._partial, self._filled = frame, avail
            return out
        if pos < end:
            self._head = bytes(view[pos:end])
        return out

    @property
    def idle(self) -> bool:
        """No partial frame buffered (a clean point to close a connection at)."""
        return self._partial is None and not self._head


HEAD_BYTES = 64
"""Leading bytes of a frame (size prefix included) that are in hand before a frame may be streamed:
enough for any response header plus the first fields of the body (e.g. ``throttle_time_ms``), which
may thus still be read, and rewritten in place, before anything of the frame is forwarded."""

RECEIVE_BYTES = 512 * 1024
"""Initial capacity of a receive buffer: large reads mean few syscalls for the megabyte Fetch responses."""

MIN_ROOM = 64 * 1024
"""Smallest free space handed to the socket for one read; below it the buffer is compacted or replaced."""


class StreamHead:
    """The start of a frame that is forwarded piece by piece as it arrives instead of being assembled.

    ``data`` holds the size prefix and at least ``HEAD_BYTES`` bytes (all of the frame that was in
    hand); it is writable, so leading fields can be rewritten in place (the length must not change).
    ``total`` is the frame's full length, prefix included.
    """

    __slots__ = ("data", "total")

    def __init__(self, data: memoryview, total: int) -> None:
        self.data = data
        self.total = total


class StreamPiece:
    """More bytes of the frame announced by the last StreamHead; ``last`` marks its final piece."""

    __slots__ = ("data", "last")

    def __init__(self, data: memoryview, last: bool) -> None:
        self.data = data
        self.last = last


class FrameReceiver:
    """Frame splitter for ``asyncio.BufferedProtocol``: the socket reads straight into a receive
    buffer that is reused from read to read, and frames come out as views of it.

    Why: with a plain Protocol every read is a fresh ``bytes`` (allocated, page-faulted in, copied),
    and a multi-megabyte Fetch response spanning many reads was assembled into yet another fresh
    buffer: two user-space copies and a page-fault storm per response, which capped the proxy's
    single event loop on consume. Here the only copies left are the kernel's, in and out.

    A frame that is wholly in hand comes out as one ``memoryview`` (prefix included). A larger one
    either streams — ``should_stream(first HEAD_BYTES bytes)`` said so: a ``StreamHead`` and then
    ``StreamPiece``s, each as soon as it is read, so no frame-sized buffer is ever needed — or is
    assembled in the receive buffer (grown once to the largest such frame, then reused) and comes
    out whole. The size prefix is checked against the limit before anything is reserved for it.

    Views stay valid until ``get_buffer`` is next called with ``reusable=True``: the caller says so
    only once everything it was handed has been written out (or copied) — e.g. when the transport's
    write buffer is empty. With ``reusable=False`` fresh reads never land on bytes handed out.

    ``received`` is a generator and calls ``should_stream`` lazily, so the predicate sees the state
    left by the caller's handling of every earlier frame (e.g. which request is the oldest in flight).
    """

    __slots__ = ("_max", "_should_stream", "_min_room", "_buf", "_view", "_start", "_end", "_need",
                 "_stream_left", "allocations")

    def __init__(
        self,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        should_stream: Callable[[memoryview], bool] | None = None,
        capacity: int = RECEIVE_BYTES,
    ) -> None:
        self._max = max_frame_bytes
        self._should_stream = should_stream
        self._min_room = max(1, min(MIN_ROOM, capacity // 2))
        self._buf = bytearray(capacity)
        self._view = memoryview(self._buf)
        self._start = 0  # first byte not handed out yet (the head of an incomplete frame)
        self._end = 0  # end of the received bytes
        self._need = 0  # full length of the incomplete frame at _start, once it is known to be assembled
        self._stream_left = 0  # bytes of the streaming frame still to come
        self.allocations = 1
        """Receive buffers allocated so far (diagnostics: steady state should allocate none)."""

    @property
    def idle(self) -> bool:
        """Nothing of a frame is pending: no partial frame, no stream in progress."""
        return self._start == self._end and not self._stream_left

    @property
    def streaming(self) -> bool:
        """A frame has been started downstream and not finished yet."""
        return self._stream_left > 0

    def get_buffer(self, reusable: bool) -> memoryview:
        """Where the next read should land: at least ``MIN_ROOM`` bytes (half the capacity if that is
        less), or what the frame being assembled still lacks."""
        start, end = self._start, self._end
        pending = end - start
        if reusable and start:
            if pending:
                if pending <= start:
                    self._view[:pending] = self._view[start:end]
                else:  # overlapping move; bytes in flight are at most one read
                    self._view[:pending] = bytes(self._view[start:end])
            self._start, self._end = start, end = 0, pending
        want = max(self._min_room, self._need - pending)
        if len(self._buf) - end < want:
            new = bytearray(max(len(self._buf), pending + want + (self._min_room if self._need else 0)))
            if pending:
                new[:pending] = self._view[start:end]
            self._buf, self._view = new, memoryview(new)
            self._start, self._end = 0, pending
            self.allocations += 1
            end = pending
        return self._view[end:]

    def received(self, nbytes: int) -> Iterator[memoryview | StreamHead | StreamPiece]:
        """Frames and stream pieces completed by ``nbytes`` more bytes at the buffer's end.

        Raises FrameError (while being iterated) for a size prefix that is negative or too large.
        """
        view = self._view
        self._end = end = self._end + nbytes
        start = self._start
        if self._stream_left:
            take = min(self._stream_left, end - start)
            self._stream_left -= take
            self._start = start = start + take
            yield StreamPiece(view[start - take : start], self._stream_left == 0)
        buf = self._buf
        while end - start >= 4:
            (size,) = _SIZE.unpack_from(buf, start)
            check_frame_size(size, self._max)
            total = 4 + size
            if end - start >= total:
                self._start = start + total
                self._need = 0
                yield view[start : start + total]
                start = self._start
                continue
            if self._need or end - start < HEAD_BYTES:
                return  # assembling it (decided earlier), or too little in hand to decide yet
            if self._should_stream is not None and self._should_stream(view[start : start + HEAD_BYTES]):
                self._start = end
                self._stream_left = total - (end - start)
                yield StreamHead(view[start:end], total)
                return
            self._need = total
            return
