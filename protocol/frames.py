"""Split a byte stream into Kafka frames (4-byte big-endian size, then that many bytes).

Sans-IO: the caller feeds whatever the socket gave and takes complete frames out. The size is
checked against the limit *before* any buffer for the body is reserved, so a hostile or corrupt
length prefix costs nothing (the broker's ``socket.request.max.bytes`` does the same).
"""

from __future__ import annotations

import struct

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
