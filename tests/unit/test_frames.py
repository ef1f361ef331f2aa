import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.frames import FrameError, FrameReader, encode_frame, frame_size


def test_oversized_frame_is_refused_before_its_body_arrives():
    reader = FrameReader(max_frame_bytes=1024)
    with pytest.raises(FrameError, match="exceeds the maximum of 1024"):
        reader.feed(struct.pack(">i", 1025))  # only the prefix: nothing allocated for the body


def test_negative_size_is_refused():
    with pytest.raises(FrameError, match="negative"):
        frame_size(struct.pack(">i", -5), 100)


def test_partial_frame_waits_for_more():
    reader = FrameReader()
    assert reader.feed(encode_frame(b"abcdef")[:7]) == []
    assert [bytes(f) for f in reader.feed(b"def")] == [encode_frame(b"abcdef")]
    assert reader.idle


@given(
    payloads=st.lists(st.binary(max_size=300), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30),
)
def test_frame_reader_any_chunking_yields_prefixed_frames(payloads, cuts):
    stream = b"".join(encode_frame(p) for p in payloads)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    reader = FrameReader(max_frame_bytes=1000)
    got = []
    for a, b in zip(points, points[1:], strict=False):
        got.extend(bytes(f) for f in reader.feed(stream[a:b]))
    assert got == [encode_frame(p) for p in payloads]
    assert reader.idle


def test_frame_reader_refuses_oversize_from_a_split_prefix():
    reader = FrameReader(max_frame_bytes=10)
    assert reader.feed(b"\x00\x00") == []
    with pytest.raises(FrameError, match="exceeds"):
        reader.feed(b"\x00\x0b")


def test_frame_reader_hands_out_a_whole_chunk_as_is_small_frames_as_bytes_and_large_ones_as_views():
    from protocol.frames import SMALL_FRAME_BYTES

    alone = encode_frame(b"x" * (SMALL_FRAME_BYTES * 2))
    (frame,) = FrameReader(max_frame_bytes=1 << 20).feed(alone)
    assert frame is alone  # the chunk is the frame: no copy, whatever its size
    large = encode_frame(b"L" * SMALL_FRAME_BYTES)  # one past the small limit, prefix included
    chunk = encode_frame(b"abc") + large + encode_frame(b"de")
    frames = FrameReader(max_frame_bytes=1 << 20).feed(chunk)
    assert [type(f) for f in frames] == [bytes, memoryview, bytes]
    assert frames[1].obj is chunk  # a view of the chunk, not a copy
    assert [bytes(f) for f in frames] == [encode_frame(b"abc"), large, encode_frame(b"de")]
    reader = FrameReader()
    assert reader.feed(chunk[:3]) == []
    assert type(reader.feed(chunk[3:7])[0]) is bytes  # assembled from two chunks, small: bytes too


def test_partial_frame_memory_grows_with_what_arrives_not_with_what_was_announced():
    reader = FrameReader(max_frame_bytes=100 << 20)
    assert reader.feed(struct.pack(">i", 90 << 20) + b"x" * 10) == []
    assert reader.held_bytes == 14  # a 90 MiB announcement costs what was sent, nothing more
    reader.feed(b"y" * 1000)
    assert reader.held_bytes == 1014


def test_large_frames_reserve_from_the_pool_and_wait_in_order_small_ones_never_wait():
    from protocol.frames import RequestBytesPool

    pool = RequestBytesPool(1000)
    big = [FrameReader(pool=pool, pool_min_bytes=100) for _ in range(3)]
    payload = b"z" * 596  # frames of 600 bytes: one fits the pool at a time
    assert big[0].feed(encode_frame(payload)[:50]) == [] and pool.used == 600
    granted: list[int] = []
    for i in (1, 2):
        assert big[i].feed(encode_frame(payload)[:50]) == [] and big[i].waiting == 600
        pool.wait(600, lambda i=i: granted.append(i))
    small = FrameReader(pool=pool, pool_min_bytes=100)
    assert [bytes(f) for f in small.feed(encode_frame(b"s" * 50)[:20])] == []
    assert [bytes(f) for f in small.feed(encode_frame(b"s" * 50)[20:])] == [encode_frame(b"s" * 50)]
    (done,) = big[0].feed(encode_frame(payload)[50:])
    assert bytes(done) == encode_frame(payload) and pool.used == 600 and granted == []
    big[0].release_forwarded()
    assert granted == [1] and pool.used == 600  # first come, first served; the second still waits
    big[1].granted()
    (done,) = big[1].feed(encode_frame(payload)[50:] + encode_frame(b"t"))[:1]
    assert bytes(done) == encode_frame(payload)
    big[1].close()  # gone: its reservation returns, the next waiter is served
    assert granted == [1, 2] and pool.used == 600


def test_pool_cancel_and_release_keep_the_count_exact():
    from protocol.frames import RequestBytesPool

    pool = RequestBytesPool(100)
    assert pool.try_reserve(80)
    w = pool.wait(50, lambda: None)
    assert not pool.try_reserve(10)  # someone is queued: no overtaking
    pool.cancel(w)
    assert pool.try_reserve(10) and pool.used == 90
    pool.release(90)
    assert pool.used == 0 and pool.try_reserve(500)  # an empty pool admits one frame larger than itself


def test_requested_wait_is_read_from_the_requests_that_ask_for_one():
    from protocol.headers import parse_request_header
    from protocol.inflight import requested_wait_ms
    from tests.harness.request_bodies import fetch_request

    for version in (4, 12, 15, 17):
        req = fetch_request(max_wait_ms=4321, version=version)
        req.with_header(correlation_id=7, client_id="w")
        frame = req.encode(header=True, framed=True)
        header = parse_request_header(memoryview(frame)[4:])
        assert requested_wait_ms(frame, header, 4) == 4321, version
    from protocol.headers import RequestHeader

    assert requested_wait_ms(b"\x00" * 30, RequestHeader(3, 12, 1, "w", 5), 4) == 0  # Metadata: no wait
    assert requested_wait_ms(b"\x00" * 6, RequestHeader(1, 12, 1, "w", 5), 4) == 0  # truncated Fetch: 0
