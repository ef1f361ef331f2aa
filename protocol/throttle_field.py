"""Find ``throttle_time_ms`` in a response body and raise it in place.

Why: KIP-219 has the proxy answer with ``throttle_time_ms`` = max(the broker's value, its own) in
every response that carries the field. Produce and Fetch responses are the bulk of the traffic and
run to megabytes, so the field is written into the bytes the broker sent instead of decoding and
re-encoding the message. Where the field lies is compiled once per (api, version) from
kafka-python's JSON schemas, so no offset is written by hand:

* In almost every response it is the first body field (offset 0). Where fixed-size fields precede
  it (OffsetDelete v0: after an int16 ``error_code``) the offset is still constant. Either way only
  the first ``min_body_bytes`` bytes of the body are needed, which lets a response that streams
  through in pieces (Fetch v1+: the first 4 bytes) be edited before the rest has arrived.
* Where a variable-length field precedes it (Produce v1+: after ``responses``; ApiVersions v1+:
  after ``api_keys``) the body is walked with ``protocol.skim.layout``. Produce responses are small
  (no records), so the walk is cheap.

Offsets are relative to the start of the body, i.e. after the response header.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import lru_cache

from protocol.apis import RESPONSES, Api, response_class
from protocol.skim import FIXED_SIZES, layout, present
from protocol.varint import TruncatedError

FIELD = "throttle_time_ms"
INT32_MAX = 2**31 - 1
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


@dataclass(slots=True, frozen=True)
class ThrottleSlot:
    """Where ``throttle_time_ms`` lies in one (api, version) of a response."""

    api_key: int
    api_version: int
    offset: int | None
    """Constant byte offset in the body, or None when the preceding fields vary in length (walk needed)."""

    @property
    def needs_walk(self) -> bool:
        return self.offset is None

    @property
    def min_body_bytes(self) -> int | None:
        """Body bytes needed to read and rewrite the field (offset + 4); None when the whole body is needed."""
        return None if self.offset is None else self.offset + 4


@lru_cache(maxsize=4096)  # keyed on (api, version) from client headers: bounded
def throttle_slot(api_key: int, api_version: int) -> ThrottleSlot | None:
    """The slot of ``throttle_time_ms``; None when the API is unknown to kafka-python, the version is out
    of its range, or that version has no (untagged) ``throttle_time_ms``.

    No response schema has a tagged ``throttle_time_ms``; one would be absent unless sent, so it could not
    be written in place and is reported as None here.
    """
    cls = response_class(api_key)
    if cls is None or not 0 <= api_version <= cls.max_version:
        return None
    offset: int | None = 0
    for field in cls._struct.fields.values():
        if not present(field, api_version):
            continue
        if field.name == FIELD:
            if field.type_str != "int32":
                raise ValueError(f"{cls.name} v{api_version}: {FIELD} is {field.type_str}, not int32")
            return ThrottleSlot(api_key, api_version, offset)
        size = None if field.is_array() or field.is_struct() else FIXED_SIZES.get(field.type_str)
        offset = None if offset is None or size is None else offset + size
    return None


def has_throttle(api_key: int, api_version: int) -> bool:
    """Whether responses of this (api, version) carry a ``throttle_time_ms`` the proxy can raise."""
    return throttle_slot(api_key, api_version) is not None


def needs_walk(api_key: int, api_version: int) -> bool:
    """True when locating the field takes the whole body (variable-length fields precede it).

    False both when the offset is constant and when there is no field at all (see ``has_throttle``).
    """
    slot = throttle_slot(api_key, api_version)
    return slot is not None and slot.offset is None


def min_body_bytes(api_key: int, api_version: int) -> int | None:
    """How many leading body bytes suffice to find and rewrite the field: offset + 4 for constant-offset
    versions (4 for Fetch v1+ and nearly every other API), None when there is no field or a walk is needed.

    ApiVersions is the one walk case that looks at the error code first; it needs the whole body anyway.
    """
    slot = throttle_slot(api_key, api_version)
    return None if slot is None else slot.min_body_bytes


def throttle_offset(api_key: int, api_version: int, body: bytes | bytearray | memoryview) -> int | None:
    """Byte offset of the int32 ``throttle_time_ms`` in ``body`` (the response without its header), or None
    when this response has none.

    For constant-offset versions ``body`` may be just the first ``min_body_bytes`` bytes. An ApiVersions
    response with a non-zero error code is v0-shaped whatever the request version (Kafka answers an
    unsupported version that way, and kafka-python decodes any error answer as v0), so it has none.
    Raises TruncatedError (a ValueError) when the body is too short for its fields.
    """
    slot = throttle_slot(api_key, api_version)
    if slot is None:
        return None
    if slot.offset is not None:
        if len(body) < slot.offset + 4:
            raise TruncatedError(f"response body of {len(body)} bytes ends before {FIELD}")
        return slot.offset
    if api_key == Api.API_VERSIONS:
        if len(body) < 2:
            raise TruncatedError("ApiVersions response body ends before error_code")
        if _I16.unpack_from(body, 0)[0] != 0:
            return None
    # A bytearray too (mutations' merged response): skim.layout reads any buffer, its annotation says less.
    return layout(response_class(api_key), api_version, body).fields[FIELD][0]  # type: ignore[arg-type]


def read_throttle(body: bytes | bytearray | memoryview, offset: int) -> int:
    """The int32 at ``offset``; TruncatedError when the body ends before it."""
    if offset < 0 or offset + 4 > len(body):
        raise TruncatedError(f"{FIELD} at {offset} lies past the end of a {len(body)}-byte body")
    value: int = _I32.unpack_from(body, offset)[0]
    return value


def raise_throttle(buf: bytearray | memoryview, offset: int, ms: int) -> int:
    """Write max(existing, ms) at ``offset`` in place and return the value now there.

    ``ms`` is clamped to [0, INT32_MAX] (a throttle cannot be negative and must fit the field). The buffer is
    not touched when the existing value is already at least ``ms``, so a read-only buffer is fine then.
    """
    existing = read_throttle(buf, offset)
    ms = min(max(int(ms), 0), INT32_MAX)
    if ms <= existing:
        return existing
    _I32.pack_into(buf, offset, ms)
    return ms


def raise_in_body(api_key: int, api_version: int, buf: bytearray | memoryview, ms: int) -> int | None:
    """Locate and raise in one call: the value now in the response, or None when it has no such field."""
    offset = throttle_offset(api_key, api_version, buf)
    if offset is None:
        return None
    return raise_throttle(buf, offset, ms)


def throttle_table() -> dict[int, dict[int, int | None]]:
    """{api_key: {version: constant offset or None (walk)}} for every response kafka-python knows; versions
    without the field are left out. For docs and tests: shows at a glance which versions need a walk."""
    table: dict[int, dict[int, int | None]] = {}
    for key in sorted(RESPONSES):
        for version in range(RESPONSES[key].max_version + 1):
            slot = throttle_slot(key, version)
            if slot is not None:
                table.setdefault(key, {})[version] = slot.offset
    return table
