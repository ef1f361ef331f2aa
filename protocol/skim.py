"""Find where the top-level fields of a message lie, without decoding it.

Why: Produce and Fetch frames are the bulk of the traffic and carry megabytes of records. Decoding
them with kafka-python copies every record set (≈200 µs for a 3 MiB Fetch response, measured), yet
the proxy only needs the position of one or two top-level fields (``throttle_time_ms``, the tagged
``node_endpoints``). The walk is driven by kafka-python's own parsed JSON schema, compiled once per
(message, version) into a short list of skip operations, so no field layout is written by hand.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from functools import lru_cache
from typing import Any, ClassVar, Final, TypeAlias

from mypy_extensions import i64

from protocol.varint import TruncatedError, read_tagged_fields, read_uvarint, skip_tagged_fields

FIXED_SIZES = {
    "int8": 1,
    "bool": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "bitfield": 4,
    "int64": 8,
    "float64": 8,
    "uuid": 16,
}
"""Wire sizes of the fixed-size field types."""
_I16: Final = struct.Struct(">h")
_I16_unpack: Final = _I16.unpack_from  # bound once: compiled, a method call by name is a lookup each time
_I32: Final = struct.Struct(">i")
_I32_unpack: Final = _I32.unpack_from

# Kinds of skip operation
FIXED: Final = 0
STR: Final = 1
BYTES: Final = 2
ARRAY: Final = 3
NSTRUCT: Final = 4
TAGS: Final = 5


class _Plain:
    """A plain class's ``repr``, ``Name(a=..., b=...)`` from its ``_FIELDS``: Op and Layout are plain classes only
    to be fast compiled, and would otherwise each spell out the ``__repr__`` a dataclass writes. (Not from
    ``__slots__``: compiled, a class keeps no ``__slots__`` attribute.)"""

    __slots__ = ()
    _FIELDS: ClassVar[tuple[str, ...]] = ()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{n}={getattr(self, n)!r}' for n in self._FIELDS)})"


class Op(_Plain):
    """One skip operation. A plain class rather than a tuple: compiled, its fields are read natively, where a
    tuple's items are generic reads."""

    _FIELDS = ("kind", "size", "compact", "inner")
    __slots__ = _FIELDS

    def __init__(self, kind: int, size: int = 0, compact: bool = False, inner: tuple[Op, ...] = ()) -> None:
        self.kind = kind
        self.size = size
        """FIXED: bytes to skip."""
        self.compact = compact
        """STR, BYTES, ARRAY: the length is a compact varint (flexible versions)."""
        self.inner = inner
        """ARRAY, NSTRUCT: the element's operations."""


Ops: TypeAlias = tuple[Op, ...]
"""A compiled walk: the operations of a sequence of fields, in wire order."""


class Layout(_Plain):
    """Byte spans of a message's top-level fields, relative to the start of the body. (A plain class, not a
    dataclass: compiled, a dataclass keeps its generated, interpreted ``__init__``.)"""

    _FIELDS = ("fields", "tags", "tags_offset", "end")
    __slots__ = _FIELDS

    def __init__(
        self, fields: dict[str, tuple[int, int]], tags: dict[int, tuple[int, int]], tags_offset: int | None, end: int
    ) -> None:
        self.fields = fields
        self.tags = tags
        """Spans of the *values* of top-level tagged fields, by tag (present only when sent)."""
        self.tags_offset = tags_offset
        """Start of the top-level tagged-field section (flexible versions only)."""
        self.end = end


def present(field: Any, version: int) -> bool:
    """Whether ``field`` (a kafka-python schema field) is on the wire at ``version`` as a regular (not tagged)
    field."""
    return bool(field.for_version_q(version) and not field.tagged_field_q(version))


def _scalar_op(type_str: str, flexible: bool) -> Op:
    if type_str in FIXED_SIZES:
        return Op(FIXED, FIXED_SIZES[type_str])
    if type_str == "string":
        return Op(STR, compact=flexible)
    if type_str in ("bytes", "records"):
        return Op(BYTES, compact=flexible)
    raise ValueError(f"no skip rule for field type {type_str!r}")


def field_ops(field: Any, version: int, flexible: bool) -> list[Op]:
    """The skip operations for one field (a nested struct's include its tagged-field section)."""
    if field.is_array():
        if field.is_struct_array():
            inner = struct_ops(field.fields.values(), version, flexible)
        else:
            inner = [_scalar_op(field.array_of.type_str, flexible)]
        return [Op(ARRAY, compact=flexible, inner=merge_ops(inner))]
    if field.is_struct():
        inner = struct_ops(field.fields.values(), version, flexible)
        if field.nullable_for_version_q(version):
            return [Op(NSTRUCT, inner=merge_ops(inner))]
        return inner
    return [_scalar_op(field.type_str, flexible)]


def struct_ops(fields: Iterable[Any], version: int, flexible: bool, tags: bool = True) -> list[Op]:
    """The skip operations for a sequence of fields, then (flexible versions, ``tags``) their tag section."""
    ops: list[Op] = []
    for field in fields:
        if present(field, version):
            ops.extend(field_ops(field, version, flexible))
    if flexible and tags:
        ops.append(Op(TAGS))
    return ops


def merge_ops(ops: Iterable[Op]) -> Ops:
    """Adjacent fixed-size skips folded into one."""
    out: list[Op] = []
    for op in ops:
        if op.kind == FIXED and out and out[-1].kind == FIXED:
            out[-1] = Op(FIXED, out[-1].size + op.size)
        else:
            out.append(op)
    return tuple(out)


def skip(ops: Ops, buf: bytes | memoryview, pos: int, end: int, free: list[int] | None = None) -> int:
    """Skip the fields ``ops`` describe from ``pos``; the position after them. Raises TruncatedError (a
    ProtocolError) when a field, or a length, runs past ``end``.

    ``free``, when given, gets the spans (start, stop, flat) of the bytes the walk did not read: fixed-size
    fields, string and byte contents, arrays of fixed-size elements. Every byte outside them (lengths, counts,
    null markers, tag sections) steers the walk, so a body of the same length that agrees on all of those
    walks the same way (:class:`protocol.endpoint_apis.ResponseShape`)."""
    try:  # the walk reads lengths unchecked: one that is cut short surfaces here, once, as the protocol's error
        return _walk(ops, buf, buf if isinstance(buf, bytes) else b"", pos, end, free)
    except (struct.error, IndexError):
        raise TruncatedError(f"a length past byte {pos} runs past the end ({end} bytes)") from None


def _walk(ops: Ops, buf: bytes | memoryview, native: bytes, pos: i64, end: i64, free: list[int] | None) -> i64:
    """:func:`skip`, the one walk. ``native`` is ``buf`` itself when that is ``bytes``, else empty; a single byte is
    read from it when it holds it. Why: compiled, a read of ``bytes`` is native, where a memoryview's (a large
    body, walked in place rather than copied) is a generic call. Positions and lengths are ``i64`` so that,
    compiled, their arithmetic is the machine's (a tagged ``int``'s checks for a big integer at every step)."""
    for op in ops:
        kind = op.kind
        if kind == FIXED:
            if free is not None:
                free.append(pos)
                free.append(pos + op.size)
            pos += op.size
        elif kind <= ARRAY:  # STR, BYTES, ARRAY: a length (compact: a varint of length + 1), then its bytes
            n: i64
            if op.compact:
                n = native[pos] if pos < len(native) else buf[pos]
                if n < 0x80:
                    pos += 1
                else:
                    n, pos = read_uvarint(buf, pos)
                n -= 1
            elif kind == STR:
                (n,) = _I16_unpack(buf, pos)
                pos += 2
            else:
                (n,) = _I32_unpack(buf, pos)
                pos += 4
            if kind != ARRAY:
                if n > 0:
                    if free is not None:
                        free.append(pos)
                        free.append(pos + n)
                    pos += n
            else:
                inner = op.inner
                if len(inner) == 1 and inner[0].kind == FIXED:
                    if n > 0:
                        if free is not None:
                            free.append(pos)
                            free.append(pos + n * inner[0].size)
                        pos += n * inner[0].size
                else:
                    for _ in range(n):
                        pos = _walk(inner, buf, native, pos, end, free)
        elif kind == NSTRUCT:
            marker = native[pos] if pos < len(native) else buf[pos]
            pos += 1
            if marker != 0xFF:
                pos = _walk(op.inner, buf, native, pos, end, free)
        elif (native[pos] if pos < len(native) else buf[pos]) == 0:  # TAGS, none sent: the usual case
            pos += 1
        else:
            pos = skip_tagged_fields(buf, pos)
        if pos > end:
            raise TruncatedError(f"a field ending at byte {pos} runs past the end ({end} bytes)")
    return pos


@lru_cache(maxsize=4096)  # versions come from clients (capped, but bounded here too)
def top_level_plan(message_cls: Any, version: int) -> tuple[tuple[tuple[str, Ops], ...], bool]:
    """Per top-level field of ``message_cls`` at ``version``: its name and skip operations; and whether the
    version is flexible (a top-level tag section follows). Compiled once per (message, version)."""
    flexible = bool(message_cls.flexible_version_q(version))
    plan = []
    for field in message_cls._struct.fields.values():
        if present(field, version):
            plan.append((field.name, merge_ops(field_ops(field, version, flexible))))
    return tuple(plan), flexible


def layout(message_cls: Any, version: int, body: bytes | memoryview, offset: int = 0) -> Layout:
    """Spans of the top-level fields of ``message_cls`` at ``version`` in ``body[offset:]``.

    Raises TruncatedError (a ValueError) when the body is shorter than its fields say.
    """
    plan, flexible = top_level_plan(message_cls, version)
    fields: dict[str, tuple[int, int]] = {}
    pos = offset
    end = len(body)
    try:
        for name, ops in plan:
            start = pos
            pos = skip(ops, body, pos, end)
            fields[name] = (start - offset, pos - offset)
        tags: dict[int, tuple[int, int]] = {}
        tags_offset = None
        if flexible:
            tags_offset = pos - offset
            tagged, pos = read_tagged_fields(body, pos)
            for tag, start, stop in tagged:
                tags[tag] = (start - offset, stop - offset)
    except (struct.error, IndexError) as exc:
        raise TruncatedError(f"{message_cls.name} v{version} is truncated") from exc
    if pos > end:
        raise TruncatedError(f"{message_cls.name} v{version} is truncated")
    return Layout(fields, tags, tags_offset, pos - offset)


@lru_cache(maxsize=4096)  # versions come from clients (capped, but bounded here too)
def _body_ops(message_cls: Any, version: int) -> tuple[Ops, bool]:
    """Every top-level field's skip operations as one merged sequence, and whether the version is flexible."""
    plan, flexible = top_level_plan(message_cls, version)
    return merge_ops([op for _, ops in plan for op in ops]), flexible


class _LastBodyOps:
    """:func:`_body_ops` of the (message class, version) asked last. Why: responses to one connection come in runs
    of one API and version, and the cached lookup is an interpreted call where this is a compare."""

    __slots__ = ("message_cls", "version", "ops", "flexible")

    def __init__(self) -> None:
        self.message_cls: object = None
        self.version = -1
        self.ops: Ops = ()
        self.flexible = False


_LAST_BODY_OPS: Final = _LastBodyOps()


SMALL_BODY_BYTES: Final = 4096
"""Bodies up to this size are copied to ``bytes`` and walked natively by :func:`top_level_tags` (the copy costs
less than generic reads); larger ones, whose bulk is records skipped in one step, are walked in place."""


def top_level_tags(
    message_cls: Any, version: int, body: bytes | memoryview, free: list[int] | None = None
) -> tuple[int, ...]:
    """The tags of the top-level tagged fields sent in ``body``: the keys of :func:`layout`'s ``tags``, found by
    one skip over the whole body instead of a span per field. Why: every Produce v10+ and Fetch v16+ response
    is looked at for KIP-951 ``node_endpoints`` (a top-level tag), and almost none carries it.

    ``free``: see :func:`skip`; filled only for a body of up to :data:`SMALL_BODY_BYTES`.

    Raises TruncatedError (a ValueError) when the body is shorter than its fields say.
    """
    last = _LAST_BODY_OPS
    if last.message_cls is not message_cls or last.version != version:
        last.ops, last.flexible = _body_ops(message_cls, version)
        last.message_cls, last.version = message_cls, version
    ops, flexible = last.ops, last.flexible
    tags: tuple[int, ...] = ()
    end = len(body)
    data: bytes | memoryview
    try:
        if end <= SMALL_BODY_BYTES:
            data = bytes(body)
            pos = _walk(ops, data, data, 0, end, free)
        else:
            data = body
            pos = _walk(ops, body, b"", 0, end, None)
        if flexible:
            if data[pos] == 0:  # no tagged field: the usual case
                pos += 1
            else:
                tagged, pos = read_tagged_fields(data, pos)
                tags = tuple(tag for tag, _, _ in tagged)
    except (struct.error, IndexError) as exc:
        raise TruncatedError(f"{message_cls.name} v{version} is truncated") from exc
    if pos > end:
        raise TruncatedError(f"{message_cls.name} v{version} is truncated")
    return tags
