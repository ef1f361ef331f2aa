"""Unsigned varints and tagged-field sections, the two primitives of flexible message versions."""

from __future__ import annotations

import struct
from typing import Final

from protocol.errors import ProtocolError


class TruncatedError(ProtocolError):
    """A field runs past the end of its frame."""


def read_uvarint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    value = 0
    shift = 0
    n = len(buf)
    while True:
        if pos >= n:
            raise TruncatedError("varint runs past the end of the frame")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise TruncatedError("varint longer than 5 bytes")


def read_tagged_fields(buf: bytes | bytearray | memoryview, pos: int) -> tuple[list[tuple[int, int, int]], int]:
    """The tagged-field section at ``pos``: ``(tag, value start, value end)`` per field, and the position after
    the section. The varints are bounds-checked, the values are not (callers check the end against their own)."""
    count, pos = read_uvarint(buf, pos)
    fields = []
    for _ in range(count):
        tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        fields.append((tag, pos, pos + size))
        pos += size
    return fields, pos


def skip_tagged_fields(buf: bytes | bytearray | memoryview, pos: int) -> int:
    if pos < len(buf) and buf[pos] == 0:  # no tagged fields: nearly every header and struct
        return pos + 1
    _fields, pos = read_tagged_fields(buf, pos)
    if pos > len(buf):
        raise TruncatedError("tagged field runs past the end of the frame")
    return pos


_I16: Final = struct.Struct(">h")
_I16_unpack: Final = _I16.unpack_from  # bound once: compiled, a method call by name is a lookup each time
_I32: Final = struct.Struct(">i")
_I32_unpack: Final = _I32.unpack_from


def read_length(buf: bytes | bytearray | memoryview, pos: int, compact: bool, width: int = 4) -> tuple[int, int]:
    """A length prefix (string, bytes or array count; -1 is null): compact (flexible versions) a uvarint of
    length + 1, else a big-endian int16 (``width`` 2: strings) or int32. Returns (length, position after).
    Raises :class:`TruncatedError` when the length itself runs past the end of ``buf`` (what it counts is the
    caller's to check)."""
    if compact:
        n = buf[pos] if pos < len(buf) else 0x80
        if n < 0x80:  # one byte: nearly every length in practice
            return n - 1, pos + 1
        n, pos = read_uvarint(buf, pos)
        return n - 1, pos
    try:  # no bounds check of our own: a length cut short is rare, and the unpack checks anyway
        if width == 2:
            return _I16_unpack(buf, pos)[0], pos + 2
        return _I32_unpack(buf, pos)[0], pos + 4
    except struct.error:
        # Malformed peer bytes, not a proxy bug: the one error family (protocol.errors), never struct's.
        raise TruncatedError(f"int{width * 8} length at byte {pos} runs past the end ({len(buf)} bytes)") from None
