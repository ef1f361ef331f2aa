import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.frames import FrameError, FrameSplitter, encode_frame, frame_size


@given(
    payloads=st.lists(st.binary(max_size=300), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30),
)
def test_any_chunking_yields_the_same_frames(payloads, cuts):
    stream = b"".join(encode_frame(p) for p in payloads)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    splitter = FrameSplitter(max_frame_bytes=1000)
    got = []
    for a, b in zip(points, points[1:], strict=False):
        got.extend(splitter.feed(stream[a:b]))
    assert got == payloads
    assert splitter.buffered == 0


def test_oversized_frame_is_refused_before_its_body_arrives():
    splitter = FrameSplitter(max_frame_bytes=1024)
    with pytest.raises(FrameError, match="exceeds the maximum of 1024"):
        splitter.feed(struct.pack(">i", 1025))  # only the prefix: nothing allocated for the body


def test_negative_size_is_refused():
    with pytest.raises(FrameError, match="negative"):
        frame_size(struct.pack(">i", -5), 100)


def test_partial_frame_waits_for_more():
    splitter = FrameSplitter()
    assert splitter.feed(encode_frame(b"abcdef")[:7]) == []
    assert splitter.feed(b"def") == [b"abcdef"]
