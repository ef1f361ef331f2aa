"""Requests sent upstream and still waiting for their response, in the order they were sent.

Kafka answers the requests of one connection in order, so a FIFO is enough; the correlation id of
each response is still checked, since a mismatch means the stream is corrupt and must be closed.
"""

from __future__ import annotations

from typing import Any, Final

from mypy_extensions import i64

from protocol.apis import Api
from protocol.errors import ProtocolError
from protocol.headers import RequestHeader
from protocol.request_fields import ProduceFields
from protocol.varint import TruncatedError, read_length

_LONG_WAITS_MS: dict[int, int] = {
    Api.SYNC_GROUP: 300_000,  # waits for the group leader's assignment: up to a rebalance (max.poll.interval.ms)
    Api.CREATE_TOPICS: 120_000,
    Api.DELETE_TOPICS: 120_000,
    Api.DELETE_RECORDS: 120_000,
    Api.CREATE_PARTITIONS: 120_000,
    Api.ELECT_LEADERS: 120_000,
    Api.ALTER_PARTITION_REASSIGNMENTS: 120_000,
    Api.INIT_PRODUCER_ID: 60_000,
    Api.ADD_PARTITIONS_TO_TXN: 60_000,
    Api.END_TXN: 60_000,
}
"""Requests whose answer may legitimately take long but whose wait is not one field the proxy reads: the longest
their clients' defaults allow (the admin APIs' timeout_ms, a rebalance's max.poll.interval.ms)."""


class CorrelationError(ProtocolError):
    """A response arrived that does not answer the oldest outstanding request."""


class Pending:
    """One request the client is owed an answer to, in order.

    Most are answered by the broker. ``local`` is an answer the proxy made itself (every topic of a strict
    CreateTopics rejected, say): it is released as soon as everything before it has been answered, so the
    client still sees its answers in request order. ``internal`` marks a request the proxy asked on its own
    account (a Metadata lookup): its answer resolves the future and never reaches the client.

    A plain class rather than a dataclass: compiled, a dataclass keeps its generated, interpreted ``__init__``.
    """

    __slots__ = ("header", "sent_at", "decision", "local", "internal", "wait_ms", "whole", "sample")

    def __init__(
        self,
        header: RequestHeader,
        sent_at: float,
        decision: Any = None,
        local: bytes | None = None,
        internal: Any = None,
        wait_ms: int = 0,
        whole: bool = False,
    ) -> None:
        self.header = header
        self.sent_at = sent_at
        self.decision = decision
        """The policy's state for this request (what to charge or rewrite when the answer comes)."""
        self.local = local
        self.internal = internal
        self.wait_ms = wait_ms
        """How long the broker may take on purpose (see :func:`requested_wait_ms`): the hung-broker check adds it."""
        self.whole = whole
        """The response is rewritten past its leading bytes: it is assembled, never streamed."""
        self.sample = -1
        """Its round trip's baseline class for fair share (``quotas.fair_share.sample_class``); -1: not a sample."""

    def __repr__(self) -> str:
        return f"Pending({self.header!r}, sent_at={self.sent_at}, decision={self.decision!r}, wait_ms={self.wait_ms})"


class InFlight:
    """The requests owed an answer, oldest first.

    A list and the index of its oldest live entry rather than a ``deque``: compiled, a list's append and index
    are native, where each deque operation is a method call by name.
    Answered entries are cleared at once; the list itself is emptied whenever nothing is owed (after nearly
    every response) and compacted once its answered head outgrows what is still owed, so it stays bounded by
    twice the requests in flight."""

    __slots__ = ("_items", "_first")

    def __init__(self) -> None:
        self._items: list[Pending | None] = []
        self._first = 0

    def push(self, pending: Pending) -> None:
        self._items.append(pending)

    def pop(self, correlation_id: int) -> Pending:
        items = self._items
        i = self._first
        if i >= len(items):
            raise CorrelationError(f"response with correlation id {correlation_id} answers no request")
        head = items[i]
        assert head is not None  # entries from _first on are live
        if head.header.correlation_id != correlation_id:
            raise CorrelationError(
                f"response correlation id {correlation_id} does not match the oldest request "
                f"({head.header.correlation_id})"
            )
        i += 1
        if i == len(items):  # nothing else owed: the usual case
            items.clear()
            self._first = 0
        elif i >= _COMPACT_FROM and 2 * i >= len(items):
            del items[:i]
            self._first = 0
        else:
            items[i - 1] = None  # no answered request is kept alive
            self._first = i
        return head

    def head(self) -> Pending | None:
        i = self._first
        items = self._items
        return items[i] if i < len(items) else None

    def __len__(self) -> int:
        return len(self._items) - self._first


_COMPACT_FROM: Final = 32
"""Answered entries at the head of :class:`InFlight`'s list before it is compacted (when they are also at least
half of it): a client pipelining without pause pays one slice every 32 responses or more."""


_AFTER_BODY_START: Final = 5 + 0x7FFF + 8
"""What the readers below may look at past the body's start: a leading string (its length, at most 5 bytes, and
at most 32,767 bytes: Kafka refuses longer strings) and two fixed fields after it."""


def _head(frame: bytes | bytearray | memoryview, pos: int) -> bytes:
    """``frame`` as ``bytes`` (whose reads are native when compiled): itself, or a copy of what the readers may
    look at when it is a large frame's view (never the records)."""
    if isinstance(frame, bytes):
        return frame
    return bytes(memoryview(frame)[: pos + _AFTER_BODY_START])


def _i16(buf: bytes, pos: i64) -> int:
    """Big-endian, signed. Bytes and words are ``i64`` (as ``protocol.record_batches._u32``): compiled, their shifts
    and ors are the machine's, where a tagged ``int``'s are each a checked call (half the instructions)."""
    b0: i64 = buf[pos]
    b1: i64 = buf[pos + 1]
    n = b0 << 8 | b1
    return n - 0x10000 if n >= 0x8000 else n


def _i32(buf: bytes, pos: i64) -> int:
    """Big-endian, signed (``i64`` words: :func:`_i16`)."""
    b0: i64 = buf[pos]
    b1: i64 = buf[pos + 1]
    b2: i64 = buf[pos + 2]
    b3: i64 = buf[pos + 3]
    n = b0 << 24 | b1 << 16 | b2 << 8 | b3
    return n - 0x100000000 if n >= 0x80000000 else n


def _skip_leading_string(buf: bytes, pos: int, flexible: bool) -> int:
    if flexible and buf[pos] < 0x80:  # read_length's one-byte case, inline: nearly every string
        return pos + max(buf[pos] - 1, 0) + 1
    n, pos = read_length(buf, pos, flexible, 2)
    return pos + max(n, 0)


def requested_wait_ms(frame: bytes | bytearray | memoryview, header: RequestHeader, base: int = 0) -> int:
    """How long the broker may hold this request on purpose: Fetch ``max_wait_ms``, Produce ``timeout_ms``,
    JoinGroup's rebalance (v0: session) timeout, a fixed allowance for the APIs of ``_LONG_WAITS_MS``, else 0.
    A field that cannot be read counts as 0 (the request is the broker's to refuse). ``base``: where the header
    starts in ``frame`` (4 for a frame with its size prefix: no slice, so no copy of a large frame)."""
    if header.body_offset is None:
        return 0  # an API the proxy has no schema for: nothing of it is read
    key, pos = header.api_key, header.body_offset + base
    if key == Api.PRODUCE:  # one reading of a Produce's timeout: the one read_request makes with its acks
        try:
            return produce_acks_and_timeout(frame, header, base)[1]
        except ProtocolError:
            return 0
    if key != Api.FETCH and key != Api.JOIN_GROUP:
        return _LONG_WAITS_MS.get(key, 0)
    buf = _head(frame, pos)
    try:
        if key == Api.FETCH:
            return max(_i32(buf, pos + (4 if header.api_version < 15 else 0)), 0)
        pos = _skip_leading_string(buf, pos, header.api_version >= 6)
        return max(_i32(buf, pos + (4 if header.api_version >= 1 else 0)), 0)
    except (IndexError, ValueError):
        return 0


def produce_acks(frame: bytes | bytearray | memoryview, header: RequestHeader, base: int = 0) -> int:
    """The ``acks`` of a Produce request: after the (nullable) transactional id, from v3 on. ``base``: where the
    header starts in ``frame``. Raises :class:`~protocol.varint.TruncatedError` (a ProtocolError) when the body
    is too short to hold it."""
    return produce_acks_and_timeout(frame, header, base)[0]


def produce_acks_and_timeout(
    frame: bytes | bytearray | memoryview, header: RequestHeader, base: int = 0
) -> tuple[int, int]:
    """A Produce's ``acks`` (:func:`produce_acks`) and its ``timeout_ms`` as :func:`requested_wait_ms` says it (never
    negative; 0 when the body ends before it), read together: the timeout follows acks, so the transactional id
    before both is skipped once (``protocol.request.read_request``; skipped again for the timeout, it was a tenth
    of the instructions a no-quota Produce cost the session). Raises as :func:`produce_acks`."""
    if header.body_offset is None:
        raise TruncatedError("Produce request body offset unknown")
    pos = header.body_offset + base
    buf = _head(frame, pos)
    try:
        if header.api_version >= ProduceFields.TRANSACTIONAL_ID_SINCE:  # after the (nullable) transactional id
            pos = _skip_leading_string(buf, pos, header.api_version >= ProduceFields.COMPACT_SINCE)
        if pos + 2 > len(buf):
            raise IndexError
        acks = _i16(buf, pos)
    except (IndexError, TruncatedError):  # a ProtocolError naming the request, never an IndexError
        raise TruncatedError(
            f"Produce v{header.api_version} too short to hold acks (body of {len(buf) - header.body_offset - base} "
            "bytes)"
        ) from None
    pos += 2
    if pos + 4 > len(buf):
        return acks, 0
    timeout = _i32(buf, pos)
    return acks, timeout if timeout > 0 else 0


def expects_response(frame: bytes | bytearray | memoryview, header: RequestHeader, base: int = 0) -> bool:
    """Everything is answered except Produce with acks=0."""
    return not (header.api_key == Api.PRODUCE and produce_acks(frame, header, base) == 0)
