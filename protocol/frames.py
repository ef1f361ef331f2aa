"""Split a byte stream into Kafka frames (4-byte big-endian size, then that many bytes).

Sans-IO: the caller feeds whatever the socket gave and takes complete frames out. The size is
checked against the limit *before* any buffer for the body is reserved, so a hostile or corrupt
length prefix costs nothing (the broker's ``socket.request.max.bytes`` does the same).
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable, Iterator
from typing import ClassVar, Final

from protocol.errors import ProtocolError

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024
SMALL_FRAME_BYTES: Final = 64 * 1024
"""Request frames up to this size (prefix included) come out of :class:`FrameReader` as ``bytes`` even when they
share a received chunk with others (copied out of it: at most a few microseconds), so the per-request readers
that follow (header, producer-id memo) run on ``bytes``, whose indexing, slicing and comparison are native when
compiled, instead of on memoryview objects built per access. Larger frames stay views: their bytes are not
copied."""
SMALL_RESPONSE_BYTES: Final = 4096
"""Response frames up to this size (prefix included) come out of :class:`FrameReceiver` as ``bytes`` copies: the
readers that follow (correlation id, body offset, node_endpoints check, throttle) then index and slice natively,
where each access to a memoryview builds an object (several a Produce response).
Larger ones (Fetch data) stay views of the receive buffer, never copied: a copy costs per byte."""
_SIZE: Final = struct.Struct(">i")
_SIZE_unpack: Final = _SIZE.unpack_from  # bound once: compiled, a method call by name is a lookup each time


class FrameError(ProtocolError):
    """The stream cannot be split into frames any more; the connection must be closed."""

    kind: ClassVar[str] = "bad_frame"


def check_frame_size(size: int, max_frame_bytes: int) -> None:
    if size < 0:
        raise FrameError(f"negative frame size {size}")
    if size > max_frame_bytes:
        raise FrameError(f"frame of {size} bytes exceeds the maximum of {max_frame_bytes} bytes")


def frame_size(prefix: bytes, max_frame_bytes: int) -> int:
    """Size announced by a 4-byte prefix, validated; for readers that read the prefix themselves."""
    size: int
    (size,) = _SIZE.unpack(prefix)
    check_frame_size(size, max_frame_bytes)
    return size


def encode_frame(payload: bytes) -> bytes:
    return _SIZE.pack(len(payload)) + payload


class RequestBytesPool:
    """The proxy-wide budget for request bytes held in memory: Kafka's ``queued.max.request.bytes`` (KIP-72).

    Why: a client announces a frame's size before sending it; a proxy that trusts the announcement with memory
    lets 150 slow clients announcing 90 MiB each hold 13 GB. Here a frame whose announced size (prefix not
    counted) exceeds the reader's ``pool_min_bytes`` reserves its whole size from this pool before its body is
    read (as the broker's memory pool does), so once admitted it can always complete; when the pool is spent,
    the connection is simply not read (back-pressure, never allocation) until earlier frames have been forwarded
    and released. Smaller frames never wait: a normal client's requests are not queued behind a hostile
    client's huge ones (a slow one is bounded by the caller's read timeout instead).

    Waiters are served first come, first served (a big frame is not starved by a stream of smaller ones).
    Sans-IO: ``grant`` callbacks are plain functions; nothing here knows sockets or clocks.
    """

    __slots__ = ("capacity", "used", "_waiters")

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"request bytes pool capacity must be positive, not {capacity}")
        self.capacity = capacity
        self.used = 0
        self._waiters: deque[_PoolWaiter] = deque()

    def try_reserve(self, n: int) -> bool:
        if self._waiters or (self.used and self.used + n > self.capacity):
            return False  # an empty pool admits one frame larger than itself rather than none, ever
        self.used += n
        return True

    def wait(self, n: int, grant: Callable[[], None]) -> _PoolWaiter:
        """Queue for ``n`` bytes; ``grant()`` is called once they are reserved on the caller's behalf."""
        waiter = _PoolWaiter(n, grant)
        self._waiters.append(waiter)
        return waiter

    def cancel(self, waiter: _PoolWaiter) -> None:
        """The waiting connection closed. If it was granted meanwhile, the caller releases as usual."""
        waiter.grant = None
        self._serve()

    def release(self, n: int) -> None:
        if n:
            self.used -= n
            self._serve()

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if w.grant is not None)

    def _serve(self) -> None:
        waiters = self._waiters
        while waiters:
            head = waiters[0]
            if head.grant is None:
                waiters.popleft()
                continue
            if self.used and self.used + head.n > self.capacity:
                return
            waiters.popleft()
            self.used += head.n
            grant, head.grant = head.grant, None
            grant()


class _PoolWaiter:
    __slots__ = ("n", "grant")

    def __init__(self, n: int, grant: Callable[[], None] | None) -> None:
        self.n = n
        self.grant = grant


class FrameReader:
    """Incremental splitter that hands out whole frames *with* their size prefix, without copying
    when it can: a frame that is a whole received chunk is returned as that chunk, a large one that lies
    inside a chunk as a memoryview of it (a small one is copied out: see :data:`SMALL_FRAME_BYTES`); only a
    frame spread over several chunks is assembled, into a buffer that grows with the bytes that actually arrive
    (never allocated at the size a client merely announced).

    Why: a proxy forwards most frames unchanged, so the cheapest frame is one passed on as the very
    bytes that arrived. Returned views stay valid (the chunks are immutable ``bytes``).

    With a ``pool``, a frame larger than ``pool_min_bytes`` first reserves its size there; while the pool
    cannot grant it, :attr:`waiting` is that size and the reader holds what it was fed (the caller stops
    reading the socket and calls :meth:`granted` when the pool calls back). Reserved bytes of frames handed out
    are returned with :meth:`release_forwarded` once the caller has passed them on.
    """

    __slots__ = (
        "_max",
        "_pool",
        "_pool_min",
        "_stash",
        "_partial",
        "_need",
        "_reserved",
        "_done_reserved",
        "_granted",
        "waiting",
    )

    def __init__(
        self,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        pool: RequestBytesPool | None = None,
        pool_min_bytes: int = 1 << 20,
    ) -> None:
        self._max = max_frame_bytes
        self._pool = pool
        self._pool_min = pool_min_bytes
        self._stash = b""  # < 4 bytes of a size prefix, or everything held while waiting for the pool
        self._partial: bytearray | None = None
        self._need = 0
        self._reserved = 0  # reserved for the frame being assembled
        self._done_reserved = 0  # reserved for frames already handed out
        self._granted = 0
        self.waiting = 0
        """Bytes the next frame waits for from the pool; while non-zero, nothing is split."""

    def feed(self, data: bytes) -> list[bytes | memoryview | bytearray]:
        """Complete frames, prefix included: ``bytes`` for a frame of up to :data:`SMALL_FRAME_BYTES` and for one
        that is exactly the chunk received (no copy), else a view of the chunk or the buffer it was assembled in."""
        out: list[bytes | memoryview | bytearray] = []
        if self.waiting:
            self._stash += data  # a read that raced the caller's pause: one chunk at most
            return out
        if self._stash:
            data = self._stash + data  # rare: a split size prefix, or what waited for the pool
            self._stash = b""
        pos = 0
        end = len(data)
        partial = self._partial
        if partial is not None:
            pos = min(self._need - len(partial), end)
            partial += memoryview(data)[:pos]
            if len(partial) < self._need:
                return out
            out.append(bytes(partial) if len(partial) <= SMALL_FRAME_BYTES else partial)
            self._partial = None
            self._done_reserved += self._reserved
            self._reserved = 0
        while end - pos >= 4:
            size = data[pos] << 24 | data[pos + 1] << 16 | data[pos + 2] << 8 | data[pos + 3]  # native on bytes
            if size >= 0x80000000:
                size -= 0x100000000
            check_frame_size(size, self._max)
            total = 4 + size
            if end - pos >= total:
                if total == end:  # pos is 0: the chunk is this one frame, the usual case
                    out.append(data)
                elif total <= SMALL_FRAME_BYTES:
                    out.append(data[pos : pos + total])
                else:
                    out.append(memoryview(data)[pos : pos + total])
                pos += total
                continue
            if self._pool is not None and size > self._pool_min:
                if self._granted == total:
                    self._granted = 0
                elif not self._pool.try_reserve(total):
                    self.waiting = total
                    self._stash = data[pos:end]
                    return out
                self._reserved = total
            self._partial = bytearray(memoryview(data)[pos:end])
            self._need = total
            return out
        if pos < end:
            self._stash = data[pos:end]
        return out

    def granted(self) -> None:
        """The pool reserved :attr:`waiting` bytes for this reader; feed it (``b""`` will do) to go on."""
        self._granted, self.waiting = self.waiting, 0

    def release_forwarded(self) -> None:
        """The frames handed out so far have been passed on: give their reservations back."""
        if self._done_reserved:
            n, self._done_reserved = self._done_reserved, 0
            assert self._pool is not None  # only a pooled reader reserves
            self._pool.release(n)

    def close(self) -> None:
        """The connection is gone: every reservation goes back (a pending wait is the caller's to cancel)."""
        n = self._done_reserved + self._reserved + self._granted
        self._done_reserved = self._reserved = self._granted = 0
        self._partial = None
        self._stash = b""
        if n and self._pool is not None:
            self._pool.release(n)

    @property
    def idle(self) -> bool:
        """No partial frame buffered (a clean point to close a connection at)."""
        return self._partial is None and not self._stash and not self.waiting

    @property
    def held_bytes(self) -> int:
        """Bytes of incomplete frames held in memory right now."""
        return (len(self._partial) if self._partial is not None else 0) + len(self._stash)


HEAD_BYTES: Final = 64
"""Leading bytes of a frame (size prefix included) that are in hand before a frame may be streamed:
enough for any response header plus the first fields of the body (e.g. ``throttle_time_ms``), which
may thus still be read, and rewritten in place, before anything of the frame is forwarded."""

RECEIVE_BYTES: Final = 512 * 1024
"""Capacity a receive buffer grows to while reads fill it: large reads mean few syscalls for the megabyte Fetch
responses."""

INITIAL_RECEIVE_BYTES: Final = 16 * 1024
"""Capacity a connection's receive buffer starts at (lazily, at its first read): an idle or chatty connection
never costs the half megabyte a consumer's does."""

MIN_ROOM: Final = 64 * 1024
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
    single event loop on consume. Here the only copies left are the kernel's, in and out. (A connection whose
    client has not fetched reads its broker as chunks instead, and takes only what is not one whole small
    response through here: ``proxy.wire.connection._UpstreamChunks``.)

    A frame that is wholly in hand comes out as one ``memoryview`` (prefix included), or as a ``bytes`` copy when
    it is small (:data:`SMALL_RESPONSE_BYTES`). A larger one
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

    __slots__ = (
        "_max",
        "_should_stream",
        "_capacity",
        "_initial",
        "_buf",
        "_view",
        "_start",
        "_end",
        "_need",
        "_stream_left",
        "_room",
        "_grow",
        "allocations",
    )

    def __init__(
        self,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        should_stream: Callable[[memoryview], bool] | None = None,
        capacity: int = RECEIVE_BYTES,
        initial: int | None = None,
    ) -> None:
        """``capacity``: what the buffer grows to while reads keep filling it; ``initial``: what it starts at,
        allocated at the first read (default: ``capacity``). It also grows, once, to a frame being assembled."""
        self._max = max_frame_bytes
        self._should_stream = should_stream
        self._capacity = capacity
        self._initial = min(initial, capacity) if initial is not None else capacity
        self._buf = bytearray()
        self._view = memoryview(self._buf)
        self._start = 0  # first byte not handed out yet (the head of an incomplete frame)
        self._end = 0  # end of the received bytes
        self._need = 0  # full length of the incomplete frame at _start, once it is known to be assembled
        self._stream_left = 0  # bytes of the streaming frame still to come
        self._room = 0  # free space handed to the last read
        self._grow = False  # the last read filled all the room it had
        self.allocations = 0
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
        size = len(self._buf)
        target = max(size, self._initial)
        if self._grow and size < self._capacity:
            target = min(size * 2, self._capacity)
        self._grow = False
        min_room = max(1, min(MIN_ROOM, min(target, self._capacity) // 2))
        want = max(min_room, self._need - pending)
        if size - end < want or target > size:
            new = bytearray(max(target, pending + want + (min_room if self._need else 0)))
            if pending:
                new[:pending] = self._view[start:end]
            self._buf, self._view = new, memoryview(new)
            self._start, self._end = 0, pending
            self.allocations += 1
            end = pending
        room = self._view[end:] if end else self._view  # the whole buffer: the usual read, no new view
        self._room = len(room)
        return room

    def shrink(self) -> bool:
        """Give a grown buffer back while nothing is pending (a consumer gone quiet); the next read starts
        again at ``initial``. Views handed out keep the old buffer alive until they are dropped."""
        if self._start != self._end or self._stream_left or len(self._buf) <= self._initial:
            return False
        self._buf = bytearray()
        self._view = memoryview(self._buf)
        self._start = self._end = 0
        return True

    def add(self, nbytes: int) -> None:
        """``nbytes`` more bytes were read into the buffer's end (where :meth:`get_buffer` pointed)."""
        if nbytes >= self._room:
            self._grow = True
        self._end += nbytes

    def next_frame(self) -> bytes | memoryview | StreamHead | StreamPiece | None:
        """The next frame or stream piece now in hand, None when there is none yet. Asked one at a time, so the
        ``should_stream`` predicate sees the state left by the caller's handling of every earlier frame (e.g.
        which request is the oldest in flight). Raises FrameError for a size prefix that is negative or too large.
        (A method, not a generator: compiled, resuming a generator costs far more than a native method call.)"""
        start, end = self._start, self._end
        view = self._view
        left = self._stream_left
        if left:
            if end == start:
                return None
            take = min(left, end - start)
            self._stream_left = left = left - take
            self._start = start + take
            return StreamPiece(view[start : start + take], left == 0)
        if end - start < 4:
            return None
        size: int = _SIZE_unpack(self._buf, start)[0]  # typed: the arithmetic that follows is then native
        check_frame_size(size, self._max)
        total = 4 + size
        if end - start >= total:
            self._start = start + total
            self._need = 0
            if total <= SMALL_RESPONSE_BYTES:
                return bytes(view[start : start + total])
            return view[start : start + total]
        if self._need or end - start < HEAD_BYTES:
            return None  # assembling it (decided earlier), or too little in hand to decide yet
        if self._should_stream is not None and self._should_stream(view[start : start + HEAD_BYTES]):
            self._start = end
            self._stream_left = total - (end - start)
            return StreamHead(view[start:end], total)
        self._need = total
        return None

    def received(self, nbytes: int) -> Iterator[bytes | memoryview | StreamHead | StreamPiece]:
        """:meth:`add`, then every :meth:`next_frame`, lazily (for callers that iterate)."""
        self.add(nbytes)
        while (item := self.next_frame()) is not None:
            yield item
