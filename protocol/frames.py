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


class FrameSplitter:
    """Accumulates bytes and yields whole frames (without the size prefix)."""

    __slots__ = ("_buf", "_max")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_frame_bytes

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf
        buf += data
        frames: list[bytes] = []
        pos = 0
        end = len(buf)
        while end - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            check_frame_size(size, self._max)
            if end - pos - 4 < size:
                break
            frames.append(bytes(buf[pos + 4 : pos + 4 + size]))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return frames

    @property
    def buffered(self) -> int:
        return len(self._buf)


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
