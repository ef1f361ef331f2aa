"""Producer ids of a Produce request, read from its record-batch headers without decoding the request.

Why: KIP-936 charges a user for each producer id it brings, and the id is only in the record batches
(magic 2 header, ``producerId`` int64 at byte 43; −1 when the producer is not idempotent). Decoding the
request with kafka-python would copy every record set, megabytes per request, to read 8 bytes per batch. This
module walks the request's arrays with skip plans compiled once per version from kafka-python's own JSON schema
(as :mod:`protocol.skim` does for top-level fields), touches only the length prefixes on the way, and reads each
batch's fixed header in place: the cost is a small constant per partition plus one per batch, independent of
record sizes, and no record byte is copied.

Sans-IO and clock-free: bytes in, ids out.

Batch layout (all record formats share the first 17 bytes, which is how one tells them apart)::

    0  baseOffset int64      8  batchLength int32    12 partitionLeaderEpoch int32 (v0/v1: crc)
    16 magic int8            17 crc uint32           21 attributes int16          23 lastOffsetDelta int32
    27 baseTimestamp int64   35 maxTimestamp int64   43 producerId int64          51 producerEpoch int16
    53 baseSequence int32    57 records count int32  61 records...

A batch occupies ``12 + batchLength`` bytes; a records field may hold several back to back. Legacy message sets
(magic 0 and 1) carry no producer id and are skipped by their size. Batch CRCs are not checked (the broker does,
and rejects a corrupt batch; the id read from it may then have been counted once for nothing).

Anything that does not add up (a length running past its container, a trailing fragment shorter than a batch
header, a batch shorter than its format's header, an unknown magic) raises :class:`RecordBatchError`; nothing
else escapes (no ``IndexError``/``struct.error``).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any, Final

from kafka.protocol.schemas.fields.codecs import UnsignedVarInt32
from mypy_extensions import i64

from protocol.apis import Api, request_class
from protocol.errors import ProtocolError
from protocol.skim import FIXED, STR, TAGS, Ops, merge_ops, present, skip, struct_ops
from protocol.varint import TruncatedError, read_length

NO_PRODUCER_ID: Final = -1

_I16: Final = struct.Struct(">h")
_I32: Final = struct.Struct(">i")
_I32_unpack: Final = _I32.unpack_from  # bound once: compiled, a method call by name is a lookup each time
_I64: Final = struct.Struct(">q")
_I64_unpack: Final = _I64.unpack_from
_LEN_MAGIC: Final = struct.Struct(">8xi4xb")  # batchLength at 8, magic at 16
_LEN_MAGIC_unpack: Final = _LEN_MAGIC.unpack_from
_LEN_MAGIC_PID_unpack: Final = struct.Struct(">8xi4xb26xq").unpack_from  # and producerId at 43: one call

_LOG_OVERHEAD: Final = 12  # baseOffset + batchLength: what batchLength does not count
_MAGIC_END: Final = 17  # bytes needed to read the magic
_PID_OFFSET: Final = 43
_V2_HEADER: Final = 61  # a magic-2 batch header, log overhead included
# Smallest batchLength per magic: v0 message = crc4 magic1 attributes1 key4 value4, v1 adds timestamp8,
# v2 batch header is 61 bytes of which 12 are the log overhead.
_MIN_LENGTH = (14, 22, 49)


class RecordBatchError(ProtocolError):
    """A Produce request or one of its record batches is truncated or malformed; the message says where."""


# --- plan compilation (once per version) -------------------------------------------------------------------


def _split(
    fields: Iterable[Any], version: int, flexible: bool, is_target: Callable[[Any], bool]
) -> tuple[Ops, Any, Ops]:
    """Ops before the one present field satisfying ``is_target``, that field, ops after it (incl. tags)."""
    on_wire = [f for f in fields if present(f, version)]
    hits = [i for i, f in enumerate(on_wire) if is_target(f)]
    if len(hits) != 1:
        raise ValueError("Produce schema does not have the expected topics/partitions/records shape")
    i = hits[0]
    before = merge_ops(struct_ops(on_wire[:i], version, flexible, tags=False))
    return before, on_wire[i], merge_ops(struct_ops(on_wire[i + 1 :], version, flexible))


def _has_records(field: Any) -> bool:
    return field.is_array() and field.is_struct_array() and any(f.type_str == "records" for f in field.fields.values())


def _fixed_total(ops: Ops) -> int | None:
    """The byte count of ``ops`` when they are all fixed-size (the common case), so skipping is one addition."""
    if all(op.kind == FIXED for op in ops):
        return sum(op.size for op in ops)
    return None


def _only(ops: Ops, kind: int) -> bool:
    """Whether ``ops`` is the one operation ``kind``."""
    return len(ops) == 1 and ops[0].kind == kind


@dataclass(frozen=True, slots=True)
class _Plan:
    flexible: bool
    top_pre: Ops
    topic_pre: Ops
    topic_pre_fixed: int | None
    part_pre: Ops
    part_pre_fixed: int | None
    part_post: Ops
    topic_post: Ops
    top_post: Ops
    top_pre_after_str: int | None
    """When the fields before ``topics`` are one string then fixed-size ones (transactional_id, acks,
    timeout_ms: every version but v0-2): the byte count after the string, so the walk needs no ``skip`` call."""
    topic_pre_str: bool
    """The fields before ``partitions`` are one string (the topic name, v0-12)."""


@cache
def _plan(version: int) -> _Plan:
    cls = request_class(Api.PRODUCE)
    if cls is None or not cls.min_version <= version <= cls.max_version:
        lo, hi = (cls.min_version, cls.max_version) if cls is not None else (0, -1)
        raise RecordBatchError(f"Produce v{version} is not supported (known: v{lo}..v{hi})")
    flexible = bool(cls.flexible_version_q(version))
    top_pre, topics, top_post = _split(
        cls._struct.fields.values(),
        version,
        flexible,
        lambda f: f.is_array() and f.is_struct_array() and any(_has_records(g) for g in f.fields.values()),
    )
    topic_pre, partitions, topic_post = _split(topics.fields.values(), version, flexible, _has_records)
    part_pre, _records, part_post = _split(
        partitions.fields.values(), version, flexible, lambda f: f.type_str == "records"
    )
    top_pre_after_str = None
    if len(top_pre) == 2 and top_pre[0].kind == STR and top_pre[1].kind == FIXED:
        top_pre_after_str = top_pre[1].size
    return _Plan(
        flexible,
        top_pre,
        topic_pre,
        _fixed_total(topic_pre),
        part_pre,
        _fixed_total(part_pre),
        part_post,
        topic_post,
        top_post,
        top_pre_after_str,
        _only(topic_pre, STR),
    )


def _str_end(buf: memoryview, pos: int, flexible: bool) -> int:
    """Where the (nullable) string at ``pos`` ends: ``skim.skip`` of one string op, for the walk's inlined cases."""
    n, pos = read_length(buf, pos, flexible, 2)
    return pos + n if n > 0 else pos


# --- walking ----------------------------------------------------------------------------------------------


def _record_spans(
    buf: memoryview, version: int, offset: int, topics: list[str | uuid.UUID] | None = None
) -> list[tuple[int, int]]:
    """``(start, end)`` in ``buf`` of every non-null ``records`` field, in request order; with ``topics``, each topic's
    name (v0-12) or id (v13+) appended to it on the way (a null name as ``""``)."""
    plan = _plan(version)
    flexible = plan.flexible
    end = len(buf)
    spans: list[tuple[int, int]] = []
    part_post = plan.part_post
    part_post_tags = _only(part_post, TAGS)
    topic = part = -1
    try:
        if plan.top_pre_after_str is not None:
            pos = _str_end(buf, offset, flexible) + plan.top_pre_after_str
        else:
            pos = skip(plan.top_pre, buf, offset, end)
        ntopics, pos = read_length(buf, pos, flexible)
        topic_pre_str = plan.topic_pre_str
        for topic in range(ntopics):  # noqa: B007 - read by _where() in the error message
            part = -1
            if topic_pre_str:
                start = pos
                pos = _str_end(buf, pos, flexible)
                if pos > end:
                    raise RecordBatchError(f"the topic name runs past the end of the body ({end} bytes)")
                if topics is not None:
                    n, at = read_length(buf, start, flexible, 2)
                    topics.append(str(buf[at : at + n], "utf-8", "replace") if n > 0 else "")
            else:
                if topics is not None:  # v13+: the topic id leads the topic's fields
                    if pos + 16 > end:
                        raise RecordBatchError(f"the topic id runs past the end of the body ({end} bytes)")
                    topics.append(uuid.UUID(bytes=bytes(buf[pos : pos + 16])))
                pos = (
                    pos + plan.topic_pre_fixed
                    if plan.topic_pre_fixed is not None
                    else skip(plan.topic_pre, buf, pos, end)
                )
            nparts, pos = read_length(buf, pos, flexible)
            for part in range(nparts):  # noqa: B007 - read by _where() in the error message
                pos = (
                    pos + plan.part_pre_fixed if plan.part_pre_fixed is not None else skip(plan.part_pre, buf, pos, end)
                )
                if flexible:  # compact length, inlined: a 16 KiB batch needs a 3-byte varint
                    n = 0
                    shift = 0
                    while True:
                        b = buf[pos]
                        pos += 1
                        n |= (b & 0x7F) << shift
                        if b < 0x80:
                            break
                        shift += 7
                        if shift > 28:
                            raise RecordBatchError("records length varint is longer than 5 bytes")
                    n -= 1
                else:
                    (n,) = _I32_unpack(buf, pos)
                    pos += 4
                    if n < -1:
                        raise RecordBatchError(f"records length {n} is invalid")
                if n >= 0:
                    stop = pos + n
                    if stop > end:
                        raise RecordBatchError(
                            f"records of {n} bytes at byte {pos} run past the end of the body ({end} bytes)"
                        )
                    spans.append((pos, stop))
                    pos = stop
                if part_post_tags:
                    if buf[pos] == 0:  # no tagged fields: the usual case
                        pos += 1
                    else:
                        pos = skip(part_post, buf, pos, end)
                elif part_post:
                    pos = skip(part_post, buf, pos, end)
            if plan.topic_post:
                if flexible and buf[pos] == 0 and _only(plan.topic_post, TAGS):
                    pos += 1  # no tagged fields: the usual case
                else:
                    pos = skip(plan.topic_post, buf, pos, end)
        if plan.top_post:
            if flexible and buf[pos] == 0 and _only(plan.top_post, TAGS):
                pos += 1
            else:
                pos = skip(plan.top_post, buf, pos, end)
        if pos > end:
            raise RecordBatchError(f"the body ends at byte {end}, before its last field (byte {pos})")
    except RecordBatchError as exc:
        raise RecordBatchError(f"Produce v{version} {_where(topic, part)}: {exc}") from None
    except (struct.error, IndexError, TruncatedError) as err:  # not `exc`: mypyc types a name by its first except
        raise RecordBatchError(f"Produce v{version} {_where(topic, part)}: truncated ({err})") from None
    return spans


def _where(topic: int, part: int) -> str:
    if topic < 0:
        return "header fields"
    if part < 0:
        return f"topic #{topic}"
    return f"topic #{topic} partition #{part}"


def _scan_batches(buf: memoryview, start: int, end: int, out: set[int] | None, ids: list[int] | None) -> None:
    pos = start
    while pos < end:
        left = end - pos
        if left < _MAGIC_END:
            raise RecordBatchError(
                f"{left} trailing bytes at byte {pos - start} of a records field are shorter than a batch header"
            )
        length, magic = _LEN_MAGIC_unpack(buf, pos)
        if not 0 <= magic <= 2:
            raise RecordBatchError(f"record batch at byte {pos - start} of a records field has unknown magic {magic}")
        if length < _MIN_LENGTH[magic]:
            raise RecordBatchError(
                f"record batch at byte {pos - start} of a records field has length {length}, "
                f"shorter than a magic {magic} header ({_MIN_LENGTH[magic]})"
            )
        nxt = pos + _LOG_OVERHEAD + length
        if nxt > end:
            raise RecordBatchError(
                f"record batch at byte {pos - start} of a records field has length {length}, "
                f"past the end of the records field ({left - _LOG_OVERHEAD} bytes left)"
            )
        if magic == 2:
            (pid,) = _I64_unpack(buf, pos + _PID_OFFSET)
            if out is not None:
                if pid != NO_PRODUCER_ID:
                    out.add(pid)
            else:
                ids.append(pid)  # type: ignore[union-attr]
        pos = nxt


# --- public API ---------------------------------------------------------------------------------------------


def iter_partition_records(body: bytes | bytearray | memoryview, version: int, offset: int = 0) -> Iterator[memoryview]:
    """Every non-null ``records`` field of a Produce ``body`` at ``version``, as zero-copy memoryview slices.

    ``offset`` is where the body starts in ``body`` (e.g. ``RequestHeader.body_offset`` of a whole frame). The
    request skeleton is validated before the first slice is yielded.
    """
    buf = memoryview(body)
    for start, stop in _record_spans(buf, version, offset):
        yield buf[start:stop]


def record_spans(body: bytes | bytearray | memoryview, version: int, offset: int = 0) -> list[tuple[int, int]]:
    """``(start, end)`` in ``body`` of every non-null ``records`` field of a Produce request: what lies outside
    them is the request's skeleton (topic names and ids included)."""
    return _record_spans(memoryview(body), version, offset)


def produce_topics(body: bytes | bytearray | memoryview, version: int, offset: int = 0) -> list[str | uuid.UUID]:
    """The topics a Produce request writes to, in request order: names (v0-12) or ids (v13+). Read by the request
    quota's cost estimate only (its replicated-Produce term, ``quotas.kinds.RequestCosts``)."""
    return produce_topics_head(body, version, offset)[0]


def produce_topics_head(
    body: bytes | bytearray | memoryview, version: int, offset: int = 0
) -> tuple[list[str | uuid.UUID], int]:
    """:func:`produce_topics`, and for a request that writes to one topic where its key ends in ``body`` (-1 for
    more topics): the bytes from ``offset`` to there (transactional id, acks, timeout, one topic, its key) are equal
    in every request of a producer to that topic, so a caller may keep them and know the next such request's topic
    without reading it again (``proxy.rules.policy``)."""
    buf = memoryview(body)
    plan = _plan(version)
    if plan.top_pre_after_str is not None and (plan.topic_pre_str or plan.topic_pre_fixed == 16):
        # The usual request writes to one topic: its key is read where it starts, with no walk over the partitions
        # and their records.
        try:
            pos = _str_end(buf, offset, plan.flexible) + plan.top_pre_after_str
            ntopics, pos = read_length(buf, pos, plan.flexible)
            if ntopics == 1:
                if not plan.topic_pre_str:
                    if pos + 16 > len(buf):
                        raise RecordBatchError(f"the topic id runs past the end of the body ({len(buf)} bytes)")
                    return [uuid.UUID(bytes=bytes(buf[pos : pos + 16]))], pos + 16
                n, at = read_length(buf, pos, plan.flexible, 2)
                if at + n > len(buf):
                    raise RecordBatchError(f"the topic name runs past the end of the body ({len(buf)} bytes)")
                return [str(buf[at : at + n], "utf-8", "replace") if n > 0 else ""], at + max(n, 0)
        except (IndexError, TruncatedError) as exc:
            raise RecordBatchError(f"Produce v{version} too short to name its topics ({exc})") from None
    topics: list[str | uuid.UUID] = []
    _record_spans(buf, version, offset, topics)
    return topics, -1


def batch_producer_ids(records: bytes | bytearray | memoryview) -> list[int]:
    """The producerId of each magic-2 batch in one ``records`` field, in order (−1 included; legacy sets skipped)."""
    buf = memoryview(records)
    ids: list[int] = []
    _scan_batches(buf, 0, len(buf), None, ids)
    return ids


class Shape:
    """The skeleton of a Produce request with one non-null records field: its bytes before that field's length
    and after the field, and where the body starts. Kept per connection (a producer sends the same skeleton request
    after request), it lets :func:`single_producer_id` read the id without walking the request again.

    Why it is exact: a Produce request is parsed front to back, so equal bytes before the records length parse to
    the same fields and end at the same place; the length then fixes the records field, and equal bytes after it
    parse to the same fields and end with the body. Any byte that differs falls back to the full walk."""

    __slots__ = ("flexible", "offset", "prefix", "tail", "version")

    def __init__(self, version: int, offset: int, prefix: bytes, tail: bytes, flexible: bool) -> None:
        self.version = version
        self.offset = offset
        self.prefix = prefix
        self.tail = tail
        self.flexible = flexible


MAX_SHAPE_BYTES: Final = 1024
"""Skeletons longer than this are not kept (a long transactional id, many null partitions): the memo stays small."""


def single_producer_id(data: bytes, start: int, version: int, offset: int, shape: Shape) -> int | None:
    """The producer id of the request at ``data[start:]`` (after the size prefix; its body at ``offset`` from
    there) when it is shaped like ``shape`` and its records field is one magic-2 batch (−1 for a producer without
    one); None when it is not like that (then :func:`producer_ids_and_shape`).

    On ``bytes`` only, read byte by byte: compiled, every read, slice and compare here is native, where on a
    memoryview each is a call building an object.
    Positions, bytes and words are ``i64``: compiled, their arithmetic is the machine's, where a tagged ``int``'s
    add and shift are each a call; in Python they are ints."""
    if version != shape.version or offset != shape.offset:
        return None
    prefix = shape.prefix
    at: i64 = start + offset
    pos: i64 = at + len(prefix)
    end: i64 = len(data)
    if pos + 4 > end or data[at:pos] != prefix:
        return None
    n: i64
    if shape.flexible:  # read_length's compact case, inline: one or two varint bytes for nearly every request
        b: i64 = data[pos]
        if b < 0x80:
            n = b - 1
            pos += 1
        else:
            b2: i64 = data[pos + 1]
            if b2 < 0x80:
                n = (b & 0x7F | b2 << 7) - 1
                pos += 2
            else:
                try:
                    length, after = read_length(data, pos, True)
                except TruncatedError:
                    return None
                n, pos = length, after
    else:
        n = _u32(data, pos)
        if n >= 0x80000000:
            return None  # null or invalid
        pos += 4
    stop = pos + n
    tail = shape.tail
    if n < _V2_HEADER or stop + len(tail) != end or not data.endswith(tail):  # endswith: native, no slice
        return None
    if data[pos + 16] != 2 or pos + _LOG_OVERHEAD + _u32(data, pos + 8) != stop:  # magic 2, one batch: the field
        return None
    hi = _u32(data, pos + 43)
    lo = _u32(data, pos + 47)
    if hi < 0x80000000:
        return hi << 32 | lo
    # Negative (−1: no producer id): two's complement from the complemented words, so that no step shifts a
    # negative number or leaves 63 bits (an i64 would overflow; a Python int would not, but must agree).
    return -((0xFFFFFFFF - hi) << 32 | (0xFFFFFFFF - lo)) - 1


def _u32(data: bytes, pos: i64) -> i64:
    """A big-endian unsigned 32-bit word: compiled, four native reads and shifts (a call costs less than it saves
    now that the arithmetic is native)."""
    b0: i64 = data[pos]
    b1: i64 = data[pos + 1]
    b2: i64 = data[pos + 2]
    b3: i64 = data[pos + 3]
    return b0 << 24 | b1 << 16 | b2 << 8 | b3


def producer_ids_and_shape(
    body: bytes | bytearray | memoryview, version: int, offset: int = 0, spans: list[tuple[int, int]] | None = None
) -> tuple[set[int], Shape | None]:
    """:func:`producer_ids`, and the request's :class:`Shape` when it has one non-null records field (None
    otherwise, or when its skeleton exceeds :data:`MAX_SHAPE_BYTES`). ``spans``: the request's record fields
    (:func:`record_spans` of ``body``) when the caller has walked them already."""
    buf = memoryview(body)
    if spans is None:
        spans = _record_spans(buf, version, offset)
    ids = _ids_in(buf, spans, version, offset)
    shape = None
    if len(spans) == 1:
        start, stop = spans[0]
        flexible = _plan(version).flexible
        width = 4
        canonical = True
        if flexible:  # where the length starts: only a canonical varint says (a padded one ends in a 0 byte)
            encoded = UnsignedVarInt32.encode(stop - start + 1)
            width = len(encoded)
            canonical = buf[start - width : start] == encoded
        if canonical and start - width - offset + len(buf) - stop <= MAX_SHAPE_BYTES:
            shape = Shape(version, offset, bytes(buf[offset : start - width]), bytes(buf[stop:]), flexible)
    return ids, shape


def producer_ids(body: bytes | bytearray | memoryview, version: int, offset: int = 0) -> set[int]:
    """The distinct producer ids (−1 and legacy message sets left out) in a Produce ``body`` at ``version``.

    ``offset`` is where the body starts in ``body``. Raises :class:`RecordBatchError` when the request or any of
    its batches is truncated or malformed; never reads or copies record payloads.
    """
    buf = memoryview(body)
    return _ids_in(buf, _record_spans(buf, version, offset), version, offset)


def _ids_in(buf: memoryview, spans: list[tuple[int, int]], version: int, offset: int) -> set[int]:
    out: set[int] = set()
    for start, stop in spans:
        if stop - start >= _V2_HEADER:  # the usual field, one magic-2 batch that fills it: read it here
            length, magic = _LEN_MAGIC_unpack(buf, start)
            if magic == 2 and start + _LOG_OVERHEAD + length == stop:  # then length >= the v2 minimum too
                (pid,) = _I64_unpack(buf, start + _PID_OFFSET)
                if pid != NO_PRODUCER_ID:
                    out.add(pid)
                continue
        try:
            _scan_batches(buf, start, stop, out, None)
        except RecordBatchError as exc:
            raise RecordBatchError(f"Produce v{version}: records at body byte {start - offset}: {exc}") from None
    return out
