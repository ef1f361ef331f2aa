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


def test_frame_reader_whole_frames_are_views_not_copies():
    chunk = encode_frame(b"abc") + encode_frame(b"de")
    frames = FrameReader().feed(chunk)
    assert all(isinstance(f, memoryview) and f.obj is chunk for f in frames)
