"""FrameReceiver: the BufferedProtocol splitter must hand on every byte once, in order, whether a
frame comes out whole, assembled or streamed, however the stream is cut into reads, and must never
let a read overwrite bytes it handed out unless told they are gone."""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.frames import (
    HEAD_BYTES,
    SMALL_RESPONSE_BYTES,
    FrameError,
    FrameReceiver,
    StreamHead,
    StreamPiece,
    encode_frame,
)


class Sink:
    """Plays the connection: copies out what it is handed (as a transport write would)."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.streamed = 0
        self._open: bytearray | None = None
        self._total = 0
        self.live: list[tuple[memoryview | bytes, bytes]] = []  # views a transport might still be sending

    def take(self, event) -> None:
        view = event if isinstance(event, (memoryview, bytes)) else event.data
        self.live.append((view, bytes(view)))
        if isinstance(event, StreamHead):
            assert self._open is None
            assert len(event.data) >= HEAD_BYTES
            self._open, self._total = bytearray(event.data), event.total
            self.streamed += 1
        elif isinstance(event, StreamPiece):
            assert self._open is not None
            self._open += event.data
            assert (len(self._open) == self._total) == event.last
            if event.last:
                self.frames.append(bytes(self._open))
                self._open = None
        else:
            assert self._open is None
            self.frames.append(bytes(event))


def push(rx: FrameReceiver, sink: Sink, data: bytes, reusable: bool = True) -> None:
    """Deliver ``data`` as one socket would: possibly over several reads into the given buffers."""
    while data:
        if reusable:
            sink.live.clear()
        buf = rx.get_buffer(reusable)
        assert len(buf) > 0
        n = min(len(buf), len(data))
        buf[:n] = data[:n]
        data = data[n:]
        for event in rx.received(n):
            sink.take(event)
        for view, snapshot in sink.live:
            assert bytes(view) == snapshot, "a read overwrote bytes still held downstream"


def payloads_stream(sizes: list[int]) -> tuple[list[bytes], bytes]:
    frames = [encode_frame(bytes((i + j) % 251 for j in range(n))) for i, n in enumerate(sizes)]
    return frames, b"".join(frames)


SIZES = [0, 1, 3, 59, 60, 61, 200, 5000]


@pytest.mark.parametrize("stream", [False, True])
def test_every_two_way_split(stream):
    frames, data = payloads_stream(SIZES)
    for cut in range(len(data) + 1):
        rx = FrameReceiver(1 << 20, (lambda head: True) if stream else None, capacity=1 << 16)
        sink = Sink()
        push(rx, sink, data[:cut])
        push(rx, sink, data[cut:])
        assert sink.frames == frames, cut
        assert rx.idle


def test_small_frames_come_out_as_bytes_copies_and_large_ones_as_views():
    """A small response is copied out (its readers then run on bytes); a large one is a view, never copied."""
    sizes = [SMALL_RESPONSE_BYTES - 4, SMALL_RESPONSE_BYTES - 3, 10]
    frames, data = payloads_stream(sizes)
    rx = FrameReceiver(1 << 20, None, capacity=1 << 16)
    buf = rx.get_buffer(True)
    buf[: len(data)] = data
    out = list(rx.received(len(data)))
    assert [type(f) for f in out] == [bytes, memoryview, bytes]
    assert [bytes(f) for f in out] == frames
    assert rx.get_buffer(True).obj is buf.obj  # the receive buffer is reused, whole, for the next read


def test_byte_by_byte_streams_big_frames_only_after_the_head():
    frames, data = payloads_stream(SIZES)
    heads: list[bytes] = []
    rx = FrameReceiver(1 << 20, lambda head: heads.append(bytes(head)) or True)
    sink = Sink()
    for i in range(len(data)):
        push(rx, sink, data[i : i + 1])
    assert sink.frames == frames
    assert heads == [f[:HEAD_BYTES] for f in frames if len(f) > HEAD_BYTES]
    assert sink.streamed == len(heads)


@settings(max_examples=300)
@given(
    sizes=st.lists(st.integers(0, 3000), max_size=12),
    cuts=st.lists(st.integers(0, 40_000), max_size=30),
    stream_mask=st.integers(0, 2**12 - 1),
    reusable=st.lists(st.booleans(), min_size=1, max_size=8),
    capacity=st.sampled_from([64, 100, 4096, 1 << 16]),
)
def test_any_chunking_any_decisions(sizes, cuts, stream_mask, reusable, capacity):
    frames, data = payloads_stream(sizes)
    decisions = iter([bool(stream_mask >> i & 1) for i in range(64)])
    rx = FrameReceiver(10_000, lambda head: next(decisions), capacity=capacity)
    sink = Sink()
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    for k, (a, b) in enumerate(zip(points, points[1:], strict=False)):
        push(rx, sink, data[a:b], reusable[k % len(reusable)])
    assert sink.frames == frames
    assert rx.idle


def test_views_survive_reads_until_reusable():
    """Handed-out views are not overwritten by reads made while the caller still holds them."""
    frames, data = payloads_stream([100, 100, 100])
    rx = FrameReceiver(1 << 20, capacity=4096)
    buf = rx.get_buffer(True)
    buf[: len(frames[0])] = frames[0]
    (first,) = list(rx.received(len(frames[0])))
    for frame in frames[1:]:
        buf = rx.get_buffer(False)
        buf[: len(frame)] = frame
        list(rx.received(len(frame)))
    assert bytes(first) == frames[0]


def test_not_reusable_full_buffer_gets_a_new_one_and_keeps_the_partial_frame():
    frames, data = payloads_stream([3000, 3000])
    rx = FrameReceiver(1 << 20, capacity=4096)
    buf = rx.get_buffer(False)
    buf[:3504] = data[:3504]
    (first,) = list(rx.received(3504))  # the second frame is 500 bytes in
    sink = Sink()
    push(rx, sink, data[3504:], reusable=False)  # 592 bytes of room left: too little, a fresh buffer
    assert rx.allocations == 2
    assert bytes(first) == frames[0]
    assert sink.frames == frames[1:]


def test_steady_state_reuses_one_buffer():
    frames, data = payloads_stream([40_000] * 50)
    rx = FrameReceiver(1 << 20, capacity=1 << 16)
    sink = Sink()
    for i in range(0, len(data), 30_000):
        push(rx, sink, data[i : i + 30_000])
    assert sink.frames == frames
    assert rx.allocations <= 2  # one growth at most, then reuse


def test_assembled_frame_larger_than_the_buffer_grows_it_once():
    frames, data = payloads_stream([300_000, 300_000])
    rx = FrameReceiver(1 << 20, capacity=1 << 16)
    sink = Sink()
    for i in range(0, len(data), 50_000):
        push(rx, sink, data[i : i + 50_000])
    assert sink.frames == frames
    assert rx.allocations == 2


def test_streamed_head_is_writable_in_place():
    frames, data = payloads_stream([1000])

    rx = FrameReceiver(1 << 20, lambda head: True)
    buf = rx.get_buffer(True)
    buf[:500] = data[:500]
    (head,) = list(rx.received(500))
    assert isinstance(head, StreamHead) and head.total == len(data)
    head.data[4:8] = b"\xff\xff\xff\xff"
    assert bytes(head.data[4:8]) == b"\xff\xff\xff\xff"


def test_oversized_frame_refused_from_its_prefix_alone():
    rx = FrameReceiver(max_frame_bytes=1024)
    buf = rx.get_buffer(True)
    buf[:4] = struct.pack(">i", 1025)
    with pytest.raises(FrameError, match="exceeds the maximum of 1024"):
        list(rx.received(4))
    assert rx.allocations == 1


def test_negative_frame_size_refused():
    rx = FrameReceiver()
    buf = rx.get_buffer(True)
    buf[:4] = struct.pack(">i", -1)
    with pytest.raises(FrameError, match="negative"):
        list(rx.received(4))


def test_should_stream_sees_state_after_earlier_frames_were_handled():
    """Laziness: the predicate runs only when the caller has taken every earlier frame."""
    frames, data = payloads_stream([10, 10, 5000])
    taken: list[int] = []
    seen: list[int] = []
    rx = FrameReceiver(1 << 20, lambda head: seen.append(len(taken)) or True)
    buf = rx.get_buffer(True)
    buf[:200] = data[:200]
    for _event in rx.received(200):
        taken.append(1)
    assert seen == [2]


def test_buffer_starts_small_grows_while_reads_fill_it_and_shrinks_when_quiet():
    frames, data = payloads_stream([200_000] * 4)
    rx = FrameReceiver(1 << 20, capacity=1 << 19, initial=1 << 14)
    assert rx.allocations == 0  # nothing until the first read
    assert len(rx.get_buffer(True)) == 1 << 14
    sink = Sink()
    push(rx, sink, data)
    assert sink.frames == frames
    assert len(rx.get_buffer(True)) >= 1 << 18  # grown towards the capacity by full reads
    assert rx.shrink()
    assert len(rx.get_buffer(True)) == 1 << 14
