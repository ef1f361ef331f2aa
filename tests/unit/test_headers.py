from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.admin import CreateTopicsRequest
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import ProduceRequest

from protocol.headers import HeaderError, parse_request_header
from protocol.inflight import CorrelationError, InFlight, Pending, expects_response


def _frame(msg, version, corr=7, client_id="cid"):
    msg = msg
    msg.API_VERSION = version
    msg.with_header(correlation_id=corr, client_id=client_id)
    return msg.encode(header=True)


@pytest.mark.parametrize("version", [4, 8, 9, 12, 13])
def test_metadata_header_and_body_offset(version):
    frame = _frame(MetadataRequest(topics=None, allow_auto_topic_creation=True), version)
    h = parse_request_header(frame)
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id) == (3, version, 7, "cid")
    body = MetadataRequest.decode(frame[h.body_offset :], version=version)
    assert body.allow_auto_topic_creation is True


def test_null_client_id():
    frame = _frame(CreateTopicsRequest(topics=[], timeout_ms=5, validate_only=False), 7, client_id=None)
    h = parse_request_header(frame)
    assert h.client_id is None and h.body_offset is not None


def test_unknown_api_has_no_body_offset():
    frame = b"\x03\xe8\x00\x00\x00\x00\x00\x01\x00\x01x\x00"  # api 1000: no Kafka API has it
    h = parse_request_header(frame)
    assert h.api_key == 1000 and h.body_offset is None and h.client_id == "x"


@pytest.mark.parametrize("frame", [b"", b"\x00\x03\x00", b"\x00\x03\x00\x01\x00\x00\x00\x01\x00\x09ab"])
def test_truncated_headers_are_errors(frame):
    with pytest.raises(HeaderError):
        parse_request_header(frame)


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
@pytest.mark.parametrize("start", [0, 4])
def test_every_buffer_kind_and_start_reads_the_same_header(kind, start):
    """bytes are read natively; other buffers (large frames) have their head copied: the same answer either way,
    ``body_offset`` counted from ``start`` (4: a frame with its size prefix, as the session passes it)."""
    frame = _frame(MetadataRequest(topics=None, allow_auto_topic_creation=True), 12, corr=-5, client_id="é" * 3)
    h = parse_request_header(kind(b"\xff" * start + frame), start)
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id) == (3, 12, -5, "é" * 3)
    assert h.body_offset == parse_request_header(frame).body_offset


def test_a_tagged_header_section_longer_than_the_copied_head_is_read_whole():
    from protocol.headers import HEAD_COPY_BYTES
    from protocol.varint import TruncatedError

    value = b"t" * (HEAD_COPY_BYTES + 10)
    size = len(value)
    varint = bytearray()
    while size >= 0x80:
        varint.append(size & 0x7F | 0x80)
        size >>= 7
    varint.append(size)
    fixed = b"\x00\x03\x00\x0c\x00\x00\x00\x01\x00\x01x"  # Metadata v12 (header v2), client id "x"
    frame = fixed + b"\x01\x05" + bytes(varint) + value + b"\x00\x00"  # one unknown tag (5), then a body
    h = parse_request_header(memoryview(frame))
    assert h.body_offset == len(frame) - 2
    with pytest.raises(TruncatedError):
        parse_request_header(memoryview(frame[:-3]))  # the tagged value runs past the end


def test_signed_fields_and_invalid_client_id_lengths():
    h = parse_request_header(b"\xff\xfe\xff\xff\x80\x00\x00\x00\xff\xff")
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id, h.body_offset) == (-2, -1, -(2**31), None, None)
    with pytest.raises(HeaderError, match="length -2 is invalid"):
        parse_request_header(b"\x00\x03\x00\x01\x00\x00\x00\x01\xff\xfe")
    with pytest.raises(HeaderError, match="UTF-8"):
        parse_request_header(b"\x00\x03\x00\x01\x00\x00\x00\x01\x00\x01\xff")


@pytest.mark.parametrize("version", [3, 8, 9, 13])
@pytest.mark.parametrize("acks", [0, 1, -1])
def test_produce_acks(version, acks):
    req = ProduceRequest(transactional_id="tx" if version % 2 else None, acks=acks, timeout_ms=100, topic_data=[])
    frame = _frame(req, version)
    assert expects_response(frame, parse_request_header(frame)) is (acks != 0)


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
@pytest.mark.parametrize("version", [3, 9, 11])
def test_acks_and_timeout_read_the_same_from_every_buffer_kind_and_a_prefixed_frame(kind, version):
    """bytes are read natively, other buffers (large frames' views) through a copy of their head only."""
    from protocol.inflight import produce_acks, requested_wait_ms

    req = ProduceRequest(
        transactional_id="t" * 300, acks=-1, timeout_ms=12_345, topic_data=[("big", [(0, b"r" * 100_000)])]
    )
    frame = b"\x00\x00\x00\x00" + _frame(req, version)
    header = parse_request_header(frame, 4)
    assert produce_acks(kind(frame), header, 4) == -1
    assert requested_wait_ms(kind(frame), header, 4) == 12_345
    cut = kind(frame[: 4 + header.body_offset + 100])  # ends inside the transactional id
    assert requested_wait_ms(cut, header, 4) == 0
    with pytest.raises(ValueError, match="too short"):
        produce_acks(cut, header, 4)


def test_inflight_checks_correlation_order():
    f = InFlight()
    for corr in (1, 2):
        f.push(Pending(parse_request_header(_frame(MetadataRequest(topics=[]), 4, corr=corr)), 0.0))
    with pytest.raises(CorrelationError):
        f.pop(2)
    assert f.pop(1).header.correlation_id == 1
    assert len(f) == 1


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(st.one_of(st.integers(1, 40), st.just(0)), max_size=300))
def test_inflight_is_a_bounded_fifo(ops):
    """Against a deque: pushes (n > 0: that many) and pops (0) in any order answer oldest first, refuse a
    response out of order or owed to nobody, and keep the list within twice what is owed (plus the compaction
    threshold)."""
    f, model, corr = InFlight(), deque(), 0
    header_of = {}
    for op in ops:
        if op:
            for _ in range(op):
                corr += 1
                header_of[corr] = parse_request_header(_frame(MetadataRequest(topics=[]), 4, corr=corr))
                f.push(Pending(header_of[corr], 0.0))
                model.append(corr)
        elif model:
            with pytest.raises(CorrelationError):
                f.pop(model[0] + 1)
            assert f.pop(model[0]).header is header_of[model.popleft()]
        else:
            with pytest.raises(CorrelationError):
                f.pop(1)
        assert len(f) == len(model)
        assert (f.head().header.correlation_id if model else None) == (model[0] if model else None)
        assert len(f._items) <= max(2 * len(model), len(model) + 32)
        assert all(p is None for p in f._items[: f._first])
