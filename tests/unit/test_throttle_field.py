"""throttle_time_ms located and raised in place, checked against every response kafka-python knows."""

import struct
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.apis import RESPONSES
from protocol.throttle_field import (
    INT32_MAX,
    has_throttle,
    min_body_bytes,
    needs_walk,
    raise_in_body,
    raise_throttle,
    read_throttle,
    throttle_offset,
    throttle_slot,
    throttle_table,
)
from protocol.varint import TruncatedError

ALL_VERSIONS = [(key, v) for key in sorted(RESPONSES) for v in range(RESPONSES[key].max_version + 1)]


def _scalar(field):
    t = field.type_str
    if t == "string":
        return "s-" + field.name
    if t in ("bytes", "records"):
        return b"xyz"
    if t == "uuid":
        return uuid.UUID(int=0x1234)
    if t == "bool":
        return True
    if t == "bitfield":
        return None
    if t == "float64":
        return 1.5
    return 5


def build(struct_field, data_class, version, width=2, tags=True, **overrides):
    """A message (or nested struct) with every field of ``version`` set, ``width`` elements per array.

    Generic over all schemas, so that arrays are non-empty and a walk over them is actually exercised; with
    ``tags`` the tagged fields are sent too (Produce/Fetch ``node_endpoints`` follow throttle_time_ms)."""
    vals = {}
    for f in struct_field.fields.values():
        if not f.for_version_q(version) or (f.tagged_field_q(version) and not tags):
            continue
        if f.is_struct_array():
            vals[f.name] = [build(f.array_of, f.array_of.data_class, version, width, tags) for _ in range(width)]
        elif f.is_struct():
            vals[f.name] = build(f, f.data_class, version, width, tags)
        elif f.is_array():
            vals[f.name] = [_scalar(f.array_of)] * width
        else:
            vals[f.name] = _scalar(f)
    vals.update(overrides)
    return data_class(version=version, **vals)


def _response(key, version, throttle, **kw):
    cls = RESPONSES[key]
    extra = {"throttle_time_ms": throttle} if has_throttle(key, version) else {}
    if key == 18:
        extra["error_code"] = 0  # an ApiVersions error answer is v0-shaped (tested separately)
    return cls, build(cls._struct, cls, version, **kw, **extra)


def test_every_response_kafka_python_knows_is_covered():
    assert len(ALL_VERSIONS) > 250
    assert 0 in RESPONSES and 1 in RESPONSES and 37 in RESPONSES


@pytest.mark.parametrize("tags", [False, True])
@pytest.mark.parametrize(("key", "version"), ALL_VERSIONS)
def test_offset_reads_back_and_raise_changes_only_the_throttle(key, version, tags):
    cls, msg = _response(key, version, 1234, tags=tags)
    body = bytearray(msg.encode())
    original = cls.decode(bytes(body), version=version)
    field = cls._struct.fields.get("throttle_time_ms")
    schema_has = field is not None and field.for_version_q(version) and not field.tagged_field_q(version)
    assert has_throttle(key, version) == schema_has
    offset = throttle_offset(key, version, memoryview(body))
    if not schema_has:
        assert offset is None and raise_in_body(key, version, body, 99) is None
        assert min_body_bytes(key, version) is None and not needs_walk(key, version)
        return
    assert read_throttle(body, offset) == 1234
    assert raise_throttle(body, offset, 10) == 1234  # lower: left alone
    assert raise_throttle(memoryview(body), offset, 5000) == 5000
    decoded = cls.decode(bytes(body), version=version)
    assert decoded.throttle_time_ms == 5000
    decoded.throttle_time_ms = 1234
    assert decoded == original  # nothing else changed
    assert raise_in_body(key, version, body, 7000) == 7000
    assert cls.decode(bytes(body), version=version).throttle_time_ms == 7000
    need = min_body_bytes(key, version)
    if need is not None:
        # the hot path: only the first bytes of a streamed body are needed
        assert not needs_walk(key, version)
        head = bytearray(body[:need])
        assert throttle_offset(key, version, head) == offset == need - 4
        assert raise_throttle(head, offset, 9000) == 9000 and bytes(head[:offset]) == bytes(body[:offset])
    else:
        assert needs_walk(key, version)


def test_which_versions_need_a_walk():
    table = throttle_table()
    walks = {(k, v) for k, vs in table.items() for v, off in vs.items() if off is None}
    assert walks == {(0, v) for v in range(1, 14)} | {(18, v) for v in range(1, 5)}
    offsets = {(k, v): off for k, vs in table.items() for v, off in vs.items() if off is not None}
    assert {off for off in offsets.values()} == {0, 2}
    assert [kv for kv, off in offsets.items() if off == 2] == [(47, 0)]  # OffsetDelete: after int16 error_code
    assert all(min_body_bytes(1, v) == 4 for v in range(1, 19))
    assert throttle_slot(0, 0) is None and throttle_slot(1, 0) is None  # v0 predates throttling
    assert throttle_slot(17, 1) is None and throttle_slot(36, 2) is None  # SASL responses have none
    assert throttle_slot(999, 0) is None and throttle_slot(1, 99) is None


@pytest.mark.parametrize("version", range(1, 5))
def test_api_versions_error_answer_is_v0_shaped(version):
    from kafka.protocol.metadata import ApiVersionsResponse

    body = ApiVersionsResponse(error_code=35, api_keys=[], version=0).encode()
    assert throttle_offset(18, version, body) is None
    ok = ApiVersionsResponse(error_code=0, api_keys=[], throttle_time_ms=3, version=version).encode()
    assert read_throttle(ok, throttle_offset(18, version, ok)) == 3


def test_truncated_bodies_are_errors():
    _, msg = _response(0, 9, 100)
    body = msg.encode()
    with pytest.raises(TruncatedError):
        throttle_offset(0, 9, body[:10])
    with pytest.raises(TruncatedError):
        throttle_offset(1, 12, body[:3])
    with pytest.raises(TruncatedError):
        read_throttle(b"\x00\x00\x00", 0)
    assert isinstance(TruncatedError("x"), ValueError)


def test_read_only_buffer_is_fine_when_nothing_changes():
    ro = memoryview(struct.pack(">i", 500))
    assert raise_throttle(ro, 0, 100) == 500
    with pytest.raises(TypeError):
        raise_throttle(ro, 0, 600)


@given(existing=st.integers(-(2**31), INT32_MAX), ms=st.integers(-(2**40), 2**40))
def test_raise_is_max_clamped_to_int32(existing, ms):
    buf = bytearray(b"\xaa" + struct.pack(">i", existing) + b"\xbb")
    written = raise_throttle(buf, 1, ms)
    assert written == max(existing, min(max(ms, 0), INT32_MAX))
    assert struct.unpack(">i", buf[1:5])[0] == written and buf[0] == 0xAA and buf[5] == 0xBB
