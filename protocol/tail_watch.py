"""Follow a response that streams through in pieces up to its top-level tagged fields.

Why: from Fetch v16 (KIP-951) a response may end with ``node_endpoints``, a tagged field holding
broker addresses the proxy must rewrite. It sits after every record set, so finding it used to
mean assembling the whole multi-megabyte response before any of it could be forwarded: a full
store-and-forward delay on every fetch. The top-level tagged-field section is, however, the last
thing in the frame, and the fields before it are mostly record sets whose lengths come first. So
the body is walked as it arrives — reading only the small length and count fields, skipping the
record bytes by their length — and everything up to the tagged section is forwarded at once; only
that section (one byte when empty) is held back, and rewritten when the frame is complete.

The walk is driven by the same compiled skip plan as ``protocol.skim`` (kafka-python's schemas),
run as a generator that asks for "read n bytes" or "skip n bytes", so it resumes across pieces
without buffering anything but a field split between two reads.
"""

from __future__ import annotations

import struct
from collections.abc import Generator
from typing import Any

from protocol.skim import ARRAY, BYTES, FIXED, NSTRUCT, STR, Ops, top_level_plan
from protocol.varint import TruncatedError

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")

# The walker yields an int: n > 0 asks for the next n bytes (sent back as a bytes-like object),
# n < 0 skips -n bytes (resumed with next(), nothing sent); it returns when the top-level tagged-field section starts.
_Walk = Generator[int, "bytes | memoryview", None]


def _uvarint() -> Generator[int, bytes | memoryview, int]:
    value = shift = 0
    while True:
        b = (yield 1)[0]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value
        shift += 7
        if shift > 28:
            raise TruncatedError("varint longer than 5 bytes")


def _walk(ops: Ops) -> _Walk:
    for op in ops:
        kind = op.kind
        if kind == FIXED:
            yield -op.size
        elif kind in (STR, BYTES):
            if op.compact:
                n = (yield from _uvarint()) - 1
            elif kind == STR:
                n = _I16.unpack((yield 2))[0]
            else:
                n = _I32.unpack((yield 4))[0]
            if n > 0:
                yield -n
        elif kind == ARRAY:
            count = (yield from _uvarint()) - 1 if op.compact else _I32.unpack((yield 4))[0]
            inner = op.inner
            if len(inner) == 1 and inner[0].kind == FIXED:
                if count > 0:
                    yield -count * inner[0].size
            else:
                for _ in range(count):
                    yield from _walk(inner)
        elif kind == NSTRUCT:
            if (yield 1)[0] != 0xFF:
                yield from _walk(op.inner)
        else:  # TAGS of a nested struct
            for _ in range((yield from _uvarint())):
                yield from _uvarint()
                size = yield from _uvarint()
                if size:
                    yield -size


def _top(plan: tuple[tuple[str, Ops], ...]) -> _Walk:
    for _name, ops in plan:
        yield from _walk(ops)


class TailWatch:
    """Feed the body of a flexible response piece by piece; ``feed`` says where its top-level
    tagged-field section starts once it reaches it.

    Raises TruncatedError (a ValueError) for a negative length or count the walk cannot follow.
    """

    __slots__ = ("_gen", "_want", "_carry", "consumed", "done")

    def __init__(self, message_cls: Any, version: int) -> None:
        """``message_cls``: a kafka-python message class, or a stand-in with what the walk reads (``name``,
        ``_struct.fields``, ``flexible_version_q``: ``protocol.addresses.tail_watch_class``)."""
        plan, flexible = top_level_plan(message_cls, version)
        if not flexible:
            raise ValueError(f"{message_cls.name} v{version} has no tagged fields to watch for")
        self._gen = _top(plan)
        self._carry: bytearray | None = None
        self.consumed = 0
        """Body bytes walked so far (the offset of the tagged section once ``done``)."""
        self.done = False
        self._want = self._resume()

    def _next(self, chunk: bytes | memoryview) -> int:
        """The walk's next request, sent the ``chunk`` of bytes it asked for."""
        try:
            want = self._gen.send(chunk)
        except StopIteration:
            self.done = True
            return 0
        return want

    def _resume(self) -> int:
        """The walk's next request, after a skip (or at the start): nothing to send."""
        try:
            want = next(self._gen)
        except StopIteration:
            self.done = True
            return 0
        return want

    def feed(self, data: bytes | memoryview) -> int | None:
        """Walk ``data``, the next bytes of the body: the index in ``data`` at which the top-level
        tagged-field section starts, or None when it lies further on."""
        if self.done:
            return 0
        i, n = 0, len(data)
        want = self._want
        chunk: bytes | memoryview
        while True:
            if want < 0:
                if i - want > n:
                    self._want = want + (n - i)
                    self.consumed += n - i
                    return None
                i -= want
                self.consumed -= want
                want = self._resume()
            elif self._carry is not None:
                take = min(want - len(self._carry), n - i)
                self._carry += data[i : i + take]
                i += take
                self.consumed += take
                if len(self._carry) < want:
                    self._want = want
                    return None
                chunk, self._carry = bytes(self._carry), None
                want = self._next(chunk)
            elif i + want <= n:
                chunk = data[i : i + want]
                i += want
                self.consumed += want
                want = self._next(chunk)
            else:
                self._carry = bytearray(data[i:])
                self.consumed += n - i
                self._want = want
                return None
            if self.done:
                return i
