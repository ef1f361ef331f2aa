"""How a connection reads its broker: as chunks (the loop's bytes, each usually one whole small response) until
the client's first Fetch, then into its receive buffer. A real ``proxy.wire.connection.Connection`` with the real
policy and stand-in transports (``tests.harness.connection_rig``); the integration suites run both paths against a
real cluster (producers stay on chunks, consumers switch)."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer import FetchResponse

from protocol.headers import encode_response_header
from tests.harness.connection_rig import ConnectionRig, produce_request, produce_response
from tests.harness.request_bodies import fetch_request


def _fetch_frame(corr: int) -> bytes:
    req = fetch_request(version=12)
    req.with_header(correlation_id=corr, client_id="app")
    return bytes(req.encode(header=True, framed=True))


def _pipelined(corrs: list[int], chunks: list[bytes]) -> tuple[ConnectionRig, bytes]:
    """Send the Produce requests ``corrs``, then feed ``chunks`` to the broker side: what reached the client."""

    async def run() -> ConnectionRig:
        h = ConnectionRig({})
        for corr in corrs:
            h.client_side.data_received(produce_request(corr))
        for chunk in chunks:
            h.upstream.protocol.data_received(chunk)
        return h

    h = asyncio.run(run())
    return h, b"".join(h.client.written)


def test_a_producer_reads_its_broker_as_chunks():
    h, out = _pipelined([1, 2], [produce_response(1), produce_response(2)])
    assert not h.conn.buffered_reads and h.upstream.protocol is h.conn.upstream_chunks
    assert out == produce_response(1) + produce_response(2)
    assert h.conn._responses.allocations == 0  # every response was a whole chunk: the buffer was never needed


def test_a_response_split_across_reads_waits_for_its_end():
    answer = produce_response(1)
    h, out = _pipelined([1], [answer[:2], answer[2:9]])
    assert out == b""
    h.upstream.protocol.data_received(answer[9:])
    assert b"".join(h.client.written) == answer


@settings(max_examples=60, deadline=None)
@given(
    count=st.integers(1, 6),
    cuts=st.lists(st.integers(0, 2000), max_size=8),
    big=st.booleans(),
)
def test_any_split_of_the_stream_reaches_the_client_whole_and_in_order(count, cuts, big):
    """Responses in one read, split across reads, or larger than a read's room (an error message of 40 KB),
    come out byte for byte, in order, each once."""
    corrs = list(range(1, count + 1))
    answers = [produce_response(c, "e" * 40_000 if big and c == 1 else None) for c in corrs]
    stream = b"".join(answers)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    chunks = [stream[a:b] for a, b in zip(points, points[1:], strict=False) if b > a]
    _, out = _pipelined(corrs, chunks)
    assert out == stream


def test_the_first_fetch_switches_to_buffered_reads_before_it_is_sent():
    async def run() -> tuple[ConnectionRig, bool]:
        h = ConnectionRig({})
        h.round_trip(1)  # a Produce: chunks
        before = h.conn.buffered_reads
        h.client_side.data_received(_fetch_frame(2))
        assert h.conn.buffered_reads and h.upstream.protocol is h.conn.upstream
        assert h.upstream.written  # the Fetch went out (after the switch: it happens while it is read)
        # Its answer is read the buffered way: into the receive buffer, and on to the client.
        body = bytes(FetchResponse(throttle_time_ms=0, error_code=0, session_id=0, responses=[], version=12).encode())
        answer = encode_response_header(2, True) + body
        framed = len(answer).to_bytes(4, "big") + answer
        room = h.upstream_side.get_buffer(len(framed))
        room[: len(framed)] = framed
        h.upstream_side.buffer_updated(len(framed))
        assert h.client.written[-1] == framed
        return h, before

    h, before = asyncio.run(run())
    assert before is False
    assert h.conn._responses.allocations == 1
